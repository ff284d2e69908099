"""The Shortformer's claim in the compute-class protocol, on CPU: the GPT, PIA with cache, and PIA with cache and
staged training, each trained for the same compute class on the default corpus, side by side.

    python projects/shortformer/demo.py --compute_class 2m

Each run is an ordinary train.py run (its folder under --out_dir; a finished one is reused, so the table can be
printed again). Without a GPU a compute class is this machine's time, each model timed here by train.py before
its run: a demonstration of the protocol at toy size (the 'cpu' configs), not evidence for or against the slides'
numbers, and a loaded machine shifts every throughput. The GPT's slow evaluation slides a window (it cannot use a
cache); the Shortformer's reads each split once in segments with the cache (the slides' non-overlapping mode).
"""
import importlib
import time

from languini.experiment import main
from languini.flags import Parser

RUNS = (  # label, project, extra flags
    ("GPT", "gpt", []),
    ("PIA + cache", "shortformer", []),
    ("PIA + cache + stages", "shortformer", ["--stages", "cpu_best_perplexity"]),
)


def train(project: str, flags: list[str]) -> tuple[dict, float]:
    configs = importlib.import_module(f"projects.{project}.configs")
    model_cls = importlib.import_module(f"projects.{project}.model").Model
    started = time.perf_counter()
    results = main(project, configs, model_cls, flags)
    return results, time.perf_counter() - started


def main_cli(argv=None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compute_class", default="2m", help="the budget of every run (default 2m: minutes on CPU)")
    parser.add_argument("--out_dir", default="runs/shortformer_demo", help="where the three run folders go")
    parser.add_argument("--split", default="test", help="held-out split the table reports (default test)")
    parser.add_argument("--seed", default="0")
    args = parser.parse_args(argv)
    rows = []
    for label, project, extra in RUNS:
        name = f"{project}{'_staged' if extra else ''}_{args.compute_class}_seed{args.seed}"
        flags = ["--compute_class", args.compute_class, "--out_dir", args.out_dir, "--run_name", name,
                 "--seed", args.seed, "--resume", "auto", *extra]
        print(f"\n=== {label}: {project} {' '.join(flags)}", flush=True)
        results, wall = train(project, flags)
        rows.append((label, results, wall))

    print(f"\n{'model':<22} {'steps':>6} {'tokens':>9} {'ref. s':>7} {'fast ppl':>9} {'slow ppl':>9} "
          f"{'train s':>8} {'wall s':>7}   (normalised perplexity per byte, {args.split} split)")
    for label, r, wall in rows:
        fast, slow = r["eval"]["fast"][args.split], r["eval"]["slow"][args.split]
        print(f"{label:<22} {r['steps']:>6,} {r['tokens_seen']:>9,} {r['accelerator_seconds']:>7.1f} "
              f"{fast['normalised_perplexity']:>9.4f} {slow['normalised_perplexity']:>9.4f} "
              f"{r['train_wall_seconds']:>8.1f} {wall:>7.1f}")
    print("ref. s: reference (here: this CPU's) seconds charged; train s: wall time of the training steps; wall s: "
          "this script's time for the run (timing, training, evaluations, checkpoints; near 0 for a finished run "
          "reused from --out_dir).")


if __name__ == "__main__":
    main_cli()
