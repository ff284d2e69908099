"""The Hebbian Softmax on books: Rae's thesis, Table 4.2 (test perplexity by training frequency), for this kitchen's
projects at one compute class, with and without the rule; and what the rule costs per training step.

    python scripts/prepare_books.py ../shared/data/pgbooks --out data/pgbooks      # once
    python scripts/bench_hebbian.py --data_root data/pgbooks --compute_class 2m     # qlstm and gpt, both ways

Trains each project's CPU config (`--config cpu`, or a GPU config with --config) with `train.py`: plain, with
`--hebbian_softmax true` (the thesis's rule) and with `--hebbian_scale rows` as well (this kitchen's adaptation:
languini/hebbian.py), each charged its own throughput for the same --compute_class (on a CPU each is timed
before its first run, so the rule's cost is charged), in runs named
hebbian_bench_<project>_<softmax|hebbian|hebbian_rows>_<class>
under --out_dir; finished runs are reused, stopped ones continued (--resume auto), so the work can be split over
several calls (--projects qlstm --variants softmax, ..., then all for the table). The slow evaluation also runs with
the neural cache (--eval_cache_size), Table 4.1's "+ Cache".

Then it times the training step of each model with and without the rule, alternating (--cost_rounds rounds of
--cost_steps steps), with the CPU's default numerics and with subnormal floats flushed to zero (a suspect: the
rule's rows make probabilities so small that they are subnormal, which a CPU computes slowly; the flush reaches
only the main thread, so it shows only with OMP_NUM_THREADS=1: languini/README.md), prints the ratios and the
share of the update itself. Last, every run reads the same --eval_windows windows of --split again
(scripts/evaluate.py; a run's own evaluation is sized to its class time, so runs of other speeds read different
text), and the table: per project and rule, the steps trained, the per-token perplexity of those targets in each bucket of
training frequency (the thesis's > 10K, 1K-10K, 100-1K, < 100 occurrences, scaled to the training split's size:
languini/frequency.py) and over all, the normalised perplexity, and with the cache; then the targets of each
project in each bucket. Extra flags after `--` go to every train.py.
"""
import argparse
import importlib
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from languini import hebbian, measure  # noqa: E402
from languini.flags import Parser  # noqa: E402
from languini.trainer import TrainConfig  # noqa: E402

VARIANTS = {"softmax": [], "hebbian": ["--hebbian_softmax", "true"],
            "hebbian_rows": ["--hebbian_softmax", "true", "--hebbian_scale", "rows"]}
RULES = {"softmax": "softmax", "hebbian": "hebbian softmax", "hebbian_rows": "hebbian, rows"}
TRAIN_FLAGS = ["--eval_max_batches", "50", "--slow_eval_max_windows", "1000", "--eval_cache_size", "10000"]


