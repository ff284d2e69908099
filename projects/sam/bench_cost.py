"""The cost of one training step of the memory cores as the memory grows (thesis Figures 3.3 and 3.8): wall time of
one forward and backward step, and the peak memory of training over a sequence beyond the initialisation.

Each (kind, N) is measured in a fresh process, so that one measurement's allocations cannot serve another's:

- time: batch 8 (A.2), one step forward and backward of a full memory (N random words; the state carried from
  step to step), the median of --repeats after --warmup; the initialisation (memory, ring, FAISS index, the dL/dM
  buffer) is not timed;
- memory: batch 1 (A.2), --memory_steps steps (the thesis's 100) forward and backward, the peak resident memory
  of the process (Linux VmHWM, reset through /proc/self/clear_refs after a first one-step run) above its resident
  memory before: the memory that training over the sequence adds, the initialisation excluded as in Figure 3.3b.

Kinds: sam (exact search), sam_faiss (the FAISS index), sdnc, dam, dnc, lstm; the cores of core.py with the
thesis's A.2 sizes (an LSTM of 100 units, words of 32, 4 heads, K = 4). A dense kind is skipped where its
predicted need (from the measurement at N / 2) exceeds --max_gib. Prints a table, writes --csv and --plot.

    python projects/sam/bench_cost.py                                  # N = 2^10 .. 2^20, all kinds (minutes)
    python projects/sam/bench_cost.py --words 10 12 --kinds sam dam --repeats 3   # a quick look
    python projects/sam/bench_cost.py --from_csv sparse.csv dense.csv --plot cost.png  # two runs in one table
"""
import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from languini.experiment import child_python_path
from languini.flags import Parser

KINDS = ("sam", "sam_faiss", "sdnc", "dam", "dnc", "lstm")
INPUT = 8  # input and output width of the benchmark's core (the copy task's)


def core_config(kind: str, words: int, **overrides):
    from projects.sam.configs import MemoryConfig

    return MemoryConfig(kind="sam" if kind == "sam_faiss" else kind, words=words,
                        index="faiss" if kind == "sam_faiss" else "exact", **overrides)


def _resident_kib() -> tuple[int, int]:
    """(current, peak) resident memory of this process in KiB (Linux)."""
    status = Path("/proc/self/status").read_text()
    return (int(re.search(r"VmRSS:\s+(\d+)", status).group(1)), int(re.search(r"VmHWM:\s+(\d+)", status).group(1)))


def measure_here(kind: str, words: int, mode: str, batch: int, steps: int, repeats: int, warmup: int,
                 threads: int, overrides: dict) -> dict:
    """The measurement itself, in this process: {"seconds": [...]} (mode time) or {"peak_mib": x} (mode memory)."""
    from projects.sam.core import MemoryCore

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    core = MemoryCore(core_config(kind, words, **overrides), INPUT, INPUT)
    state = core.initial_state(batch, "cpu")
    if "memory" in state:  # a full memory, as after N writes: every word is searched (and indexed)
        state["memory"] = torch.randn_like(state["memory"])
    x = torch.randn(batch, steps, INPUT)

    def train_step(inputs):
        nonlocal state
        y, new_state = core(inputs, state)
        y.square().mean().backward()
        state = {k: v.detach() for k, v in new_state.items()}

    if mode == "time":
        for _ in range(warmup):
            train_step(x)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            train_step(x)
            seconds.append(time.perf_counter() - start)
        return {"seconds": seconds}
    train_step(x[:, :1])  # lazy buffers (dL/dM, the index's first search) belong to the initialisation
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before, _ = _resident_kib()
    train_step(x)
    _, peak = _resident_kib()
    return {"peak_mib": (peak - before) / 1024}


