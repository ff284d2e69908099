"""The thesis's Figure 3.4 at equal CPU time: SAM against DAM and an LSTM (and the Sparse DNC against the DNC) on
copy, associative recall and priority sort, several seeds each, every run given the same CPU seconds per task.

Each run is train_tasks.train in a worker process of one thread; its JSON lands in <out>/runs/ as soon as it ends,
and runs already there are skipped, so an interrupted grid continues where it stopped. Every model shares the
settings below (no per-model tuning). Every --points of the budget the model is evaluated on the same fresh
minibatches over the task's whole range (not charged to its budget): those curves are the figure. At the end it
writes <out>/table.md, table.csv and figure_3_4.png.

    python projects/sam/figure_3_4.py --out results/sam_figure_3_4            # the whole grid, 2 runs at a time
    python projects/sam/figure_3_4.py --out results/sam_figure_3_4 --report   # table and plot of the runs so far
"""
import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from languini.flags import Parser
from projects.sam import tasks
from projects.sam.core import KINDS
from projects.sam.train_tasks import train

BUDGETS = {"copy": 120.0, "recall": 240.0, "sort": 180.0}
# shared by every model: the settings that learned copy and recall in minutes (README, Tasks), Adam at 1e-3
# instead of A.1's RMSProp at 1e-5 with 8 workers, the curriculum of 3.4.3 from 2 for every task
SETTINGS = dict(words=128, optimizer="adam", lr=1e-3, curriculum=True, start_level=2, initial_strength=11.0,
                eval_batches=50, curve_batches=10)
ERROR_MARK = 1.0  # bit errors per sequence: the table says when each run's curve first fell below it


def run_name(task, kind, seed):
    return f"{task}_{kind}_s{seed}"


def run_one(task, kind, seed, seconds, points, path):
    torch.set_num_threads(1)
    result = train(task, kind, seconds, seed=seed, eval_every=seconds / points, **SETTINGS)
    result["seed"], result["settings"] = seed, SETTINGS
    with open(path + ".tmp", "w") as file:
        json.dump(result, file)
    os.replace(path + ".tmp", path)
    return result


def load(folder):
    runs = os.path.join(folder, "runs")
    if not os.path.isdir(runs):
        return []
    return [json.load(open(os.path.join(runs, name))) for name in sorted(os.listdir(runs)) if name.endswith(".json")]


def mean_std(values):
    m = sum(values) / len(values)
    return m, (math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0)


def first_below(curve, mark):
    """CPU seconds at which an eval curve's bit errors first fell below mark, or None."""
    return next((point[0] for point in curve if point[3] < mark), None)


def table(results, tasks_, kinds):
    rows = []
    for task in tasks_:
        for kind in kinds:
            runs = [r for r in results if r["task"] == task and r["kind"] == kind]
            if not runs:
                continue
            cost, cost_sd = mean_std([r["eval_cost"] for r in runs])
            errors, errors_sd = mean_std([r["eval_errors"] for r in runs])
            reached = [first_below(r["eval_curve"], ERROR_MARK) for r in sorted(runs, key=lambda r: r["seed"])]
            rows.append({"task": task, "model": kind, "seeds": len(runs),
                         "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs) / len(runs)),
                         "sequences": round(sum(r["sequences"] for r in runs) / len(runs)),
                         "ms_per_sequence": round(1000 * sum(r["cpu_seconds"] / r["sequences"] for r in runs)
                                                  / len(runs), 2),
                         "eval_cost": round(cost, 3), "eval_cost_sd": round(cost_sd, 3),
                         "bit_errors": round(errors, 3), "bit_errors_sd": round(errors_sd, 3),
                         "level": "/".join(str(r["level"]) for r in sorted(runs, key=lambda r: r["seed"])),
                         "cpu_s_below_mark": "/".join("-" if s is None else f"{s:.0f}" for s in reached)})
    return rows


