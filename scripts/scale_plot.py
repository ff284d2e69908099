"""Scaling-law plots of Languini runs (the paper's Figures 9 and 10) and learning curves.

    python scripts/scale_plot.py runs/ --out scale.png                    # every results.json under runs/
    python scripts/scale_plot.py runs/gpt_* runs/qlstm_* --out scale.png --mode fast --split java
    python scripts/scale_plot.py runs/ --out curves.png --curves          # eval rows of each log.jsonl
    python scripts/scale_plot.py runs/ --out curves.png --curves --x tokens  # runs without a reference throughput

Scale plots take each run's final normalised perplexity (results.json, --mode and --split),
keep the best run per project and compute class (unless --all_runs), and fit per project

    normalised perplexity = intercept + slope * ln(x),   x = accelerator hours or total FLOPs.

This is the convention of the paper's legends: fitting Table 6 this way gives slope -0.082
and intercept 2.406 over accelerator hours, as printed in Figures 9a and 10a. The table
also lists the log-log exponent d ln(ppl) / d ln(x), the power law's exponent, and flags a
fit whose perplexity rises with compute.

Only comparable runs are fitted together: the same dataset (its fingerprint), tokenizer, reference
hardware and evaluation (mode, split and the number of tokens scored, which a cap on the evaluation
changes). Runs trained for --max_steps (no compute class) are left out unless --with_max_steps true,
and a copied run (the same results.json twice) counts once. When the runs form several such groups,
nothing is fitted: the groups are listed with what differs, and --group N picks one. Points whose evaluation
read only a sample of the split (--slow_eval_max_windows, or caps sized to a CPU class) are fitted, and the
plot's title and the output say so.

Learning curves (--curves) draw the evaluations during training, which read the same batches of the valid
split every time, the last step included; the final evaluation, which reads more text, is not part of the
line (logs written before that are drawn with their final point apart, hollow). Only comparable runs share a
plot, as above (--group N).
"""

import argparse
import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend must be chosen first)
import numpy as np  # noqa: E402
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator  # noqa: E402

from languini.compute_class import PAPER_COMPUTE_CLASSES, compute_class_seconds  # noqa: E402
from languini.flags import Parser, add_bool_flag  # noqa: E402
from languini.throughput import normalise_hardware  # noqa: E402

FULL_FAST_EVAL_BATCHES = 500  # train.py's default --eval_max_batches: a fast eval capped lower reads a sample
# What must be equal for two runs to be fitted together; the parts of a Point's `comparable` and `labels`.
COMPARED = ("dataset", "tokenizer", "reference hardware", "evaluation")


@dataclass(frozen=True)
class Point:
    project: str
    run: str
    compute_class: str | None
    accelerator_seconds: float
    total_flops: float | None
    normalised_perplexity: float
    comparable: tuple = ()  # one value per COMPARED part: equal tuples, comparable runs
    labels: tuple = ()  # the same parts in words
    capped: bool = False  # its evaluation read only part of the split (evaluation_caps)

    @property
    def accelerator_hours(self) -> float:
        return self.accelerator_seconds / 3600


@dataclass(frozen=True)
class Fit:
    project: str
    axis: str  # "accelerator hours" or "total FLOPs"
    runs: int
    slope: float
    intercept: float
    loglog_exponent: float

    @property
    def rising(self) -> bool:
        """Perplexity growing with compute: the runs are not what a fit assumes (mixed or broken runs)."""
        return self.slope > 0

    def predict(self, x):
        return self.intercept + self.slope * np.log(x)


def find_runs(paths: list[str]) -> list[Path]:
    """Run directories: each path that holds results.json, else every such directory below it."""
    runs = []
    for path in map(Path, paths):
        if (path / "results.json").is_file():
            runs.append(path)
        elif path.is_dir():
            runs.extend(sorted(p.parent for p in path.rglob("results.json")))
        else:
            raise SystemExit(f"{path} is not a run directory (no results.json) nor a folder of runs")
    if not runs:
        raise SystemExit(f"no results.json under {', '.join(paths)}")
    return runs


def evaluation_caps(train: dict | None, mode: str) -> str:
    """The caps a run's `mode` evaluation ran under, in words."""
    if train is None:
        return "caps not recorded"
    if mode == "slow":
        cap = train.get("slow_eval_max_windows")
        if cap is not None and train.get("slow_eval_sample") == "first":
            return f"the split's first {cap} windows of targets"
        return "all windows" if cap is None else f"at most {cap} windows"
    cap = train.get("eval_max_batches")
    return f"{'all' if cap is None else f'at most {cap}'} batches of {train.get('eval_batch_size')} streams"


