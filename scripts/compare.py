"""The kitchen's comparison: every language model at equal compute, one leaderboard, one scale plot.

    python scripts/compare.py --dry_run                     # the grid's plan: every run's steps, tokens, time
    python scripts/compare.py                               # train the grid (resumable), then write the outputs
    python scripts/compare.py --print_commands              # one train.py command per run, for a cluster
    python scripts/compare.py --collect runs/a runs/b       # the outputs from finished runs made anywhere

An entry is a project (`gpt`) or a named variant (`gpt+hebbian=gpt --hebbian_softmax true`): its train.py with
those flags. Each entry trains for each compute class (--classes) with seeds 0..--seeds-1 (--middle_seeds at the
middle class), through the project's own train.py (the path a user runs), one run after another, each in
<out>/runs/<entry>_<class>_seed<N>. A finished run (results.json) is skipped and an interrupted one continues from
its checkpoint (--resume auto): Ctrl-C or SIGTERM stops the run in flight after its step, with a checkpoint, and
the same command continues. Nothing here changes a run: the grid is only the runs a user would type.

The outputs, in --out (default results/<hardware>_<date>/comparison/): leaderboard.md and leaderboard.csv
(normalised perplexity on test and the out-of-distribution splits, per byte and per character, the seeds' spread,
tokens, parameters, the throughput each run was charged at and its source, accelerator hours, the
training-frequency buckets), scale.png (the paper's Figure 9 form: per-entry fits of perplexity on
ln(accelerator hours) and ln(FLOPs)), curves.png (learning curves at the largest class), plans.csv and
commands.sh (the command that reproduces the folder). A lead smaller than the seeds' spread is called "within
noise", never a win.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/compare.py`
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from languini import throughput  # noqa: E402
from languini.compute_class import compute_class_seconds  # noqa: E402
from languini.experiment import child_python_path  # noqa: E402
from languini.flags import Parser  # noqa: E402
from languini.stop import EXIT_UNFINISHED  # noqa: E402

PROJECTS = ROOT / "projects"
# The language models (projects with a train.py), and the variants of the default grid: the Hebbian Softmax on the
# GPT, one LRAM memory shared by two blocks (Meta's recipe; the cpu config has 2 blocks, small 12), and Memory+ (pkm_gpt
# with the defaults of Meta's code: its configs memory_plus_cpu and small_memory_plus)
LANGUAGE_MODELS = sorted(p.parent.name for p in PROJECTS.glob("*/train.py"))
CPU_VARIANTS = ("gpt+hebbian=gpt --hebbian_softmax true",
                "lram_gpt+shared=lram_gpt --memory_layers 0,1 --share_memory true",
                "pkm_gpt+memory_plus=pkm_gpt --config memory_plus_cpu")
GPU_VARIANTS = ("gpt+hebbian=gpt --hebbian_softmax true",
                "lram_gpt+shared=lram_gpt --memory_layers 2,4 --share_memory true",
                "pkm_gpt+memory_plus=pkm_gpt --config small_memory_plus")
CPU_CLASSES = ("40s", "2m", "6m")  # the committed CPU table: ~2.5 hours of a 2-core machine (plans.csv)
GPU_CLASSES = ("30s", "90s")  # of the reference RTX 3090: ~7 and ~21 s of an H200 (scripts/gpu_session.sh compare)
SPLITS = ("test", "ood_holmes", "ood_oz", "ood_french")
RUN_NAME = re.compile(r"^(?P<entry>.+)_(?P<klass>[0-9.]+[smhd])_seed(?P<seed>\d+)$")
STARTUP_SECONDS = 15  # a run's start on top of its plan (imports, data, model): for the expected remaining time
SCALE_PLOT = ROOT / "scripts" / "scale_plot.py"


@dataclass(frozen=True)
class Entry:
    name: str
    project: str
    flags: tuple[str, ...] = ()

    @staticmethod
    def parse(spec: str) -> Entry:
        """`project`, or `name=project --flag value ...` (a variant: its flags need a name of their own)."""
        name, named, rest = spec.partition("=")
        if not named or not name or any(c.isspace() for c in name):
            name, rest = None, spec
        words = shlex.split(rest)
        if not words:
            raise ValueError(f"entry {spec!r}: no project")
        project, flags = words[0], tuple(words[1:])
        if project not in LANGUAGE_MODELS:
            raise ValueError(f"entry {spec!r}: {project!r} is not a language-model project "
                             f"({', '.join(LANGUAGE_MODELS)})")
        if name is None and flags:
            raise ValueError(f"entry {spec!r}: a variant needs a name of its own, e.g. '{project}+mine={spec}'")
        name = name or project
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name) or (flags and name == project):
            raise ValueError(f"entry {spec!r}: its name {name!r} must be a folder name (letters, digits, _ . + -) "
                             "and, for a variant, differ from the project's")
        return Entry(name, project, flags)


@dataclass(frozen=True)
class Run:
    entry: Entry
    compute_class: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.entry.name}_{self.compute_class}_seed{self.seed}"


def grid(entries: list[Entry], classes: list[str], seeds: int, middle_seeds: int) -> list[Run]:
    """Entries x classes x seeds, the cheapest runs first (a first look at everything before the long runs)."""
    classes = sorted(classes, key=compute_class_seconds)
    middle = classes[len(classes) // 2] if len(classes) > 2 else None
    runs = [Run(e, c, s) for c in classes for s in range(middle_seeds if c == middle else seeds) for e in entries]
    return sorted(runs, key=lambda r: (compute_class_seconds(r.compute_class), r.seed))


def train_command(run: Run, out: Path, common: list[str], plan_json: Path | None = None) -> list[str]:
    command = [sys.executable, str(PROJECTS / run.entry.project / "train.py"), "--compute_class", run.compute_class,
               "--seed", str(run.seed), "--out_dir", str(out / "runs"), "--run_name", run.name, "--resume", "auto",
               *common, *run.entry.flags]
    if plan_json is not None:
        command += ["--dry_run", "true", "--plan_json", str(plan_json), "--keep_timing", "true"]
    return command


def plan_runs(runs: list[Run], out: Path, common: list[str], say=print) -> dict[str, dict]:
    """Each (entry, class)'s plan from its train.py --dry_run (seeds share it), kept in <out>/plans/. A model
    without a throughput row on a CPU is timed here, once (languini.plan.cpu_row): run this on an idle machine."""
    plans = {}
    (out / "plans").mkdir(parents=True, exist_ok=True)
    for run in runs:
        key = f"{run.entry.name}_{run.compute_class}"
        if key in plans:
            continue
        path = out / "plans" / f"{key}.json"
        command = train_command(run, out, common, path)
        kept = json.loads(path.read_text()) if path.is_file() else {}
        if kept.get("flags") != command[2:]:  # planned before with other flags: again
            say(f"planning {key} ...")
            path.unlink(missing_ok=True)
            result = subprocess.run(command, capture_output=True, text=True,
                                    env={**os.environ, "PYTHONPATH": child_python_path()})
            if result.returncode != 0 or not path.is_file():
                raise SystemExit(f"planning {key} failed (exit {result.returncode}):\n{result.stdout[-3000:]}"
                                 f"{result.stderr[-3000:]}")
            kept = {"flags": command[2:], **json.loads(path.read_text())}
            path.write_text(json.dumps(kept, indent=1) + "\n")
        plans[key] = kept
    return plans


def expected_seconds(plan: dict) -> float | None:
    train, evaluation = plan.get("expected_train_seconds"), plan.get("expected_eval_seconds")
    return None if train is None else train + (evaluation or 0) + STARTUP_SECONDS


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_plans(runs: list[Run], plans: dict[str, dict]) -> str:
    header = (f"{'run':<34} {'steps':>7} {'tokens':>11} {'parameters':>11} {'tokens/s':>9} {'source':<9} "
              f"{'expected':>8}")
    lines, total = [header], 0.0
    for run in runs:
        plan = plans[f"{run.entry.name}_{run.compute_class}"]
        seconds = expected_seconds(plan)
        total += seconds or 0
        parameters = f"{plan['parameters']:,}" if plan.get("parameters") else "?"
        lines.append(f"{run.name:<34} {plan['steps']:>7,} {plan['tokens']:>11,} {parameters:>11} "
                     f"{plan['tokens_per_second'] or 0:>9,.0f} {plan['throughput_source']:<9} {duration(seconds):>8}")
    lines.append(f"{len(runs)} runs; expected {duration(total)} in all on {plans[next(iter(plans))]['local_hardware']} "
                 f"(training, evaluation and {STARTUP_SECONDS} s of start-up a run)")
    return "\n".join(lines)


def write_plans_csv(runs: list[Run], plans: dict[str, dict], path: Path) -> None:
    fields = ("run", "entry", "project", "flags", "compute_class", "seed", "steps", "tokens", "parameters",
              "tokens_per_second", "throughput_source", "reference_hardware", "expected_seconds")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for run in runs:
            plan = plans[f"{run.entry.name}_{run.compute_class}"]
            writer.writerow([run.name, run.entry.name, run.entry.project, shlex.join(run.entry.flags),
                             run.compute_class, run.seed, plan["steps"], plan["tokens"], plan.get("parameters"),
                             plan["tokens_per_second"], plan["throughput_source"], plan["reference_hardware"],
                             round(expected_seconds(plan) or 0)])


class Forward:
    """SIGINT/SIGTERM while a run is in flight: passed to the run (which stops after its step with a checkpoint);
    the grid then stops."""

    def __init__(self):
        self.child, self.received = None, None

    def __enter__(self):
        self.saved = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)

    def handle(self, signum, frame):
        self.received = signal.Signals(signum).name
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


def seconds_left(remaining: float, expected: float, elapsed: float) -> float:
    """The grid's expected time left: the runs after this one (remaining includes this run's expected seconds),
    and what this one has left, none once it overruns."""
    return remaining - expected + max(expected - elapsed, 0)


def train_grid(runs: list[Run], plans: dict[str, dict], out: Path, common: list[str]) -> bool:
    """Each unfinished run in turn, its output in <out>/logs/<run>.log; one progress line for the grid. False when
    stopped by a signal (the run in flight keeps its checkpoint)."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    pending = [r for r in runs if not (out / "runs" / r.name / "results.json").is_file()]
    if len(pending) < len(runs):
        print(f"{len(runs) - len(pending)} of {len(runs)} runs already finished: skipped")
    remaining = sum(expected_seconds(plans[f"{r.entry.name}_{r.compute_class}"]) or 0 for r in pending)
    start, tty = time.monotonic(), sys.stdout.isatty()
    with Forward() as forward:
        for i, run in enumerate(pending, start=1):
            expected = expected_seconds(plans[f"{run.entry.name}_{run.compute_class}"]) or 0
            log = out / "logs" / f"{run.name}.log"
            with log.open("a") as sink:
                forward.child = subprocess.Popen(train_command(run, out, common), stdout=sink,
                                                 stderr=subprocess.STDOUT,
                                                 env={**os.environ, "PYTHONPATH": child_python_path()})
                began, shown = time.monotonic(), 0.0
                while forward.child.poll() is None:
                    time.sleep(1)
                    now = time.monotonic()
                    if tty or now - shown >= 60:
                        shown = now
                        left = seconds_left(remaining, expected, now - began)
                        line = (f"run {i} of {len(pending)}: {run.name}, {duration(now - began)} of ~"
                                f"{duration(expected)}; grid {duration(now - start)} elapsed, ~{duration(left)} left")
                        print(f"\r{line:<110}" if tty else line, end="" if tty else "\n", flush=True)
            code = forward.child.returncode
            remaining -= expected
            if tty:
                print()
            if forward.received or code == EXIT_UNFINISHED:
                print(f"stopped ({forward.received or 'the run exited unfinished'}) in {run.name}: its checkpoint "
                      f"is kept; the same command continues the grid")
                return False
            if code != 0:
                raise SystemExit(f"{run.name} failed (exit {code}); its output: {log}")
            print(f"finished {run.name} in {duration(time.monotonic() - began)} (expected {duration(expected)})")
    return True


