"""Train memory cores on the NTM tasks for a fixed CPU time each and compare their learning curves (the thesis's
Figure 3.4: SAM against DAM and an LSTM on copy, associative recall and priority sort).

Every model trains for the same --cpu_seconds of this process's CPU time (time.process_time, so a busy machine
does not shorten anyone's budget), one thread, minibatches of 8 (A.1), RMSProp (A.1) with gradients clipped;
episodes come from tasks.py, their sizes from the thesis's ranges (copy 1-20, recall 3-6 pairs, sort 20 -> 16), or
from the exponential curriculum of 3.4.3 (--curriculum true). Every --log_every minibatches it records the
training cost per sequence (bits, the mean over the last minibatches); at the end it evaluates on --eval_batches
fresh minibatches over the task's whole range: cost and bit errors per sequence. Prints the curves and the final
table, writes --out (JSON) and --plot.

    python projects/sam/train_tasks.py --task copy --models sam dam lstm --cpu_seconds 150
    python projects/sam/train_tasks.py --task recall --models sam --cpu_seconds 300 --curriculum true
"""
import argparse
import json
import sys
import time
from dataclasses import replace

import torch

from languini.flags import Parser
from projects.sam import tasks
from projects.sam.configs import MemoryConfig
from projects.sam.core import KINDS, MemoryCore

OPTIMIZERS = ("rmsprop", "adam")


def train(task: str, kind: str, cpu_seconds: float, seed: int = 0, batch: int = 8, lr: float = 1e-3,
          optimizer: str = "rmsprop", curriculum: bool = False, threshold: float | None = None, log_every: int = 25,
          eval_batches: int = 20, bits: int = 8, clip: float = 10.0, max_batches: int | None = None,
          wall_seconds: float | None = None, start_level: int | None = None, say=None, eval_every: float = 0.0,
          curve_batches: int = 10, **memory) -> dict:
    """Train one model for cpu_seconds of CPU time (or max_batches, or wall_seconds of wall time, whichever ends
    first); returns its curve ([cpu seconds, sequences, level bound, cost per sequence]) and the final
    evaluation. start_level: the curriculum's first bound h, levels drawn from [1, h] (default the task's
    smallest size, e.g. 3 pairs for recall). say(text): where the curve's points go as they come.
    eval_every > 0: every eval_every CPU seconds, also evaluate on the same curve_batches minibatches over the
    task's whole range (the evaluation's CPU time is not charged to the budget): `eval_curve`, [cpu seconds,
    sequences, cost per sequence, bit errors per sequence], comparable across models where the training cost is
    not (the curriculum's level differs between them)."""
    torch.manual_seed(seed)
    task_spec = tasks.spec(task, bits)
    cfg = replace(MemoryConfig(), kind=kind, **memory)
    model = MemoryCore(cfg, task_spec.inputs, task_spec.outputs)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    optimizer = (torch.optim.RMSprop(model.parameters(), lr=lr, momentum=0.9, eps=1e-6) if optimizer == "rmsprop"
                 else torch.optim.Adam(model.parameters(), lr=lr))
    generator = torch.Generator().manual_seed(seed + 1)
    low, high = task_spec.levels
    if start_level is not None and not curriculum:
        raise ValueError("start_level is the curriculum's first bound; without it levels span the task's range")
    first = low if start_level is None else start_level
    if not 1 <= first <= high:
        raise ValueError(f"start_level must be in [1, {high}], not {start_level}")
    # the curriculum's threshold: a cost per sequence of about a quarter of a bit per scored vector of the first
    # bound, unless given
    schedule = tasks.Curriculum(low, high, threshold or 0.25 * bits * (first if task == "copy" else 1),
                                enabled=curriculum, start=first)
    curve, eval_curve, recent, sequences, batches = [], [], [], 0, 0
    start, wall_start = time.process_time(), time.perf_counter()

    def point():
        nonlocal start
        began = time.process_time()
        scores = evaluate(model, task, batch, curve_batches, seed + 3, bits)
        eval_curve.append([round(began - start, 2), sequences, scores["eval_cost"], scores["eval_errors"]])
        start += time.process_time() - began  # not charged to the training budget

    next_point = 0.0
    while (time.process_time() - start < cpu_seconds and (max_batches is None or batches < max_batches)
           and (wall_seconds is None or time.perf_counter() - wall_start < wall_seconds)):
        if eval_every > 0 and time.process_time() - start >= next_point:
            point()
            next_point += eval_every
        x, y, mask = tasks.episode(task, batch, schedule.level(generator), generator, bits)
        logits, _ = model(x)
        cost = tasks.cost_per_sequence(logits, y, mask)
        optimizer.zero_grad(set_to_none=True)
        cost.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        batches, sequences = batches + 1, sequences + batch
        cost = float(cost.detach())
        recent = (recent + [cost])[-log_every:]
        schedule.record(cost)
        if batches % log_every == 0:
            curve.append([round(time.process_time() - start, 2), sequences, schedule.h, sum(recent) / len(recent)])
            if say:
                say(f"  {curve[-1][0]:7.1f} cpu s  {sequences:7d} sequences  level <= {schedule.h:3d}  "
                    f"cost/sequence {curve[-1][3]:8.3f} bits")
    if eval_every > 0:
        point()
    return {"task": task, "kind": kind, "optimizer": type(optimizer).__name__, "lr": lr, "curriculum": curriculum,
            "start_level": first if curriculum else None, "initial_strength": cfg.initial_strength,
            "cpu_seconds": round(time.process_time() - start, 1), "sequences": sequences,
            "level": schedule.h, "curve": curve, "eval_curve": eval_curve,
            **evaluate(model, task, batch, eval_batches, seed + 2, bits)}