def comparability(results: dict, mode: str, split: str) -> tuple[tuple, tuple]:
    """(key, labels) of a run over COMPARED; runs written before fingerprints were recorded are keyed by
    their dataset path (so runs of unknown datasets are never fitted with fingerprinted ones)."""
    fingerprint = results.get("dataset_fingerprint")
    dataset = results.get("dataset")
    if fingerprint:
        dataset_key, dataset_label = fingerprint, f"{results.get('dataset_name')} (fingerprint {fingerprint})"
    else:
        dataset_key, dataset_label = dataset, f"{dataset} (no fingerprint recorded)"
    vocab = (results.get("model_config") or {}).get("vocab_size")
    tokenizer = results.get("tokenizer_fingerprint")
    tokenizer_label = f"{vocab} tokens" + (f" (model {tokenizer})" if tokenizer else "")
    hardware = results.get("reference_hardware") or "unknown"
    try:
        name = normalise_hardware(hardware)
        hardware_key = (name.model, name.memory_gb)  # "RTX 3090" = "NVIDIA GeForce RTX 3090"
    except ValueError:
        hardware_key = hardware
    row = results["eval"][mode][split]
    scored = row.get("scored_tokens")
    caps = evaluation_caps(results.get("train_config"), mode)
    # slow rows that name their protocol (how windows move, which targets they score) are keyed by it too
    protocol = tuple(row.get(k) for k in ("protocol", "window", "last_n"))
    protocol_label = f", protocol {protocol[0]} (window {protocol[1]}, last {protocol[2]})" if protocol[0] else ""
    if row.get("sample") == "first":  # the split's first targets, scored by a stateless or a stateful model alike
        protocol = ("first targets", row.get("window"))
        protocol_label = f", the split's first targets in windows of {protocol[1]} (stateless or stateful alike)"
    evaluation_label = (f"{mode} eval on {split}" + (f", {scored:,} tokens scored" if scored is not None else "")
                        + f"{protocol_label} ({caps})")
    return ((dataset_key, (vocab, tokenizer), hardware_key, (mode, split, scored, protocol)),
            (dataset_label, tokenizer_label, hardware, evaluation_label))


def load_points(runs: list[Path], mode: str, split: str, with_max_steps: bool = False) -> tuple[list[Point], list[str]]:
    """One point per run with a `mode` eval on `split`; and why the other runs were skipped (runs without a
    compute class unless with_max_steps; second copies of a run)."""
    points, skipped, seen = [], [], {}
    for run in runs:
        results = json.loads((run / "results.json").read_text())
        evaluation = (results.get("eval") or {}).get(mode, {}).get(split)
        if evaluation is None:
            available = {m: sorted(s) for m, s in (results.get("eval") or {}).items()}
            skipped.append(f"{run}: no {mode} eval on {split!r} (has {available})")
            continue
        if results.get("accelerator_seconds") is None:
            skipped.append(f"{run}: no accelerator_seconds (trained without a reference throughput)")
            continue
        if results.get("compute_class") is None and not with_max_steps:
            skipped.append(f"{run}: trained for --max_steps, not a compute class (--with_max_steps true fits it)")
            continue
        content = json.dumps(results, sort_keys=True)
        if content in seen:
            skipped.append(f"{run}: a copy of {seen[content]} (the same results.json), counted once")
            continue
        seen[content] = run
        key, labels = comparability(results, mode, split)
        train = results.get("train_config") or {}
        cap = (evaluation.get("max_windows", train.get("slow_eval_max_windows")) if mode == "slow"
               else evaluation.get("max_batches", train.get("eval_max_batches")))
        points.append(Point(
            project=results["project"],
            run=str(run),
            compute_class=results.get("compute_class"),
            accelerator_seconds=float(results["accelerator_seconds"]),
            total_flops=results.get("total_flops"),
            normalised_perplexity=float(evaluation["normalised_perplexity"]),
            comparable=key,
            labels=labels,
            capped=cap is not None and (mode == "slow" or cap < FULL_FAST_EVAL_BATCHES),
        ))
    return points, skipped


def comparable_groups(points: list[Point]) -> list[list[Point]]:
    """Points split by their comparability key, the largest group first."""
    groups = {}
    for point in points:
        groups.setdefault(point.comparable, []).append(point)
    return sorted(groups.values(), key=lambda g: (-len(g), g[0].labels))


