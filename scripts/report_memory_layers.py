"""Tables, facts and a plot from the CSVs of scripts/bench_memory_layers.py (LRAM, PKM, PEER and the dense MLP).

For each CSV it prints the run's header (device, precision, versions, command), the table of every measured
layer, Table 4's layout (forward time per token by width), notes on the columns, and the facts a reader checks
the memory-layer goals against (projects/lram_gpt/README.md states the goals; this script judges none):
- PKM / LRAM and PEER / LRAM time at the --ratios_at parameter targets, per width, forward and forward + backward,
  and each of the three memory layers against the dense MLP of its width;
- LRAM's slowest / fastest forward over the sizes whose target lies in --flat_range, per width;
- the share of the spec HBM bandwidth that LRAM's lookup reaches on the value rows it reads, at the largest
  memory of each width (rows of smaller tables may come from L2);
- dense MLP / slowest LRAM forward per width, the width from which LRAM is faster at every wider measured width,
  and where the two would cross at the widest width (dense time per token 16 w^2 / F, LRAM's c w: w* = c F / 16).
It writes <csv name>.txt (the printed report) and .png (forward and forward + backward time per token against
total parameters, log-log, one line per layer and width) under --out.

    python scripts/report_memory_layers.py results/nvidia-h100-80gb-hbm3_2026-11-23/memory_layers_*.csv \\
        --out /tmp/report

CSVs written by older versions of the benchmark lack some columns; those cells read as not measured.
"""

import argparse
import csv
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from languini.flags import Parser

PAPER_REPEATS = 15  # Figure 3: "the median of 15 successive runs"
# Which facts to print by default: the sizes of the LRAM issue's PKM comparison and the range of its flatness
# statement (projects/lram_gpt/README.md). Where the goals draw their lines is for the reader, not for this script.
DEFAULT_RATIOS_AT = "2^24,2^28"
DEFAULT_FLAT_RANGE = "2^16..2^28"
# The memory layers timed against LRAM at the --ratios_at targets (each layer's name in the CSV); a layer added to the
# benchmark's LAYERS gets its facts by its name here and a line style in PLOT_STYLES.
AGAINST_LRAM = ("PKM", "PEER", "UltraMemV2")
PLOT_STYLES = {"dense MLP": dict(marker="*", markersize=10, linestyle="none"),
               "LRAM": dict(marker="o", linestyle="-"), "PKM": dict(marker="s", linestyle="--"),
               "PEER": dict(marker="^", linestyle=":"), "UltraMemV2": dict(marker="D", linestyle="-.")}

# ---------------------------------------------------------------- the CSV


@dataclass
class Measurement:
    """One layer at one width and memory size; times are seconds per token, None where not measured."""
    layer: str
    width: int
    memory: str
    params: int
    target: int | None = None  # the parameter target this size stands for (memory layers)
    status: str = "ok"
    fwd: float | None = None
    fwd_bwd: float | None = None
    fwd_bwd_reverse_index: float | None = None
    step_adam: float | None = None
    adam: float | None = None  # the optimiser's part of step_adam
    step_sparse: float | None = None
    sparse_adam: float | None = None  # SparseAdam + Adam's part of step_sparse
    lookup: float | None = None  # LRAM's theta alone on precomputed heads (torus query, lookup, scale)
    lookup_gbps: float | None = None  # the value rows it reads over its time
    lookup_no_torus: float | None = None  # the lookup alone on precomputed lattice coordinates q
    lookup_bwd: float | None = None  # theta forward + backward on precomputed heads
    lookup_bwd_gbps: float | None = None  # rows read twice (forward, backward) and their gradient written

    @property
    def adam_share(self):
        return _ratio(self.adam, self.step_adam)

    @property
    def sparse_adam_share(self):
        return _ratio(self.sparse_adam, self.step_sparse)


def _ratio(part, whole):
    return None if part is None or whole is None else part / whole


TIMES = {"fwd", "fwd_bwd", "fwd_bwd_reverse_index", "step_adam", "adam", "step_sparse", "sparse_adam", "lookup",
         "lookup_no_torus", "lookup_bwd"}  # written in µs per token, held in seconds per token