def write_table(rows, folder):
    import csv

    with open(os.path.join(folder, "table.csv"), "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| task | model | seeds | CPU s | sequences | CPU ms per sequence | cost per sequence (bits) | "
             f"bit errors per sequence | curriculum bound reached | CPU s to < {ERROR_MARK:g} bit error (per seed) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['model']} | {r['seeds']} | {r['cpu_seconds']} | {r['sequences']:,} | "
                     f"{r['ms_per_sequence']} | {r['eval_cost']:.3f} +- {r['eval_cost_sd']:.3f} | "
                     f"{r['bit_errors']:.3f} +- {r['bit_errors_sd']:.3f} | {r['level']} | {r['cpu_s_below_mark']} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(folder, "table.md"), "w") as file:
        file.write(text)
    return text


def plot(results, tasks_, kinds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(tasks_), figsize=(4.2 * len(tasks_), 6.4), squeeze=False)
    for column, task in enumerate(tasks_):
        for kind in kinds:
            runs = [r for r in results if r["task"] == task and r["kind"] == kind and r["eval_curve"]]
            if not runs:
                continue
            length = min(len(r["eval_curve"]) for r in runs)  # the seeds' points are at the same CPU seconds
            seconds = [sum(r["eval_curve"][i][0] for r in runs) / len(runs) for i in range(length)]
            for row, index in ((0, 2), (1, 3)):
                stats = [mean_std([r["eval_curve"][i][index] for r in runs]) for i in range(length)]
                mean = [m for m, _ in stats]
                line, = axes[row][column].plot(seconds, mean, label=f"{kind} ({len(runs)} seeds)")
                axes[row][column].fill_between(seconds, [m - s for m, s in stats], [m + s for m, s in stats],
                                               color=line.get_color(), alpha=0.15)
        axes[0][column].set_title(task)
        axes[0][column].set_ylabel("cost per sequence (bits)")
        axes[1][column].set_ylabel("bit errors per sequence")
        axes[1][column].set_xlabel("CPU seconds of training (one thread)")
        for row in range(2):
            axes[row][column].grid(True, alpha=0.3)
            axes[row][column].set_ylim(bottom=0)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Thesis Figure 3.4 at equal CPU time: evaluation over each task's whole range "
                 "(mean, shaded +- 1 sd over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(folder, tasks_, kinds):
    results = load(folder)
    if not results:
        raise SystemExit(f"no runs in {os.path.join(folder, 'runs')} yet")
    rows = table(results, tasks_, kinds)
    print(write_table(rows, folder))
    plot(results, tasks_, kinds, os.path.join(folder, "figure_3_4.png"))
    print(f"wrote {folder}/table.md, table.csv and figure_3_4.png")


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder of the runs, the table and the plot")
    parser.add_argument("--tasks", nargs="+", choices=tasks.TASKS, default=list(tasks.TASKS))
    parser.add_argument("--models", nargs="+", choices=KINDS, default=["sam", "dam", "lstm", "sdnc", "dnc"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--cpu_seconds", nargs="+", default=[f"{t}={s:g}" for t, s in BUDGETS.items()],
                        help="task=seconds of CPU time for every run of that task")
    parser.add_argument("--points", type=int, default=12, help="evaluations along each run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--report", action="store_true", help="write the table and plot of the runs so far")
    args = parser.parse_args(argv)
    if args.report:
        report(args.out, args.tasks, args.models)
        return 0
    budgets = dict(BUDGETS)
    for item in args.cpu_seconds:
        task, _, seconds = item.partition("=")
        if task not in tasks.TASKS or not seconds:
            raise SystemExit(f"--cpu_seconds takes task=seconds with a task of {', '.join(tasks.TASKS)}, "
                             f"not {item!r}")
        budgets[task] = float(seconds)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    # seed by seed, so that an interrupted grid has every task and model at the first seeds
    todo = [(task, kind, seed) for seed in args.seeds for task in args.tasks for kind in args.models
            if not os.path.exists(os.path.join(args.out, "runs", run_name(task, kind, seed) + ".json"))]
    total = sum(budgets[task] for task, _, _ in todo)
    print(f"{len(todo)} runs to do ({total / 3600:.1f} CPU hours, about {total / 3600 / args.jobs:.1f} h of wall "
          f"time at {args.jobs} at a time); results in {args.out}/runs", flush=True)
    began = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, task, kind, seed, budgets[task], args.points,
                               os.path.join(args.out, "runs", run_name(task, kind, seed) + ".json")):
                   (task, kind, seed) for task, kind, seed in todo}
        done_seconds = 0.0
        for count, future in enumerate(as_completed(futures), 1):
            task, kind, seed = futures[future]
            result = future.result()
            done_seconds += budgets[task]
            elapsed = time.perf_counter() - began
            print(f"[{count}/{len(todo)}] {run_name(task, kind, seed)}: {result['sequences']} sequences, eval "
                  f"{result['eval_cost']:.3f} bits, {result['eval_errors']:.3f} bit errors per sequence; "
                  f"{elapsed / 60:.0f} min elapsed, about {elapsed * (total - done_seconds) / done_seconds / 60:.0f}"
                  f" min left", flush=True)
    report(args.out, args.tasks, args.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
