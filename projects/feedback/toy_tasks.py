"""The slides' toy tasks (tasks.py): the Feedback Transformer against the GPT of the same width and depth, both
attending over the same window of past positions, each trained for the same CPU time, over several seeds.

The slides ("Score - accuracy on toy tasks"), Transformer / Feedback Transformer: copy 59.1 / 76.2 (char) and 6.2 /
23.6 (sequence), reverse 50.2 / 74.8 and 5.9 / 29.2, counting 99.6 / 99.7 (length 50) and 82.4 / 95.3 (length 1K),
random walk 68 / 100, algorithmic 33.7 / 99.1 (3 variables) and 37.5 / 92.6 (5 variables). The authors' baselines
attend over a limited span (e.g. 100 tokens for the algorithmic task, programs of 100 statements): what lies
farther back reaches a Transformer's prediction only through its layers' limited reach, while the Feedback
Transformer's memory vector of step t - 1 can carry it. `--window` sets that span for both models here.

    python projects/feedback/toy_tasks.py --task algorithmic --seconds 180 --seeds 0 1 2 --json out.json
    python projects/feedback/toy_tasks.py --task random_walk --n 64 --grid 6 --window 8 --seconds 120

Prints per model and seed the training steps reached in its time and the accuracy of fresh sequences: over every
scored position ("char"), over whole sequences (all scored positions right), and by position (--plot draws it,
the mean over seeds).
"""
import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.nn.functional as F

from languini.flags import Parser
from projects.feedback import configs, tasks
from projects.feedback.gpt_baseline import GPT, GPTConfig
from projects.feedback.model import Model

# each task's size flag --n: symbols to copy or reverse, the most As to count, tokens of a walk, statements
DEFAULT_N = {"copy": 16, "reverse": 16, "counting": 50, "random_walk": 32, "algorithmic": 30}
SLIDES = {  # Transformer, Feedback Transformer: accuracy in %, as the slides give it
    "copy": "59.1 / 76.2 (char), 6.2 / 23.6 (sequence)", "reverse": "50.2 / 74.8 (char), 5.9 / 29.2 (sequence)",
    "counting": "99.6 / 99.7 (length 50), 82.4 / 95.3 (length 1K)", "random_walk": "68 / 100",
    "algorithmic": "33.7 / 99.1 (3 variables), 37.5 / 92.6 (5 variables)",
}


def batch_of(args, size: int, generator: torch.Generator):
    """tokens, targets, mask, vocabulary of `size` fresh sequences of the task."""
    if args.task in ("copy", "reverse"):
        return getattr(tasks, args.task)(size, args.n, args.symbols, generator)
    if args.task == "counting":
        return tasks.counting(size, args.n, generator)
    if args.task == "random_walk":
        return tasks.random_walk(size, args.n, args.grid, generator)
    return tasks.algorithmic(size, args.n, args.variables, generator)


def longest(args) -> int:
    """The longest sequence of the task (the GPT's position table): an `if` statement has at most 9 words."""
    return {"copy": 2 * args.n + 1, "reverse": 2 * args.n + 1, "counting": 2 * args.n + 2, "random_walk": args.n,
            "algorithmic": 9 * args.n}[args.task]


def build(name: str, args, vocab: int):
    window = args.window or longest(args)
    if name == "feedback":
        return Model(configs.get("cpu", vocab_size=vocab, seq_len=longest(args), mem_len=window, d_model=args.d_model,
                                 n_layers=args.n_layers, n_heads=args.n_heads, d_head=args.d_model // args.n_heads,
                                 attention_impl="naive"))
    return GPT(GPTConfig(vocab_size=vocab, seq_len=longest(args), d_model=args.d_model, n_layers=args.n_layers,
                         n_heads=args.n_heads, d_head=args.d_model // args.n_heads, attention="sdpa",
                         window=args.window))