def parse_args(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_root", required=True, help="a prepared dataset (scripts/prepare_books.py --out)")
    parser.add_argument("--compute_class", default="2m", help="the class every run trains for (default 2m)")
    parser.add_argument("--projects", nargs="+", default=["qlstm", "gpt"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="train only these (the table and the timing need both)")
    parser.add_argument("--config", default="cpu", help="the config of every project (default cpu)")
    parser.add_argument("--split", default="test", help="the split of the table (default test)")
    parser.add_argument("--mode", default="slow", choices=("slow", "fast"), help="the evaluation of the table")
    parser.add_argument("--out_dir", default="runs", help="where the runs go (default runs)")
    parser.add_argument("--eval_windows", type=int, default=300,
                        help="the table's evaluation: this many windows (slow) or batches (fast) of --split, the "
                             "same text for every run (each run's own evaluation is sized to its class time)")
    parser.add_argument("--cost_rounds", type=int, default=3, help="alternating timings of each step (0: none)")
    parser.add_argument("--cost_steps", type=int, default=10, help="timed steps per timing")
    parser.add_argument("train_flags", nargs="*", help=f"after --: flags for every train.py (default "
                                                       f"{' '.join(TRAIN_FLAGS)})")
    return parser.parse_args(argv)


def run_name(project: str, variant: str, compute_class: str) -> str:
    return f"hebbian_bench_{project}_{variant}_{compute_class}"


def train(project: str, variant: str, args) -> dict:
    """The results.json of the run, trained (or continued) first unless it is finished."""
    name = run_name(project, variant, args.compute_class)
    command = [sys.executable, str(REPO / "projects" / project / "train.py"), "--config", args.config,
               "--compute_class", args.compute_class, "--data_root", args.data_root, "--out_dir", args.out_dir,
               "--run_name", name, "--resume", "auto", *(args.train_flags or TRAIN_FLAGS), *VARIANTS[variant]]
    print("$ " + " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=REPO)
    return json.loads((Path(args.out_dir) / name / "results.json").read_text())


def evaluate(project: str, variant: str, args) -> dict:
    """The run's --split evaluated again on the same text as every other run's (--eval_windows), with the neural
    cache in the slow mode; kept beside the run (bench_<split>_<mode>_<windows>.json) and reused."""
    run_dir = Path(args.out_dir) / run_name(project, variant, args.compute_class)
    out = run_dir / f"bench_{args.split}_{args.mode}_{args.eval_windows}.json"
    if not out.exists():
        cap = "--slow_eval_max_windows" if args.mode == "slow" else "--eval_max_batches"
        command = [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(run_dir), "--split", args.split,
                   "--mode", args.mode, cap, str(args.eval_windows), "--eval_cache_size", "10000", "--out", str(out)]
        print("$ " + " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, cwd=REPO)
    return json.loads(out.read_text())


def step_cost(project: str, results: dict, rounds: int, steps: int, flush_denormal: bool) -> dict:
    """Median tokens/s of the trained model's step without and with the rule, timed alternately on random tokens,
    and the share of the rule's step spent in the update itself. flush_denormal: CPU subnormals flushed to zero."""
    configs = importlib.import_module(f"projects.{project}.configs")
    model_cls = importlib.import_module(f"projects.{project}.model").Model
    cfg = configs.ModelConfig(**results["model_config"])
    batch = results["global_batch_size"]
    speeds, update_shares = {False: [], True: []}, []
    update = hebbian.HebbianSoftmax.update
    spent = []

    def timed_update(self, hidden, targets):
        start = time.perf_counter()
        update(self, hidden, targets)
        spent.append(time.perf_counter() - start)

    torch.set_flush_denormal(flush_denormal)
    hebbian.HebbianSoftmax.update = timed_update  # the update's own time, inside the step measure times
    try:
        for _ in range(rounds):
            for on in (False, True):
                torch.manual_seed(0)
                spent.clear()
                timed = measure.measure_batch_size(model_cls(cfg).train(), cfg, batch, torch.device("cpu"),
                                                   TrainConfig(hebbian_softmax=on), steps, 2)
                speeds[on].append(timed.tokens_per_second)
                if on:
                    update_shares.append(statistics.median(spent) / timed.step_seconds)
    finally:
        hebbian.HebbianSoftmax.update = update
        torch.set_flush_denormal(False)
    return {"plain": statistics.median(speeds[False]), "hebbian": statistics.median(speeds[True]),
            "update_share": statistics.median(update_shares)}


def _ppl(value) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 1000 else f"{value:.1e}"


def table(results: dict, split: str, mode: str) -> str:
    """Table 4.2 of the thesis for these runs: {(project, variant): results.json}."""
    first = next(iter(results.values()))["eval"][mode][split]["by_frequency"]
    buckets = first["buckets"]
    edges = ", ".join(f"{b['bucket']}: >= {b['train_count_at_least']:,.0f}" for b in buckets[:-1])
    lines = [f"{split} split, {mode} evaluation: per-token perplexity by training frequency. The thesis's buckets "
             f"scaled by {first['scale_to_thesis']:.4f} (training split {first['train_tokens']:,} tokens; {edges}, "
             f"<100: the rest).",
             f"{'project':<8} {'rule':<16} {'steps':>6} " + " ".join(f"{b['bucket']:>8}" for b in buckets)
             + f" {'ALL':>8} {'norm. ppl':>9} {'ALL+cache':>9}"]
    for (project, variant), res in results.items():
        row = res["eval"][mode][split]
        cache = res["eval"].get(f"{mode}_cache", {}).get(split)
        rule = RULES[variant]
        lines.append(f"{project:<8} {rule:<16} {res['steps']:>6} "
                     + " ".join(f"{_ppl(b['perplexity']):>8}" for b in row["by_frequency"]["buckets"])
                     + f" {_ppl(math.exp(row['loss'])):>8} {row['normalised_perplexity']:>9.4f}"
                     + f" {_ppl(math.exp(cache['loss'])) if cache else '-':>9}")
    for project in dict.fromkeys(p for p, _ in results):  # each project's evaluation scores its own targets
        counted = next(res for (p, _), res in results.items() if p == project)["eval"][mode][split]["by_frequency"]
        lines.append(f"{project:<8} {'targets':<16} {'':>6} "
                     + " ".join(f"{b['scored_tokens']:>8,}" for b in counted["buckets"])
                     + f" {sum(b['scored_tokens'] for b in counted['buckets']):>8,}")
    lines.append(f"{'ids':<8} {'(vocabulary)':<16} {'':>6} " + " ".join(f"{b['vocab_ids']:>8,}" for b in buckets))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    results = {(p, v): train(p, v, args) for p in args.projects for v in args.variants}
    if set(args.variants) != set(VARIANTS):
        return results
    print("\nThroughput each run was charged at (timed by train.py before its first run):")
    for (project, variant), res in results.items():
        print(f"  {project:<8} {variant:<8} {res['tokens_per_second']:>9,.0f} tokens/s -> {res['steps']:,} steps")
    if args.cost_rounds:
        print(f"\nThe training step with and without the Hebbian Softmax, on random tokens (median of "
              f"{args.cost_rounds} alternating timings of {args.cost_steps} steps each):")
        for project in args.projects:
            for flush in (False, True):
                cost = step_cost(project, results[(project, "softmax")], args.cost_rounds, args.cost_steps, flush)
                print(f"  {project:<8} {'subnormals flushed' if flush else 'default numerics':<18} "
                      f"{cost['plain']:>8,.0f} tokens/s plain, {cost['hebbian']:>8,.0f} with the rule "
                      f"({cost['hebbian'] / cost['plain']:.3f}); the update itself: {cost['update_share']:.2%} "
                      "of the rule's step", flush=True)
    print()
    evaluated = {key: {**evaluate(*key, args), "steps": res["steps"]} for key, res in results.items()}
    print(table(evaluated, args.split, args.mode))
    return results


if __name__ == "__main__":
    main()