def measure(kind: str, words: int, mode: str, batch: int, steps: int, repeats: int = 1, warmup: int = 1,
            threads: int = 1, timeout: float = 600, **overrides) -> dict:
    """measure_here in a fresh Python process (projects/sam/bench_cost.py --child)."""
    spec = json.dumps({"kind": kind, "words": words, "mode": mode, "batch": batch, "steps": steps,
                       "repeats": repeats, "warmup": warmup, "threads": threads, "overrides": overrides})
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": child_python_path(), "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run([sys.executable, "-m", "projects.sam.bench_cost", "--child", spec], cwd=root,
                            capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode:
        raise RuntimeError(f"measuring {kind} at N={words} ({mode}) failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def predicted_gib(kind: str, words: int, batch: int, steps: int, previous: tuple[int, float] | None) -> float:
    """What a dense kind will need: its measurement at fewer words (previous: (words, GiB)) scaled by the words
    (their square for the DNC's N x N links), or, with none, six copies of its (B, N, W) memory (and of the DNC's
    (B, N, N) links) per step."""
    power = 2 if kind == "dnc" else 1
    if previous:
        return previous[1] * (words / previous[0]) ** power
    copies = 6 * (words * 32 + (words * words if kind == "dnc" else 0))
    return copies * 4 * batch * max(steps, 1) / 2 ** 30


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=int, nargs="+", default=list(range(10, 21, 2)),
                        help="log2 of the memory sizes N (default 10 12 ... 20)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--batch", type=int, default=8, help="batch of the time measurement (A.2: 8)")
    parser.add_argument("--memory_steps", type=int, default=100, help="steps of the memory measurement (3.3b: 100)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    parser.add_argument("--max_gib", type=float, default=8.0, help="skip a dense kind predicted to need more")
    parser.add_argument("--no_memory", action="store_true", help="time only")
    parser.add_argument("--csv", default="sam_cost.csv")
    parser.add_argument("--plot", default="sam_cost.png")
    parser.add_argument("--from_csv", nargs="+", help="print and plot the rows of earlier runs' CSVs, measure nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure_here(**spec)))
        return 0
    if args.from_csv:
        rows = [row for path in args.from_csv for row in read_csv(path)]
        print_table(rows)
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
        return 0
    from tqdm import tqdm

    rows, previous = [], {}
    jobs = [(kind, 2 ** n) for kind in args.kinds for n in sorted(args.words)]
    for kind, words in tqdm(jobs, desc="measuring", unit="size"):
        row = {"kind": kind, "words": words, "ms_per_step": None, "peak_mib": None, "note": ""}
        dense = kind in ("dam", "dnc")
        for mode, batch, steps in (("time", args.batch, 1), ("memory", 1, args.memory_steps)):
            if mode == "memory" and args.no_memory:
                continue
            need = predicted_gib(kind, words, batch, steps, previous.get((kind, mode)))
            if dense and need > args.max_gib:
                row["note"] += f"{mode} skipped (predicted {need:.1f} GiB); "
                continue
            result = measure(kind, words, mode, batch, steps, args.repeats if mode == "time" else 1,
                             args.warmup if mode == "time" else 0, args.threads)
            if mode == "time":
                row["ms_per_step"] = 1000 * sorted(result["seconds"])[len(result["seconds"]) // 2]
            else:
                row["peak_mib"] = result["peak_mib"]
                previous[(kind, mode)] = (words, max(result["peak_mib"] / 1024, 1e-3))
        rows.append(row)
        tqdm.write(f"{kind:10s} N=2^{int(math.log2(words)):<3d} {fmt(row['ms_per_step'], '.2f')} ms/step  "
                   f"{fmt(row['peak_mib'], '.1f')} MiB  {row['note']}")
    print_table(rows)
    with open(args.csv, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.plot)
    print(f"wrote {args.csv} and {args.plot}")
    return 0


def read_csv(path) -> list[dict]:
    with open(path) as file:
        return [{"kind": r["kind"], "words": int(r["words"]), "note": r["note"],
                 **{k: float(r[k]) if r[k] else None for k in ("ms_per_step", "peak_mib")}}
                for r in csv.DictReader(file)]


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_table(rows):
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    sizes = sorted({r["words"] for r in rows})
    at = {(r["kind"], r["words"]): r for r in rows}
    for field, title, spec in (("ms_per_step", "ms per forward + backward step (batch 8)", ".2f"),
                               ("peak_mib", "MiB added by training over the sequence (batch 1)", ".1f")):
        print(f"\n{title}")
        print("N".ljust(10) + "".join(k.rjust(12) for k in kinds))
        for n in sizes:
            print(f"2^{int(math.log2(n))}".ljust(10)
                  + "".join(fmt(at.get((k, n), {}).get(field), spec).rjust(12) for k in kinds))
    goals(at, sizes)


def goals(at, sizes):
    """The issue's goals, from the table: SAM with the approximate index at most 2x slower at the largest N than
    at the smallest, and at least 100x faster than DAM there."""
    small, large = sizes[0], sizes[-1]
    faiss_small = at.get(("sam_faiss", small), {}).get("ms_per_step")
    faiss_large = at.get(("sam_faiss", large), {}).get("ms_per_step")
    dam_large = at.get(("dam", large), {}).get("ms_per_step")
    if faiss_small and faiss_large:
        print(f"\nsam_faiss at 2^{int(math.log2(large))} / at 2^{int(math.log2(small))}: "
              f"{faiss_large / faiss_small:.2f}x (goal: at most 2x)")
    if faiss_large and dam_large:
        print(f"dam / sam_faiss at 2^{int(math.log2(large))}: {dam_large / faiss_large:.0f}x (goal: at least 100x)")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, field, label in ((axes[0], "ms_per_step", "ms per forward + backward step (batch 8)"),
                             (axes[1], "peak_mib", "MiB added by training over the sequence (batch 1)")):
        for kind in dict.fromkeys(r["kind"] for r in rows):
            points = [(r["words"], r[field]) for r in rows if r["kind"] == kind and r[field] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("memory words N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("Memory cores: cost of one training step as the memory grows (thesis Figures 3.3, 3.8)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