@torch.no_grad()
def evaluate(model, task: str, batch: int, batches: int, seed: int, bits: int) -> dict:
    """Cost and bit errors per sequence on fresh episodes over the task's whole range of sizes."""
    generator = torch.Generator().manual_seed(seed)
    low, high = tasks.spec(task, bits).levels
    costs, errors = [], []
    for _ in range(batches):
        level = int(torch.randint(low, high + 1, (1,), generator=generator))
        x, y, mask = tasks.episode(task, batch, level, generator, bits)
        logits, _ = model(x)
        costs.append(float(tasks.cost_per_sequence(logits, y, mask)))
        errors.append(tasks.errors_per_sequence(logits, y, mask))
    return {"eval_cost": sum(costs) / batches, "eval_errors": sum(errors) / batches}


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=tasks.TASKS, default="copy")
    parser.add_argument("--models", nargs="+", choices=KINDS, default=["sam", "dam", "lstm"])
    parser.add_argument("--cpu_seconds", type=float, default=120.0, help="CPU time of each model")
    parser.add_argument("--words", type=int, default=128, help="memory words N of every model")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="rmsprop")
    parser.add_argument("--wall_seconds", type=float, default=None, help="also stop each model after this wall time")
    parser.add_argument("--curriculum", type=lambda v: v.lower() in ("1", "true", "yes"), default=False)
    parser.add_argument("--start_level", type=int, default=None,
                        help="the curriculum's first bound h, levels drawn from [1, h] (default the task's smallest "
                             "size: copy 1, recall 3 pairs, sort 20); evaluation is over the task's whole range")
    parser.add_argument("--initial_strength", type=float, default=None,
                        help="every head's read strength beta at initialisation (default: about 1.7, the "
                             "interface's random bias)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log_every", type=int, default=25, help="minibatches between points of the curve")
    parser.add_argument("--eval_batches", type=int, default=20)
    parser.add_argument("--out", default=None, help="JSON of the curves (default sam_<task>.json)")
    parser.add_argument("--plot", default=None, help="plot of the curves (default sam_<task>.png)")
    parser.add_argument("--from_json", nargs="+", help="print and plot the results of earlier runs, train nothing")
    args = parser.parse_args(argv)
    if args.from_json:
        results = [r for path in args.from_json for r in json.load(open(path))["results"] if r["task"] == args.task]
        report(results, args.task)
        plot(results, args.plot or f"sam_{args.task}.png", args.task)
        return 0
    torch.set_num_threads(1)
    results = []
    for kind in args.models:
        print(f"training {kind} on {args.task} for {args.cpu_seconds:.0f} CPU seconds...", flush=True)
        result = train(args.task, kind, args.cpu_seconds, seed=args.seed, lr=args.lr, optimizer=args.optimizer,
                       curriculum=args.curriculum, log_every=args.log_every, eval_batches=args.eval_batches,
                       wall_seconds=args.wall_seconds, start_level=args.start_level,
                       say=lambda text: print(text, flush=True), words=args.words,
                       initial_strength=args.initial_strength)
        results.append(result)
    report(results, args.task)
    out = args.out or f"sam_{args.task}.json"
    with open(out, "w") as file:
        json.dump({"args": vars(args), "results": results}, file, indent=1)
    plot(results, args.plot or f"sam_{args.task}.png", args.task)
    print(f"wrote {out} and {args.plot or f'sam_{args.task}.png'}")
    return 0


def report(results, task):
    print(f"\n{task}: evaluated over the task's whole range after training for the CPU seconds given (one thread)")
    print(f"{'model':8s}{'cpu s':>8s}{'sequences':>11s}{'level':>7s}{'cost/seq (bits)':>17s}{'bit errors/seq':>16s}")
    for r in results:
        print(f"{r['kind']:8s}{r['cpu_seconds']:8.0f}{r['sequences']:11d}{r['level']:7d}{r['eval_cost']:17.3f}"
              f"{r['eval_errors']:16.3f}")


def plot(results, path, task):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in results:
        if r["curve"]:
            seconds, _, _, cost = zip(*r["curve"])
            line, = ax.plot(seconds, cost, label=f"{r['kind']} (eval {r['eval_errors']:.2f} bit errors/seq)")
            # where the curriculum raised its bound: the cost jumps there
            for (_, _, before, _), (second, _, after, _) in zip(r["curve"], r["curve"][1:]):
                if after != before:
                    ax.axvline(second, color=line.get_color(), linestyle=":", alpha=0.6)
                    ax.annotate(f"<= {after}", (second, 1), xycoords=("data", "axes fraction"), va="top",
                                fontsize=8, color=line.get_color())
    ax.set_xlabel("CPU seconds (one thread)")
    ax.set_ylabel("training cost per sequence (bits)")
    ax.set_yscale("log")
    ax.set_title(f"{task}: learning curves at equal CPU time (thesis Figure 3.4)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
