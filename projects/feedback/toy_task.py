"""The random-walk task of the slides' toy table ("random walk in a small grid where the goal is to calculate the
current position": Transformer 68%, Feedback Transformer 100%): the Feedback Transformer against the GPT of the same
width and depth, each trained for the same CPU time.

A walk starts on a random cell of a G x G grid, given as the first token; every later token is a move (north, south,
east, west), and a move into a wall leaves the walker where it is. At every token the model predicts the walker's
cell. With walls the position is not a sum of the moves: it depends on the order of every move so far, which a
recurrence carries step by step (the feedback memory of step t-1 holds the cell) and a fixed stack of attention
layers must reconstruct. Every walk is one sequence, read from an empty memory (the GPT: its whole context).

    python projects/feedback/toy_task.py --seconds 120      # each model trains for 120 s of this CPU

Prints, per model, the training steps it reached in its time and the accuracy of 2,000 fresh walks over all
positions and at chosen positions (--plot draws it for every position).
"""
import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.nn.functional as F

from languini.flags import Parser
from projects.feedback import configs
from projects.feedback.gpt_baseline import GPT, GPTConfig
from projects.feedback.model import Model

MOVES = ((-1, 0), (1, 0), (0, 1), (0, -1))  # north, south, east, west as (row, column) steps; tokens 0..3


def walks(batch: int, length: int, grid: int, generator: torch.Generator):
    """(tokens, cells), both (batch, length): token 0 is the start cell (len(MOVES) + cell id), then moves; cells[t]
    is the walker's cell (len(MOVES) + row * grid + column) after token t."""
    moves = torch.tensor(MOVES)
    start = torch.randint(grid * grid, (batch,), generator=generator)
    steps = torch.randint(len(MOVES), (batch, length - 1), generator=generator)
    row, col = start // grid, start % grid
    cells = [start]
    for t in range(length - 1):
        row = (row + moves[steps[:, t], 0]).clamp(0, grid - 1)
        col = (col + moves[steps[:, t], 1]).clamp(0, grid - 1)
        cells.append(row * grid + col)
    tokens = torch.cat([len(MOVES) + start[:, None], steps], dim=1)
    return tokens, len(MOVES) + torch.stack(cells, dim=1)


def build(name: str, args):
    vocab = len(MOVES) + args.grid * args.grid
    if name == "feedback":
        return Model(configs.get("cpu", vocab_size=vocab, seq_len=args.length, mem_len=args.length,
                                 d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                                 d_head=args.d_model // args.n_heads, attention_impl="naive"))
    return GPT(GPTConfig(vocab_size=vocab, seq_len=args.length, d_model=args.d_model, n_layers=args.n_layers,
                         n_heads=args.n_heads, d_head=args.d_model // args.n_heads, attention="sdpa"))


def logits_of(model, tokens):
    return model(tokens, None)[0]


def train(model, args, seed: int) -> int:
    """Adam for args.seconds of wall time on fresh walks; returns the number of steps taken."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        for group in optimizer.param_groups:  # a linear warm-up over the first 100 steps
            group["lr"] = args.lr * min(1.0, (steps + 1) / 100)
        tokens, cells = walks(args.batch_size, args.length, args.grid, generator)
        loss = F.cross_entropy(logits_of(model, tokens).flatten(0, 1), cells.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


@torch.no_grad()
def accuracy_by_step(model, args, seed: int) -> torch.Tensor:
    """(length,) accuracy at each position of args.eval_walks fresh walks."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    hits = torch.zeros(args.length)
    for _ in range(0, args.eval_walks, 500):
        tokens, cells = walks(500, args.length, args.grid, generator)
        hits += (logits_of(model, tokens).argmax(-1) == cells).float().sum(0)
    return hits / (args.eval_walks // 500 * 500)


def plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve.tolist(), label=name)
    ax.set(xlabel="position in the walk (token)", ylabel="accuracy of the predicted cell", ylim=(0, 1.02),
           title="random walk: accuracy by position")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120, help="training wall time per model")
    parser.add_argument("--grid", type=int, default=4, help="the grid is grid x grid cells")
    parser.add_argument("--length", type=int, default=32, help="tokens per walk: the start and length - 1 moves")
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--n_layers", type=int, default=2)
    parser.add_argument("--n_heads", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval_walks", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady timing on a shared CPU)")
    parser.add_argument("--plot", default=None, help="draw the accuracy by position into this PNG")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"random walk on a {args.grid}x{args.grid} grid, {args.length} tokens per walk; d_model {args.d_model}, "
          f"{args.n_layers} layers, {args.n_heads} heads; batch {args.batch_size}, lr {args.lr}; {args.seconds:.0f} s "
          f"of training each on {args.threads} thread(s); seed {args.seed}")
    results, curves = {}, {}
    marks = sorted({1, 2, 4, *range(8, args.length + 1, 8), args.length} & set(range(1, args.length + 1)))
    print(f"{'model':<9} {'steps':>6} {'all':>6}   " + " ".join(f"{'@' + str(m):>5}" for m in marks))
    for name in ("feedback", "gpt"):
        torch.manual_seed(args.seed)
        model = build(name, args)
        steps = train(model, args, args.seed)
        curves[name] = curve = accuracy_by_step(model, args, args.seed + 1)
        results[name] = {"steps": steps, "accuracy": curve.mean().item(), "last_step_accuracy": curve[-1].item()}
        print(f"{name:<9} {steps:>6} {curve.mean():6.3f}   " + " ".join(f"{curve[m - 1]:5.3f}" for m in marks),
              flush=True)
    print(f"(accuracy over all positions, then at position @n; chance {1 / args.grid ** 2:.3f})")
    if args.plot:
        plot(curves, args.plot)
    return results


if __name__ == "__main__":
    main()