META = ("device", "date", "torch", "triton", "precision", "tokens", "repeats", "warmup", "command")
DERIVED = ("adam_share", "sparse_adam_share", "lookup_hbm_fraction")


def column_name(field_name: str) -> str:
    return f"{field_name}_us_per_token" if field_name in TIMES else field_name


def csv_header() -> list[str]:
    return [*META, "hbm_spec_gbps", *(column_name(f.name) for f in fields(Measurement)), *DERIVED]


def csv_cells(meta: dict, hbm_gbps: float | None, m: Measurement) -> list:
    """One CSV row: the run's metadata, then the measurement (times in µs per token, blanks where not measured)."""
    values = {f.name: getattr(m, f.name) for f in fields(Measurement)}
    values |= {n: v * 1e6 for n, v in values.items() if n in TIMES and v is not None}
    values |= {"adam_share": m.adam_share, "sparse_adam_share": m.sparse_adam_share,
               "lookup_hbm_fraction": None if m.lookup_gbps is None or hbm_gbps is None else m.lookup_gbps / hbm_gbps}
    cells = [values[f.name] for f in fields(Measurement)] + [values[n] for n in DERIVED]
    return [meta[k] for k in META] + [hbm_gbps] + ["" if c is None else c for c in cells]


@dataclass
class Run:
    """One CSV: the run's metadata (from its first row), the spec HBM bandwidth it used and its measurements."""
    path: Path
    meta: dict
    hbm_gbps: float | None
    results: list[Measurement]


def read_csv(path: Path) -> Run:
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        raise SystemExit(f"{path}: no measurements (is it a CSV of scripts/bench_memory_layers.py?)")
    missing = [c for c in ("layer", "width", "memory", "params", *META) if c not in rows[0]]
    if missing:
        raise SystemExit(f"{path}: not a CSV of scripts/bench_memory_layers.py (no column {', '.join(missing)})")
    types = {"width": int, "params": int, "target": int, "layer": str, "memory": str, "status": str}
    results = []
    for row in rows:
        values = {}
        for f in fields(Measurement):
            cell = row.get(column_name(f.name), "")
            if cell == "":
                continue
            value = types.get(f.name, float)(cell)
            values[f.name] = value * 1e-6 if f.name in TIMES else value
        results.append(Measurement(**values))
    hbm = rows[0].get("hbm_spec_gbps", "")
    return Run(Path(path), {k: rows[0][k] for k in META}, float(hbm) if hbm else None, results)


# ---------------------------------------------------------------- tables


def format_params(n: int) -> str:
    return f"2^{math.log2(n):.1f}"


def format_time(seconds_per_token):
    if seconds_per_token is None:
        return "-"
    us = seconds_per_token * 1e6
    return f"{us:.0f}" if us >= 1000 else f"{us:.3g}"


def format_share(share):
    return "-" if share is None else f"{100 * share:.0f}%"


def format_gbps(gbps):
    return "-" if gbps is None else f"{gbps:.1f}"