def describe_groups(groups: list[list[Point]]) -> str:
    """Why the groups cannot be fitted together: the parts that differ, then each group and its runs."""
    differ = [part for i, part in enumerate(COMPARED) if len({g[0].comparable[i] for g in groups}) > 1]
    lines = [f"These runs form {len(groups)} groups that cannot be fitted together; they differ in "
             f"{', '.join(differ)}:"]
    for number, group in enumerate(groups, start=1):
        parts = "; ".join(f"{part} {label}" for part, label in zip(COMPARED, group[0].labels))
        lines.append(f"  group {number} ({len(group)} run{'s' if len(group) > 1 else ''}): {parts}")
        lines.append(f"      {', '.join(p.run for p in group)}")
    lines.append("Fit one group with --group N, or pass only its run folders.")
    return "\n".join(lines)


def best_per_class(points: list[Point]) -> list[Point]:
    """The lowest perplexity per (project, compute class); runs without a class are all kept."""
    best = {}
    for point in points:
        key = (point.project, point.compute_class or point.run)
        if key not in best or point.normalised_perplexity < best[key].normalised_perplexity:
            best[key] = point
    return list(best.values())


def fit_log_law(project: str, axis: str, x, y) -> Fit | None:
    """Least squares of y on ln(x); None with fewer than two distinct x."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(x)) < 2:
        return None
    slope, intercept = np.polyfit(np.log(x), y, 1)
    exponent = np.polyfit(np.log(x), np.log(y), 1)[0]
    return Fit(project, axis, len(x), float(slope), float(intercept), float(exponent))


def fit_projects(points: list[Point]) -> list[Fit]:
    fits = []
    for project in sorted({p.project for p in points}):
        mine = [p for p in points if p.project == project]
        hours = [p.accelerator_hours for p in mine]
        fits.append(fit_log_law(project, "accelerator hours", hours, [p.normalised_perplexity for p in mine]))
        with_flops = [p for p in mine if p.total_flops]
        fits.append(fit_log_law(project, "total FLOPs", [p.total_flops for p in with_flops],
                                [p.normalised_perplexity for p in with_flops]))
    return [fit for fit in fits if fit is not None]


RISING = "RISING: perplexity grows with compute; check the runs"


def format_points(points: list[Point]) -> str:
    """Every point plotted, by project and compute class: what a project of one class shows (it has no fit)."""
    rows = [f"{'project':<14} {'class':>8} {'acc. hours':>11} {'total FLOPs':>12} {'norm. perplexity':>17}  run"]
    for p in sorted(points, key=lambda p: (p.project, p.accelerator_seconds)):
        flops = "-" if p.total_flops is None else f"{p.total_flops:.3g}"
        rows.append(f"{p.project:<14} {p.compute_class or '-':>8} {p.accelerator_hours:>11.4g} {flops:>12} "
                    f"{p.normalised_perplexity:>17.4f}  {p.run}")
    return "\n".join(rows)


def format_fits(fits: list[Fit]) -> str:
    header = f"{'project':<12} {'x':<18} {'runs':>4} {'slope':>9} {'intercept':>10} {'log-log exponent':>17}"
    rows = [f"{f.project:<12} {f.axis:<18} {f.runs:>4} {f.slope:>9.4f} {f.intercept:>10.4f} {f.loglog_exponent:>17.4f}"
            + (f"  {RISING}" if f.rising else "") for f in fits]
    return "\n".join([header, *rows])


TICK_MANTISSAS = ((1, 2, 5), (1, 1.5, 2, 3, 5, 7))


def readable_log_axis(axis, low: float, high: float, label) -> None:
    """A log x axis around [low, high], at least a factor of 4 wide (also for runs of one class), with ticks
    at 1, 2, 5 x 10^k (finer when that gives fewer than three) labelled by label(value)."""
    centre = math.sqrt(low * high)
    start, end = min(low / 1.5, centre / 2), max(high * 1.5, centre * 2)
    axis.set_xscale("log")
    axis.set_xlim(start, end)
    decades = range(math.floor(math.log10(start)), math.ceil(math.log10(end)) + 1)
    for mantissas in TICK_MANTISSAS:
        ticks = [m * 10.0 ** k for k in decades for m in mantissas if start <= m * 10.0 ** k <= end]
        if len(ticks) >= 3:
            break
    if len(ticks) > 12:  # many decades: one tick each
        ticks = [10.0 ** k for k in decades if start <= 10.0 ** k <= end]
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_major_formatter(lambda value, _: label(value))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.xaxis.set_minor_formatter(NullFormatter())


def hours_label(hours: float) -> str:
    return f"{hours:g}"


def flops_label(value: float) -> str:
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def compute_class_lines(axis, classes: set[str], unit_seconds: float = 1.0) -> None:
    """Dashed vertical lines at the paper's classes inside the axis range and at the runs' own classes, on an
    axis in units of unit_seconds (3600: hours)."""
    low, high = axis.get_xlim()
    at = {name: compute_class_seconds(name) / unit_seconds for name in (*classes, *PAPER_COMPUTE_CLASSES)}
    shown = {name: value for name, value in at.items() if name in classes or low <= value <= high}
    for name, value in sorted(shown.items(), key=lambda item: item[1]):
        axis.axvline(value, color="grey", linestyle="--", linewidth=0.8)
        axis.annotate(name, (value, 1), xycoords=("data", "axes fraction"), xytext=(2, -10),
                      textcoords="offset points", fontsize=7, color="grey")


def plot_scaling(points: list[Point], fits: list[Fit], out: Path, title: str) -> None:
    figure, (time_axis, flops_axis) = plt.subplots(2, 1, figsize=(7, 9))
    colours = dict(zip(sorted({p.project for p in points}), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10))
    for axis, axis_name, value, label in (
            (time_axis, "accelerator hours", lambda p: p.accelerator_hours, hours_label),
            (flops_axis, "total FLOPs", lambda p: p.total_flops, flops_label)):
        shown = [p for p in points if value(p)]
        for project, colour in colours.items():
            mine = [p for p in shown if p.project == project]
            axis.scatter([value(p) for p in mine], [p.normalised_perplexity for p in mine], color=colour,
                         label=None if any(f.project == project and f.axis == axis_name for f in fits) else project)
        if shown:
            readable_log_axis(axis, min(map(value, shown)), max(map(value, shown)), label)
            grid = np.geomspace(*axis.get_xlim(), 100)
            for fit in (f for f in fits if f.axis == axis_name):
                axis.plot(grid, fit.predict(grid), color=colours[fit.project],
                          label=f"{fit.project}: slope {fit.slope:.3f} intercept {fit.intercept:.3f}"
                                + (" (RISING)" if fit.rising else ""))
        axis.set_ylabel("normalised perplexity")
        if axis.get_legend_handles_labels()[0]:  # the FLOPs panel is empty when no run knows its FLOPs
            axis.legend(fontsize=8)
        axis.grid(True, which="both", alpha=0.3)
    time_axis.set_xlabel(f"accelerator hours on the reference hardware ({points[0].labels[2]})")
    time_axis.set_title(wrapped(f"{title}\nfit: ppl = intercept + slope * ln(accelerator hours)"), fontsize=9)
    compute_class_lines(time_axis, {p.compute_class for p in points if p.compute_class}, unit_seconds=3600)
    flops_axis.set_xlabel("total FLOPs (3 x forward)")
    flops_axis.set_title("fit: ppl = intercept + slope * ln(FLOPs)", fontsize=9)
    figure.tight_layout()
    figure.savefig(out, dpi=150)
    plt.close(figure)


def curve_split(rows: list[dict], mode: str) -> str | None:
    """The split a run evaluated during training: the one with the most `mode` eval rows."""
    counts = {}
    for r in rows:
        if r.get("event") == "eval" and r.get("mode") == mode:
            counts[r["split"]] = counts.get(r["split"], 0) + 1
    return max(counts, key=counts.get) if counts else None


CURVE_X_LABELS = {"accelerator_seconds": "accelerator seconds (reference hardware)", "tokens": "training tokens"}


def tokens_label(value: float) -> str:
    size, unit = next(((size, unit) for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")) if value >= size), (1, ""))
    return f"{value / size:g}{unit}"


CURVE_TICK_LABELS = {"accelerator_seconds": lambda value: f"{value:g}", "tokens": tokens_label}


@dataclass(frozen=True)
class Curve:
    """A run's learning curve: its evaluations during training (`points`, all on the same subset of the split),
    and where the log predates that subset, its final evaluation apart (`final`), which read more text."""
    run: str
    points: tuple  # (x, normalised perplexity)
    final: tuple | None
    compute_class: str | None
    comparable: tuple = ()  # as Point's: equal tuples, curves that may share a plot
    labels: tuple = ()
    name: str = ""  # the legend's: project, config, budget and seed (the folder name when unrecorded)


def load_curve(run: Path, mode: str, split: str | None, x: str) -> Curve | str:
    """The learning curve of a run, or why it has none."""
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    run_split = split or curve_split(rows, mode)
    evals = [r for r in rows if r.get("event") == "eval" and r.get("mode") == mode and r.get("split") == run_split]
    if not evals:
        return f"{run.name}: no {mode} eval rows on {run_split!r}"
    if any(r.get(x) is None for r in evals):
        return f"{run.name}: its eval rows have no {x} (try --x tokens)"
    final = None
    if any(r.get("progress") for r in evals):  # marked: every evaluation during training reads the same subset
        evals = [r for r in evals if r.get("progress")]
    elif len(evals) > 1:  # an older log: its last row is the final evaluation, which read more of the split
        *evals, last = sorted(evals, key=lambda r: r[x])
        final = (last[x], last["normalised_perplexity"])
    evals.sort(key=lambda r: r[x])
    record = next((json.loads((run / name).read_text()) for name in ("results.json", "config.json")
                   if (run / name).is_file()), {})
    train = record.get("train_config") or record.get("train") or {}
    fingerprint = record.get("dataset_fingerprint")
    vocab = (record.get("model_config") or record.get("model") or {}).get("vocab_size")
    hardware = train.get("reference_hardware") or record.get("reference_hardware") or "unknown"
    subset = evals[0].get("max_batches", "not recorded")
    comparable = (fingerprint or record.get("dataset"), vocab, hardware, (mode, run_split, subset))
    labels = (f"{record.get('dataset_name')} (fingerprint {fingerprint})" if fingerprint else "dataset not recorded",
              f"{vocab} tokens", hardware, f"{mode} eval on {run_split}, at most {subset} batches")
    compute_class = record.get("compute_class") or train.get("compute_class")
    budget = compute_class or (f"{train['max_steps']} steps" if train.get("max_steps") else None)
    name = (" ".join(str(part) for part in (f"{record['project']}/{record.get('config')}", budget,
                                            f"seed {train['seed']}" if "seed" in train else None) if part)
            if record.get("project") else run.name)
    return Curve(run.name, tuple((r[x], r["normalised_perplexity"]) for r in evals), final, compute_class,
                 comparable, labels, name)


def plot_curves(runs: list[Path], out: Path, mode: str, split: str | None, x: str = "accelerator_seconds",
                group: int | None = None) -> tuple[int, list[str]]:
    """Normalised perplexity over `x` from each run's evaluations during training; returns the curves drawn and
    why others were not.

    Without a split, each run's training-time eval split (valid, or test) is drawn. Only comparable runs share a
    plot (the same dataset, vocabulary, reference hardware and evaluated subset): with several groups, --group N
    picks one. A run trained without a reference throughput has no accelerator seconds: draw it over tokens."""
    curves, skipped = [], []
    for run in runs:
        curve = load_curve(run, mode, split, x)
        (skipped if isinstance(curve, str) else curves).append(curve)
    if not curves:
        raise SystemExit(f"no learning curve to draw: {'; '.join(skipped)}")
    groups = comparable_groups(curves)
    if group is not None:
        if not 1 <= group <= len(groups):
            raise SystemExit(f"--group {group}: the runs form {len(groups)} group(s)\n{describe_groups(groups)}")
        curves = groups[group - 1]
    elif len(groups) > 1:
        raise SystemExit(describe_groups(groups).replace("fitted together", "drawn together"))
    figure, axis = plt.subplots(figsize=(8, 5))
    names = [curve.name for curve in curves]
    for curve in curves:  # two runs of the same name (e.g. --run_name) are told apart by their folders
        name = curve.name if names.count(curve.name) == 1 else f"{curve.name} ({curve.run})"
        [line] = axis.plot(*zip(*curve.points), marker=".", label=name)
        if curve.final is not None:
            axis.plot(*curve.final, marker="o", fillstyle="none", linestyle="none", color=line.get_color(),
                      label=f"{name}: final evaluation (more text than the curve's)")
    xs = [point[0] for curve in curves for point in (*curve.points, *([curve.final] if curve.final else []))]
    positive = [v for v in xs if v > 0]
    if positive:
        readable_log_axis(axis, min(positive), max(positive), CURVE_TICK_LABELS[x])
    axis.set_xlabel(CURVE_X_LABELS[x])
    axis.set_ylabel("normalised perplexity")
    dataset, _, hardware, evaluation = curves[0].labels
    axis.set_title(wrapped(f"learning curves: {evaluation}, the same batches at every point; dataset {dataset}; "
                           f"reference hardware {hardware}"), fontsize=9)
    if x == "accelerator_seconds":  # compute classes are accelerator seconds, not tokens
        compute_class_lines(axis, {c.compute_class for c in curves if c.compute_class})
    axis.legend(fontsize=7)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=150)
    plt.close(figure)
    return len(curves), skipped


def wrapped(title: str, width: int = 90) -> str:
    """A title in lines of at most `width` characters, so that it fits the figure."""
    return "\n".join(textwrap.fill(line, width) for line in title.split("\n"))


def capped_note(points: list[Point], mode: str) -> str | None:
    """A warning when the points' evaluation read only part of the split, or None."""
    caps = {p.labels[3] for p in points if p.capped}
    if not caps:
        return None
    return (f"capped {mode} evaluation: the points score a sample of the split ({'; '.join(sorted(caps))}), not "
            "the whole split as the paper's tables do")