def train(model, args, seed: int) -> int:
    """Adam on fresh sequences for args.seconds of the process's CPU time (a linear warm-up over 100 steps); the steps
    taken. CPU time, not wall time: a model is not cut short because the machine was busy."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    steps, start = 0, time.process_time()
    while time.process_time() - start < args.seconds:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (steps + 1) / 100)
        tokens, targets, mask, _ = batch_of(args, args.batch_size, generator)
        logits = model(tokens, None)[0]
        loss = F.cross_entropy(logits[mask], targets[mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


@torch.no_grad()
def evaluate(model, args, seed: int) -> dict:
    """Accuracy over scored positions, over whole sequences and by position, on args.eval_sequences fresh ones."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    hits = scored = right_sequences = sequences = with_answers = 0
    by_position = torch.zeros(longest(args))
    counted = torch.zeros(longest(args))
    while sequences < args.eval_sequences:
        tokens, targets, mask, _ = batch_of(args, min(250, args.eval_sequences - sequences), generator)
        right = (model(tokens, None)[0].argmax(-1) == targets) & mask
        hits += int(right.sum())
        scored += int(mask.sum())
        answered = mask.any(1)  # an algorithmic program may print nothing: not a sequence to score
        right_sequences += int(((right == mask).all(1) & answered).sum())
        with_answers += int(answered.sum())
        sequences += tokens.shape[0]
        T = tokens.shape[1]
        by_position[:T] += right.float().sum(0)
        counted[:T] += mask.float().sum(0)
    # by position 1..longest: None where no sequence scored that position
    return {"accuracy": hits / scored, "sequence_accuracy": right_sequences / with_answers,
            "by_position": [float(h / c) if c else None for h, c in zip(by_position, counted)]}


def plot(results: dict, args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for name, runs in results.items():
        curves = torch.tensor([[math.nan if a is None else a for a in r["by_position"]] for r in runs])
        mean = curves.nanmean(0)
        shown = ~mean.isnan()
        ax.plot((torch.nonzero(shown).squeeze(1) + 1).tolist(), mean[shown].tolist(),
                label=f"{name} (mean of {len(runs)} seeds)")
    if args.window:
        ax.axvline(args.window, color="grey", linestyle=":", label=f"attention window {args.window}")
    ax.set(xlabel="position in the sequence (token)", ylabel="accuracy at scored positions", ylim=(0, 1.02),
           title=f"{args.task}: accuracy by position after {args.seconds:.0f} CPU s of training each")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def summary(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{spread}"


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=tuple(DEFAULT_N), default="random_walk")
    parser.add_argument("--n", type=int, default=None, help=f"the task's size (default {DEFAULT_N})")
    parser.add_argument("--grid", type=int, default=4, help="random walk: a grid x grid grid")
    parser.add_argument("--symbols", type=int, default=8, help="copy, reverse: alphabet size")
    parser.add_argument("--variables", type=int, default=3, choices=(3, 5), help="algorithmic: variables")
    parser.add_argument("--window", type=int, default=None,
                        help="positions each model attends over (the Feedback Transformer's tau, the GPT's causal "
                             "window); default: the whole sequence")
    parser.add_argument("--seconds", type=float, default=120,
                        help="training CPU time (process time) per model and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--n_layers", type=int, default=2)
    parser.add_argument("--n_heads", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval_sequences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the budget is one core's time)")
    parser.add_argument("--json", default=None, help="write the results (every seed, by position) to this file")
    parser.add_argument("--plot", default=None, help="draw the accuracy by position into this PNG")
    args = parser.parse_args(argv)
    args.n = args.n or DEFAULT_N[args.task]
    if args.window is not None and args.window < 1:
        parser.error("--window must be at least 1")
    torch.set_num_threads(args.threads)
    vocab = len(batch_of(args, 1, torch.Generator().manual_seed(0))[3])
    print(f"{args.task}, n = {args.n}; window {args.window or 'whole sequence'}; d_model {args.d_model}, "
          f"{args.n_layers} layers, {args.n_heads} heads; batch {args.batch_size}, lr {args.lr}; {args.seconds:.0f} CPU s "
          f"of training per model and seed on {args.threads} thread(s); seeds {args.seeds}")
    print(f"the slides, Transformer / Feedback: {SLIDES[args.task]}")
    results = {"feedback": [], "gpt": []}
    for seed in args.seeds:
        for name in results:
            torch.manual_seed(seed)
            model = build(name, args, vocab)
            steps = train(model, args, seed)
            result = {"seed": seed, "steps": steps, "parameters": sum(p.numel() for p in model.parameters()),
                      **evaluate(model, args, 10_000 + seed)}
            results[name].append(result)
            print(f"{name:<9} seed {seed}: {steps:>6} steps, {result['parameters']:,} parameters; accuracy "
                  f"{result['accuracy']:.3f}, whole sequences {result['sequence_accuracy']:.3f}", flush=True)
    for name, runs in results.items():
        print(f"{name:<9} accuracy {summary(runs, 'accuracy')}, whole sequences {summary(runs, 'sequence_accuracy')}"
              f" (mean ± standard deviation over {len(runs)} seeds)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")
    if args.plot:
        plot(results, args, args.plot)
    return results


if __name__ == "__main__":
    main()