def aligned(header, rows) -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return ["  ".join(str(c).rjust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def results_table(results, hbm_gbps) -> list[str]:
    header = ("layer", "width", "memory", "params", "fwd", "fwd+bwd", "fwd+bwd rev-idx", "step Adam", "Adam",
              "step sparse", "sparse opt", "lookup", "GB/s", "of HBM", "no torus", "lookup+bwd", "GB/s", "status")
    rows = []
    for m in results:
        fraction = "-" if m.lookup_gbps is None else "n/a" if hbm_gbps is None else f"{m.lookup_gbps / hbm_gbps:.2f}"
        rows.append((m.layer, m.width, m.memory, format_params(m.params), format_time(m.fwd), format_time(m.fwd_bwd),
                     format_time(m.fwd_bwd_reverse_index), format_time(m.step_adam), format_share(m.adam_share),
                     format_time(m.step_sparse), format_share(m.sparse_adam_share), format_time(m.lookup),
                     format_gbps(m.lookup_gbps), fraction, format_time(m.lookup_no_torus), format_time(m.lookup_bwd),
                     format_gbps(m.lookup_bwd_gbps), m.status))
    return aligned(header, rows)


def width_table(results) -> list[str]:
    """Table 4's layout: forward time per token by width, LRAM over all its measured sizes."""
    rows = []
    for width in sorted({m.width for m in results}):
        dense = [m.fwd for m in results if m.width == width and m.layer == "dense MLP" and m.fwd is not None]
        lram_times = [m.fwd for m in results if m.width == width and m.layer == "LRAM" and m.fwd is not None]
        if not dense and not lram_times:
            continue
        rows.append((width, format_time(dense[0]) if dense else "-",
                     format_time(min(lram_times)) if lram_times else "-",
                     format_time(max(lram_times)) if lram_times else "-", len(lram_times)))
    return aligned(("width", "dense fwd", "LRAM fwd min", "LRAM fwd max", "LRAM sizes"), rows)


def notes(run: Run) -> list[str]:
    on_gpu = not run.meta["device"].startswith("CPU")
    lines = []
    if int(run.meta["repeats"]) < PAPER_REPEATS:
        lines.append(f"- fewer runs than the paper's median of {PAPER_REPEATS}")
    lines.append("- params: the layer's total parameter count; each memory size stands for the --params target "
                 "within a factor sqrt(2) of it")
    lines.append("- Adam / sparse opt: the optimiser's share of the step (sparse: Adam on the dense weights and "
                 "SparseAdam on the values)")
    lines.append("- lookup / no torus / lookup+bwd: LRAM's theta alone on precomputed heads, the lookup alone on "
                 "precomputed lattice coordinates, theta forward + backward (kernel rows, µs per token); GB/s: the "
                 "value rows gathered (tokens x heads x topk rows; backward: twice, plus their fp32 gradients) over "
                 "that time")
    if not on_gpu:
        lines.append("- fwd+bwd rev-idx: the atomic and reverse-index value gradients differ only in the Triton "
                     "kernels, which the CPU run does not use")
        lines.append("- of HBM: n/a on CPU")
    elif run.hbm_gbps is None:
        lines.append(f"- of HBM: n/a, no spec bandwidth for {run.meta['device']!r}; pass --hbm_gbps to the benchmark")
    else:
        lines.append(f"- of HBM: lookup GB/s over the spec-sheet bandwidth {run.hbm_gbps:g} GB/s (not measured); "
                     "above 1 means the rows came from cache")
    return lines


# ---------------------------------------------------------------- facts the goals are read against


def facts(results: list[Measurement], hbm_gbps: float | None, ratios_at=(2**24, 2**28),
          flat_range=(2**16, 2**28)) -> list[str]:
    """Numbers a goal is checked against, one line each; '-' where the run lacks what a fact needs."""
    def measured(layer, width, attribute="fwd"):
        return [m for m in results if m.layer == layer and m.width == width and getattr(m, attribute) is not None]

    def at_target(layer, width, target, attribute):
        return [m for m in measured(layer, width, attribute) if m.target == target]

    def ratio_line(layer, reference, target):
        """layer / reference time at the target, forward and forward + backward, per width (the dense MLP has
        one size per width, whatever the target)."""
        parts = []
        for width in widths:
            shown = []
            for attribute, name in (("fwd", "forward"), ("fwd_bwd", "forward + backward")):
                ours = at_target(layer, width, target, attribute)
                theirs = (measured(reference, width, attribute) if reference == "dense MLP"
                          else at_target(reference, width, target, attribute))
                if ours and theirs:
                    our_time, their_time = getattr(ours[0], attribute), getattr(theirs[0], attribute)
                    shown.append(f"{name} {our_time / their_time:.2f} ({format_time(our_time)} vs "
                                 f"{format_time(their_time)} µs)")
            if shown:
                parts.append(f"w={width}: " + ", ".join(shown))
        return f"- {layer} / {reference} time at {format_params(target)} parameters: " + ("; ".join(parts) or "-")

    widths = sorted({m.width for m in results})
    lines = []
    for target in ratios_at:
        lines += [ratio_line(layer, "LRAM", target) for layer in AGAINST_LRAM]
        lines += [ratio_line(layer, "dense MLP", target) for layer in ("LRAM", *AGAINST_LRAM)]

    parts = []
    for width in widths:
        in_range = [m for m in measured("LRAM", width) if m.target is not None
                    and flat_range[0] <= m.target <= flat_range[1]]
        if len(in_range) >= 2:
            ratio = max(m.fwd for m in in_range) / min(m.fwd for m in in_range)
            span = f"{format_params(min(m.params for m in in_range))}..{format_params(max(m.params for m in in_range))}"
            parts.append(f"w={width} ({len(in_range)} sizes, {span}): {ratio:.2f}")
    lines.append(f"- LRAM slowest / fastest forward over the sizes for {format_params(flat_range[0])}.."
                 f"{format_params(flat_range[1])} parameters (a width's dense weights, 5w^2, set where it can start): "
                 + ("; ".join(parts) or "-"))

    parts = []
    for width in widths:
        with_rows = measured("LRAM", width, "lookup_gbps")
        if with_rows and hbm_gbps:
            largest = max(with_rows, key=lambda m: m.params)  # the largest table: its rows come from HBM
            parts.append(f"w={width} {largest.memory}: {largest.lookup_gbps / hbm_gbps:.2f} "
                         f"({largest.lookup_gbps:.0f} of {hbm_gbps:g} GB/s)")
    lines.append("- LRAM lookup's share of the spec HBM bandwidth on the value rows it reads (largest memory of a "
                 "width): " + ("; ".join(parts) or "-"))

    ratios = {}
    for width in widths:
        dense, lram = measured("dense MLP", width), measured("LRAM", width)
        if dense and lram:
            ratios[width] = (dense[0].fwd, max(m.fwd for m in lram))
    parts = [f"w={w}: {d / s:.2f} ({format_time(d)} vs {format_time(s)} µs)" for w, (d, s) in ratios.items()]
    lines.append("- dense MLP / slowest LRAM forward (above 1: LRAM faster): " + ("; ".join(parts) or "-"))
    if ratios:
        beaten = [w for w in ratios if all(d > s for v, (d, s) in ratios.items() if v >= w)]
        lines.append("- LRAM faster than the dense MLP (forward, every LRAM size) " +
                     (f"from width {beaten[0]} on, of the widths measured" if beaten else "at no width measured"))
        # dense time per token = 16 w^2 / F (two w x 4w matmuls); LRAM's grows as w (w/16 lookups): c w.
        # They cross at w* = c F / 16, with F and c measured at the widest width.
        width = max(ratios)
        dense, lram_fwd = ratios[width]
        flops = 16 * width**2 / dense
        lines.append(f"- where they would cross: at w={width} the dense MLP runs at {flops / 1e12:.3g} TFLOP/s "
                     f"({format_time(dense)} µs per token) and LRAM takes {format_time(lram_fwd)} µs per token "
                     f"({lram_fwd / width * 1e9:.3g} ns per width unit); LRAM would be faster from "
                     f"w = {lram_fwd / width:.3g} s x {flops:.3g} FLOP/s / 16 = {lram_fwd / width * flops / 16:,.0f}")
    return lines


# ---------------------------------------------------------------- the report and the plot


def report(run: Run, extra_notes=(), ratios_at=(2**24, 2**28), flat_range=(2**16, 2**28)) -> list[str]:
    meta = run.meta
    on_gpu = not meta["device"].startswith("CPU")
    lines = [f"# {meta['device']}, {meta['precision']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}",
             f"# {meta['command']}",
             f"# times in µs per token: median of {meta['repeats']} runs of {meta['tokens']} tokens after "
             f"{meta['warmup']} warm-up runs" + ("" if on_gpu else "; CPU: PyTorch reference paths"),
             ""]
    lines += results_table(run.results, run.hbm_gbps)
    lines += ["", "Forward time per token by width (the layout of the paper's Table 4):"] + width_table(run.results)
    lines += ["", "Notes:"] + notes(run) + [f"- {note}" for note in extra_notes]
    lines += ["", "Facts for the goals (projects/lram_gpt/README.md states them; times in µs per token):"]
    lines += facts(run.results, run.hbm_gbps, ratios_at, flat_range)
    if not on_gpu:
        lines.append("- CPU run: the goals are GPU goals; these numbers time the PyTorch references")
    return lines


def plot(path, results, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted({m.width for m in results})
    colours = {w: plt.cm.viridis(i / max(len(widths) - 1, 1)) for i, w in enumerate(widths)}
    styles = PLOT_STYLES
    figure, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for axis, attribute, name in zip(axes, ("fwd", "fwd_bwd"), ("forward", "forward + backward")):
        for layer, style in styles.items():
            for width in widths:
                points = sorted((m.params, getattr(m, attribute)) for m in results
                                if m.layer == layer and m.width == width and getattr(m, attribute) is not None)
                if points:
                    params, seconds = zip(*points)
                    axis.plot(params, [s * 1e6 for s in seconds], color=colours[width], label=f"{layer} w={width}",
                              **style)
        axis.set(xscale="log", yscale="log", xlabel="total parameters of the layer",
                 ylabel="time per token (µs)", title=name)
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="center right", fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout(rect=(0, 0, 0.85, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(run: Run, out: Path, extra_notes=(), ratios_at=(2**24, 2**28), flat_range=(2**16, 2**28)):
    """Print the report and write it (.txt) and the plot (.png) under out, named after the CSV."""
    lines = report(run, extra_notes, ratios_at, flat_range)
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    stem = out / run.path.stem
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    plot(stem.with_suffix(".png"), run.results, f"{run.meta['device']}, {run.meta['precision']}, "
                                                f"{run.meta['tokens']} tokens per run, median of {run.meta['repeats']}")
    print(f"wrote {stem}.txt and .png", flush=True)
    return lines


# ---------------------------------------------------------------- command line


def parse_params(text: str) -> list[int]:
    """'2^20..2^28' (every power of two between), '2^24', '1000000', or a comma-separated mix."""
    def number(token):
        token = token.strip()
        base, _, exponent = token.partition("^")
        try:
            value = int(base) ** int(exponent) if exponent else int(base)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a parameter count: {token!r} (write 2^24 or 16777216)")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"parameter counts must be positive, got {token!r}")
        return value

    targets = []
    for item in text.split(","):
        low, dots, high = item.partition("..")
        if not dots:
            targets.append(number(item))
            continue
        low, high = number(low), number(high)
        if low & (low - 1) or high & (high - 1) or low > high:
            raise argparse.ArgumentTypeError(f"a range must go from a power of two up to one, got {item!r}")
        targets += [2**e for e in range(low.bit_length() - 1, high.bit_length())]
    return sorted(set(targets))


def parse_range(text: str) -> tuple[int, int]:
    low, dots, high = text.partition("..")
    if not dots:
        raise argparse.ArgumentTypeError(f"a range is written low..high, e.g. 2^16..2^28, got {text!r}")
    (low,), (high,) = parse_params(low), parse_params(high)
    if low > high:
        raise argparse.ArgumentTypeError(f"the range's low end is above its high end: {text!r}")
    return low, high


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csvs", nargs="+", type=Path, help="CSVs written by scripts/bench_memory_layers.py")
    parser.add_argument("--ratios_at", type=parse_params, default=parse_params(DEFAULT_RATIOS_AT),
                        help="parameter targets at which to print PKM / LRAM, PEER / LRAM and each / dense MLP")
    parser.add_argument("--flat_range", type=parse_range, default=parse_range(DEFAULT_FLAT_RANGE),
                        help="targets over which to print LRAM's slowest / fastest forward")
    parser.add_argument("--out", type=Path, default=Path("bench_results"), help="where the .txt and .png go")
    args = parser.parse_args(argv)
    for path in args.csvs:
        if not path.is_file():
            parser.error(f"no such file: {path}")
    for i, path in enumerate(args.csvs):
        if i:
            print()
        write_report(read_csv(path), args.out, ratios_at=args.ratios_at, flat_range=args.flat_range)


if __name__ == "__main__":
    main(sys.argv[1:])