# ---- the outputs ----


def load_scale_plot():
    spec = importlib.util.spec_from_file_location("scale_plot", SCALE_PLOT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Result:
    """One finished run as the leaderboard reads it."""
    entry: str
    compute_class: str
    seed: int
    folder: Path
    record: dict

    def value(self, mode: str, split: str, key: str = "normalised_perplexity") -> float | None:
        row = ((self.record.get("eval") or {}).get(mode) or {}).get(split) or {}
        return row.get(key)


def collect(folders: list[Path]) -> list[Result]:
    """Every run with a results.json under the folders; its entry from a run name <entry>_<class>_seed<N> (as
    this script names runs), else <project> with its model flags."""
    results = []
    for folder in folders:
        if not folder.exists():
            raise SystemExit(f"--collect {folder}: no such folder")
        for path in sorted(folder.rglob("results.json")):
            record = json.loads(path.read_text())
            if record.get("compute_class") is None:
                print(f"skipped {path.parent}: trained for --max_steps, not a compute class")
                continue
            seed = (record.get("train_config") or {}).get("seed", 0)
            match = RUN_NAME.match(path.parent.name)
            entry = match["entry"] if match else " ".join(filter(None, [record["project"], record.get("model_flags")]))
            results.append(Result(entry, record["compute_class"], int(seed), path.parent, record))
    if not results:
        raise SystemExit(f"no finished run (results.json of a compute class) under {', '.join(map(str, folders))}")
    return results


def comparable(results: list[Result], mode: str) -> list[Result]:
    """The runs of the largest group that may be compared (same data, tokenizer, reference hardware and
    evaluation: scale_plot.comparability); the others are named and left out."""
    scale_plot = load_scale_plot()
    keys = {}
    for r in results:
        if r.value(mode, "test") is None:
            print(f"left out {r.folder}: no {mode} evaluation on test")
            continue
        keys.setdefault(scale_plot.comparability(r.record, mode, "test")[0][:3], []).append(r)
    if not keys:
        raise SystemExit(f"no run has a {mode} evaluation on test")
    groups = sorted(keys.values(), key=len, reverse=True)
    for other in groups[1:]:
        print(f"left out (not comparable with the {len(groups[0])} others: another dataset, tokenizer or reference "
              f"hardware): {', '.join(str(r.folder) for r in other)}")
    return groups[0]


def one_sample_per_class(results: list[Result], mode: str) -> None:
    """Refuse a class whose entries were scored on different samples of a split: the leaderboard ranks entries
    by perplexity per byte, which moves more between samples (the books differ in bytes per token) than between
    many entries. A run evaluated on another sample (an older commit's, or one sized to its own speed) is named,
    with the command that evaluates it again on the class's."""
    scale_plot = load_scale_plot()
    for klass in sorted({r.compute_class for r in results}, key=compute_class_seconds):
        for split in SPLITS:
            samples = {}
            for r in results:
                if r.compute_class == klass and r.value(mode, split) is not None:
                    samples.setdefault(scale_plot.comparability(r.record, mode, split)[0][3], []).append(r)
            if len(samples) > 1:
                said = "; ".join(f"{key[2]:,} tokens scored by {', '.join(r.folder.name for r in runs)}"
                                 if key[2] is not None else f"an unrecorded sample by "
                                 f"{', '.join(r.folder.name for r in runs)}" for key, runs in samples.items())
                cap = "--eval_max_batches" if mode == "fast" else "--slow_eval_max_windows"
                raise SystemExit(
                    f"At {klass} the runs were scored on different samples of {split} ({mode} evaluation): {said}. "
                    f"Evaluate them again on one: python scripts/evaluate.py RUN_DIR --mode {mode} {cap} N, with "
                    f"the N that `train.py --compute_class {klass} --dry_run` plans today; then collect again.")


@dataclass(frozen=True)
class Cell:
    """An entry at a class: its seeds' values of one measure."""
    entry: str
    compute_class: str
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def spread(self) -> float | None:
        return max(self.values) - min(self.values) if len(self.values) > 1 else None


def cells(results: list[Result], mode: str, split: str, key: str = "normalised_perplexity") -> dict:
    grouped = {}
    for r in results:
        value = r.value(mode, split, key)
        if value is not None and math.isfinite(value):
            grouped.setdefault((r.entry, r.compute_class), []).append(value)
    return {k: Cell(*k, tuple(v)) for k, v in grouped.items()}


def noise(cell: Cell, all_cells: dict) -> tuple[float | None, str]:
    """The seeds' spread of an entry at a class, or where it has one seed, the largest spread it shows at another
    class relative to its mean there, times its mean here (said so; relative, because perplexities at different
    classes differ in scale, a diverged entry's by orders of magnitude); None with no second seed anywhere."""
    if cell.spread is not None:
        return cell.spread, "its seeds"
    others = [c.spread / c.mean for (entry, _), c in all_cells.items()
              if entry == cell.entry and c.spread is not None and c.mean > 0]
    return (max(others) * cell.mean, "its seeds at another class, relative") if others else (None, "one seed")


def verdict(klass: str, all_cells: dict) -> str:
    """Who leads at a class, and whether the lead is larger than the seeds' spread of the two entries compared."""
    ranked = sorted((c for (_, k), c in all_cells.items() if k == klass), key=lambda c: c.mean)
    if len(ranked) < 2:
        return f"{klass}: one entry"
    best = ranked[0]
    tied = []
    for other in ranked[1:]:
        bands = [noise(best, all_cells)[0], noise(other, all_cells)[0]]
        band = max((b for b in bands if b is not None), default=None)
        if band is None or other.mean - best.mean <= band:
            tied.append(other)
    if not tied:
        return (f"{klass}: **{best.entry}** leads ({best.mean:.4f}; next {ranked[1].entry} {ranked[1].mean:.4f}, "
                "a gap larger than either's seed spread)")
    names = ", ".join(f"{c.entry} ({c.mean:.4f})" for c in tied)
    unknown = any(noise(c, all_cells)[0] is None for c in [best, *tied])
    return (f"{klass}: {best.entry} ({best.mean:.4f}) is within noise of {names}"
            + (" (some have one seed and no spread measured: no winner can be named)" if unknown else ""))


def number(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def class_samples(results: list[Result], mode: str, classes: list[str]) -> tuple[str, bool]:
    """("40s 8,192, 2m 16,384": the tokens of test each class's entries were scored on, whether they differ)."""
    scored = {k: next((r.value(mode, "test", "scored_tokens") for r in results if r.compute_class == k), None)
              for k in classes}
    said = ", ".join(f"{k} {v:,}" if v is not None else f"{k} unrecorded" for k, v in scored.items())
    return said, len(set(scored.values())) > 1


def sample_sentence(results: list[Result], mode: str, classes: list[str]) -> str:
    """What each class's entries were scored on (one sample per class: one_sample_per_class), and, where the
    classes' samples differ, that the fits across classes carry the samples' difference too."""
    said, differ = class_samples(results, mode, classes)
    text = f"Every entry of a class is scored on the same sample (tokens of test scored: {said})."
    if differ:
        text += (" The classes' samples differ, and perplexity per byte moves with the sample: compare entries "
                 "within a class; the slopes of the fits across classes carry the samples' difference too.")
    return text


def leaderboard(results: list[Result], mode: str, out: Path, command: str) -> str:
    """leaderboard.csv (a row per entry and class) and leaderboard.md; returns the markdown."""
    classes = sorted({r.compute_class for r in results}, key=compute_class_seconds)
    measures = {split: cells(results, mode, split) for split in SPLITS}
    chars = cells(results, mode, "test", "normalised_perplexity_chars")
    test = measures["test"]
    rows = []
    for (entry, klass), cell in sorted(test.items(), key=lambda kv: (compute_class_seconds(kv[0][1]), kv[1].mean)):
        mine = [r for r in results if r.entry == entry and r.compute_class == klass]
        first = mine[0].record
        row = first.get("throughput_row") or {}
        band, source = noise(cell, test)
        ood = [measures[s][(entry, klass)].mean for s in SPLITS[1:] if (entry, klass) in measures[s]]
        frequency = (((first.get("eval") or {}).get(mode) or {}).get("test") or {}).get("by_frequency") or {}
        rows.append({
            "entry": entry, "project": first["project"], "compute_class": klass, "seeds": len(cell.values),
            "test_ppl": cell.mean, "test_ppl_spread": cell.spread, "noise": band, "noise_from": source,
            **{f"{s}_ppl": measures[s][(entry, klass)].mean if (entry, klass) in measures[s] else None
               for s in SPLITS[1:]},
            "ood_mean_ppl": statistics.fmean(ood) if ood else None,
            "test_ppl_chars": chars[(entry, klass)].mean if (entry, klass) in chars else None,
            "parameters": first.get("parameters"), "tokens": first.get("tokens_seen"), "steps": first.get("steps"),
            "tokens_per_second": first.get("tokens_per_second"), "throughput_source": row.get("source"),
            "throughput_hardware": row.get("hardware"), "accelerator_hours": first.get("accelerator_hours"),
            "total_flops": first.get("total_flops"),
            **{f"bucket_{b['bucket']}_ppl": b.get("perplexity") for b in frequency.get("buckets", [])},
        })
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with (out / "leaderboard.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)

    record = results[0].record
    hardware = record.get("reference_hardware")
    lines = [
        "# Leaderboard: normalised perplexity at equal compute",
        "",
        f"Normalised perplexity (perplexity per byte, the official Languini measure; lower is better), {mode} "
        f"evaluation, on the test split and the three out-of-distribution splits; each entry trained for each "
        f"compute class of **{hardware}** time at the throughput its own registry row gives "
        f"(the 'tokens/s' column and its source). Dataset {record.get('dataset_name')} (fingerprint "
        f"{record.get('dataset_fingerprint')}), vocabulary {(record.get('model_config') or {}).get('vocab_size')}.",
        "",
        "Fair by construction: the same data, tokenizer and evaluation for every entry; each entry at its project's "
        "default hyperparameters (none tuned for this table); every run through its project's own train.py. A "
        "lead within the seeds' spread is called within noise.",
        "",
        sample_sentence(results, mode, classes),
        "",
        "| class | entry | seeds | test | spread | OOD mean | holmes | oz | french | test per char | parameters | "
        "tokens | tokens/s (source) | hours |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        spread = number(r["test_ppl_spread"]) if r["test_ppl_spread"] is not None else "-"
        lines.append(
            f"| {r['compute_class']} | {r['entry']} | {r['seeds']} | {number(r['test_ppl'])} | {spread} | "
            f"{number(r['ood_mean_ppl'])} | {number(r['ood_holmes_ppl'])} | {number(r['ood_oz_ppl'])} | "
            f"{number(r['ood_french_ppl'])} | {number(r['test_ppl_chars'])} | {r['parameters'] or 0:,} | "
            f"{r['tokens'] or 0:,} | {r['tokens_per_second'] or 0:,.0f} ({r['throughput_source']}) | "
            f"{number(r['accelerator_hours'], 5)} |")
    left_out = off_scale(test)
    if left_out:
        lines += ["", f"Left out of scale.png, fits.txt and curves.png: {', '.join(left_out)} (its mean at some class "
                  f"is over {OFF_SCALE} times that class's median: training diverged)."]
    lines += ["", "## Who leads at each class", ""]
    lines += [f"- {verdict(k, test)}" for k in classes]
    bucket_fields = [k for k in fields if k.startswith("bucket_")]
    if bucket_fields:
        lines += ["", "## Test perplexity by training frequency of the target token (seed 0 of each cell)", "",
                  "| class | entry | " + " | ".join(k[len("bucket_"):-len("_ppl")] for k in bucket_fields) + " |",
                  "|---|---|" + "---:|" * len(bucket_fields)]
        lines += [f"| {r['compute_class']} | {r['entry']} | " + " | ".join(number(r.get(k), 2) for k in bucket_fields)
                  + " |" for r in rows]
    lines += ["", f"Reproduce: `{command}` (see commands.sh)."]
    text = "\n".join(lines) + "\n"
    (out / "leaderboard.md").write_text(text)
    return text


OFF_SCALE = 10  # an entry whose mean exceeds this many times its class's median has diverged: not plotted


def off_scale(all_cells: dict) -> list[str]:
    """Entries whose mean at some class is over OFF_SCALE times that class's median: a diverged run would squash
    every other entry's points and fits into one line."""
    medians = {k: statistics.median(c.mean for (_, kk), c in all_cells.items() if kk == k)
               for (_, k) in all_cells}
    return sorted({entry for (entry, k), c in all_cells.items() if c.mean > OFF_SCALE * medians[k]})


def plots(results: list[Result], mode: str, out: Path) -> None:
    """scale.png: each entry's seed mean per class and its fits; curves.png: seed 0 at the largest class; entries
    off the scale (off_scale) left out of both, and said so in the title."""
    scale_plot = load_scale_plot()
    test = cells(results, mode, "test")
    left_out = off_scale(test)
    results = [r for r in results if r.entry not in left_out]
    points = []
    for (entry, klass), cell in test.items():
        if entry in left_out:
            continue
        mine = [r for r in results if r.entry == entry and r.compute_class == klass]
        point, _ = scale_plot.load_points([mine[0].folder], mode, "test")
        points.append(replace(point[0], project=entry, normalised_perplexity=cell.mean))
    fits = scale_plot.fit_projects(points)
    dataset, _, hardware, evaluation = points[0].labels
    said, differ = class_samples(results, mode, sorted({r.compute_class for r in results}, key=compute_class_seconds))
    if differ:  # points[0]'s sample is one class's only
        evaluation = f"{mode} eval on test, each class on its own sample (tokens scored: {said})"
    scale_plot.plot_scaling(points, fits, out / "scale.png",
                            f"the kitchen's comparison: normalised perplexity ({evaluation}; the mean over seeds)\n"
                            f"dataset {dataset}, reference hardware {hardware}"
                            + (f"\nleft out, over {OFF_SCALE}x a class's median: {', '.join(left_out)}"
                               if left_out else ""))
    (out / "fits.txt").write_text(scale_plot.format_fits(fits) + "\n")
    largest = max({r.compute_class for r in results}, key=compute_class_seconds)
    curves = [r.folder for r in results if r.compute_class == largest and r.seed == 0
              and (r.folder / "log.jsonl").is_file()]
    if curves:
        scale_plot.plot_curves(curves, out / "curves.png", "fast", None)


def write_outputs(results: list[Result], mode: str, out: Path, command: str) -> None:
    results = comparable(results, mode)
    one_sample_per_class(results, mode)
    out.mkdir(parents=True, exist_ok=True)
    print(leaderboard(results, mode, out, command))
    plots(results, mode, out)
    took = sum((r.record.get("wall_seconds") or {}).get("total", 0) for r in results)
    header = (f"# Its {len(results)} runs took {duration(took)} of wall time in all (their results.json; start-up "
              "and planning not counted); plans.csv has each run's expected time.")
    path = out / "commands.sh"
    if path.is_file():  # a folder made by several commands keeps them all, in order: the header counts anew
        lines = [header if line.startswith("# Its ") else line for line in path.read_text().splitlines()]
        path.write_text("\n".join(lines + ([] if command in lines else [command])) + "\n")
    else:
        path.write_text("#!/usr/bin/env bash\n# Reproduces this folder (finished runs are skipped, interrupted ones "
                        f"continue).\n{header}\ncd \"$(dirname \"$0\")\"/{os.path.relpath(ROOT, out)}\n{command}\n")
    print(f"wrote {out}/leaderboard.md, leaderboard.csv, scale.png, fits.txt, curves.png, commands.sh")


def default_out(local_hardware: str) -> Path:
    name = re.sub(r"[^a-z0-9]+", "-", local_hardware.lower()).strip("-")
    return ROOT / "results" / f"{name}_{datetime.date.today().isoformat()}" / "comparison"


def parse_args(argv=None) -> argparse.Namespace:
    on_gpu = torch.cuda.is_available()
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    variants = GPU_VARIANTS if on_gpu else CPU_VARIANTS
    parser.add_argument("--entries", nargs="+", default=[*LANGUAGE_MODELS, *variants],
                        help="projects, or variants 'name=project --flag value' (default: every language model "
                             "and the variants " + "; ".join(variants) + ")")
    parser.add_argument("--classes", nargs="+", default=list(GPU_CLASSES if on_gpu else CPU_CLASSES),
                        help=f"compute classes (default: {' '.join(CPU_CLASSES)} on a CPU, {' '.join(GPU_CLASSES)} "
                             "on a GPU)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per entry and class (0, 1, ...)")
    parser.add_argument("--middle_seeds", type=int, default=2,
                        help="seeds at the middle class (with 3 classes or more), for the noise band")
    parser.add_argument("--mode", choices=("fast", "slow"), default="fast",
                        help="the evaluation the leaderboard reads (default fast: every prediction of the eval "
                             "batches, which on a CPU class reads far more text than the slow one's windows)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default results/<hardware>_<date>/"
                                                                "comparison/)")
    parser.add_argument("--dry_run", action="store_true", help="print the grid's plan and its total, train nothing")
    parser.add_argument("--print_commands", action="store_true", help="print one train.py command per run")
    parser.add_argument("--nproc", type=int, default=1, help="with --print_commands: torchrun with this many "
                                                             "processes per run")
    parser.add_argument("--collect", nargs="+", type=Path, default=None,
                        help="build the outputs from the finished runs under these folders, train nothing")
    parser.add_argument("train_flags", nargs=argparse.REMAINDER,
                        help="after --: flags for every run's train.py (e.g. -- --data_root data --config small)")
    args = parser.parse_args(argv)
    if args.train_flags and args.train_flags[0] == "--":
        args.train_flags = args.train_flags[1:]
    try:
        args.entries = [Entry.parse(e) for e in args.entries]
        for klass in args.classes:
            compute_class_seconds(klass)
    except ValueError as error:
        parser.error(str(error))
    if len({e.name for e in args.entries}) < len(args.entries):
        parser.error("two entries share a name")
    if args.seeds < 1 or args.middle_seeds < 1:
        parser.error("--seeds and --middle_seeds must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/compare.py", *(sys.argv[1:] if argv is None else argv)])
    local = throughput.local_device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    out = (args.out or default_out(local)).resolve()
    if args.collect:
        write_outputs(collect(args.collect), args.mode, out, command)
        return
    runs = grid(args.entries, args.classes, args.seeds, args.middle_seeds)
    if args.print_commands:
        for run in runs:
            words = train_command(run, out, args.train_flags)
            words = ["python", os.path.relpath(words[1], ROOT), *words[2:]]
            if args.nproc > 1:
                words = ["torchrun", "--standalone", f"--nproc_per_node={args.nproc}", *words[1:]]
            print(shlex.join(words))
        return
    plans = plan_runs(runs, out, args.train_flags)
    print(format_plans(runs, plans))
    write_plans_csv(runs, plans, out / "plans.csv")
    if args.dry_run:
        return
    if train_grid(runs, plans, out, args.train_flags):
        write_outputs(collect([out / "runs"]), args.mode, out, command)
    else:
        sys.exit(EXIT_UNFINISHED)


if __name__ == "__main__":
    main()