def parse_args(argv=None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories, or folders searched for results.json")
    parser.add_argument("--out", required=True, help="image file to write, e.g. scale.png")
    parser.add_argument("--mode", choices=("fast", "slow"), default=None,
                        help="which eval (default: slow, as the paper; fast for --curves, as evaluated during training)")
    parser.add_argument("--split", default=None,
                        help="eval split, e.g. test or an OOD split (default: test; for --curves each run's "
                             "training-time eval split)")
    parser.add_argument("--curves", action="store_true", help="draw learning curves from log.jsonl instead")
    parser.add_argument("--x", choices=tuple(CURVE_X_LABELS), default="accelerator_seconds",
                        help="x axis of learning curves (default: accelerator seconds)")
    add_bool_flag(parser, "--all_runs", False, "plot every run, not only the best per project and compute class")
    add_bool_flag(parser, "--with_max_steps", False, "also fit runs trained for --max_steps (no compute class)")
    parser.add_argument("--group", type=int, default=None,
                        help="when the runs form several groups of comparable runs, fit (or with --curves, draw) "
                             "the N-th one listed")
    return parser.parse_args(argv)


def main(argv=None) -> list[Fit]:
    args = parse_args(argv)
    runs = find_runs(args.runs)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise SystemExit(f"--out {out}: the folder {out.parent} does not exist")
    if args.curves:
        drawn, skipped = plot_curves(runs, out, args.mode or "fast", args.split, args.x, args.group)
        for reason in skipped:
            print(f"skipped {reason}")
        print(f"wrote {out} ({drawn} learning curves)")
        return []
    args.mode, args.split = args.mode or "slow", args.split or "test"
    points, skipped = load_points(runs, args.mode, args.split, args.with_max_steps)
    for reason in skipped:
        print(f"skipped {reason}")
    if not points:
        raise SystemExit(f"no run has a {args.mode} eval on {args.split!r} (among the runs not skipped)")
    groups = comparable_groups(points)
    if args.group is not None:
        if not 1 <= args.group <= len(groups):
            raise SystemExit(f"--group {args.group}: the runs form {len(groups)} group(s)\n{describe_groups(groups)}")
        points = groups[args.group - 1]
    elif len(groups) > 1:
        raise SystemExit(describe_groups(groups))
    if not args.all_runs:
        points = best_per_class(points)
    fits = fit_projects(points)
    dataset, _, hardware, evaluation = points[0].labels
    capped = capped_note(points, args.mode)
    plot_scaling(points, fits, out, f"normalised perplexity, {evaluation}\n"
                                    f"dataset {dataset}, reference hardware {hardware}"
                                    + (f"\nWarning: {capped}" if capped else ""))
    print(f"dataset {dataset}; reference hardware {hardware}; {evaluation}")
    if capped:
        print(f"warning: {capped}")
    print(format_points(points))
    print(format_fits(fits) if fits else "no fit: a fit needs runs of two compute classes or more per project")
    unfitted = sorted({p.project for p in points} - {f.project for f in fits})
    if fits and unfitted:
        print(f"not fitted (runs of one compute class; drawn as points): {', '.join(unfitted)}")
    for fit in (f for f in fits if f.rising):
        print(f"warning: {fit.project} over {fit.axis}: slope {fit.slope:+.4f}, {RISING}")
    print(f"wrote {out} ({len(points)} runs)")
    return fits


if __name__ == "__main__":
    main()
