"""Speed of the memory layers against the MLP they replace: Figure 3 and Table 4 of Goucher & Troll (LRAM).

Times three layers on random tokens x [1, tokens, w]:
- dense MLP: w -> 4w -> w with GELU;
- LRAM: projects.lram_gpt LRAMBlock (memory sub-network of section 3.1, value_dim 64, top-32), memory_size
  chosen to hit each total-parameter target;
- PKM: projects.pkm_gpt ProductKeyMemory as in the LRAM paper (8 heads, k_dim 64, knn 32, v_dim = w),
  n_keys chosen to hit each target.
A memory size is used for a target when the layer's total parameter count is within half an octave
(a factor sqrt(2)) of it; targets a width cannot reach are listed after the table.

Per layer it reports, per token (the run's time divided by its tokens, like Figure 3's "divided by the
minibatch size"), the median of --repeats runs after --warmup runs:
- forward (no grad), the quantity of Figure 3 and Table 4;
- forward + backward (to the parameters and the input), with the atomic value gradient and the reverse-index one
  (value_grad "segment" in both memory layers; they differ only in the Triton kernels, so only on a GPU);
- the training step with Adam on every parameter, and the optimiser's share of it; for memory layers
  whose constructor takes sparse_values=True, also the step with row-sparse value gradients and
  torch.optim.SparseAdam for the values (Adam for the rest), as languini.trainer does;
- for LRAM, the lookup alone (theta on precomputed queries) and its bandwidth on the value rows it gathers,
  tokens * heads * 32 rows of 64 values per run, against the GPU's spec HBM bandwidth (languini/hardware.py; not
  measured; small memories sit in L2, so the fraction can exceed 1).
GPU times come from CUDA events, CPU times from time.perf_counter (CPU kernels are synchronous).
On CPU the layers run their PyTorch reference paths: use tiny sizes, for a smoke test only.

Writes under --out: memory_layers_<device>_<precision>.txt (the printed report), .csv (one row per layer and size,
with the device, date, torch and triton versions and the command line) and .png (forward and
forward+backward time per token against total parameters, log-log, one line per layer and width).
Then it checks the goals of issues 4 and 14 on the numbers when on a GPU. Every run starts from fresh random
inputs after an L2 flush (GPU), and each CSV row is written as soon as it is measured. --precision fp32 turns
TF32 off (the paper's Table 4 conditions).

    python scripts/bench_memory_layers.py                                    # all widths, 2^20..2^30 params
    python scripts/bench_memory_layers.py --widths 512,2048 --params 2^20..2^28
    python scripts/bench_memory_layers.py --device cpu --widths 32 --params 2^15..2^17 \\
        --tokens 16 --repeats 3 --warmup 1                                   # a smoke test on CPU
"""

import argparse
import bisect
import csv
import datetime
import functools
import gc
import importlib.metadata
import math
import os
import platform
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from languini import timing
from languini.hardware import device_spec
from languini.trainer import precision_for
from projects.lram_gpt.memory import LRAMBlock, theta
from projects.lram_gpt.ops.lookup.naive import interpolate, torus_query
from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, ProductKeyMemory

PAPER_REPEATS = 15  # Figure 3: "the median of 15 successive runs"
DEFAULT_WIDTHS = "512,768,2048,3072,4096,6144,8192,12288"  # Figure 3's and Table 4's widths, and the model's 768
DEFAULT_PARAMS = "2^20..2^30"
TARGET_TOLERANCE_OCTAVES = 0.5  # a memory size counts for a target within a factor sqrt(2) of it
LEARNING_RATE = 1e-4  # the paper's rate for dense weights; the step time does not depend on it

# The goals (issues 4 and 14): PKM / LRAM forward + backward at two sizes, flatness of the forward over
# memory sizes, the lookup's share of HBM bandwidth, and LRAM against the dense MLP at the paper's widths.
PKM_GOALS = ((2**24, 3.0), (2**28, 5.0))  # (total parameters, least PKM / LRAM ratio of forward + backward)
FLAT_RANGE = (2**16, 2**28)
FLAT_MAX_RATIO = 1.5  # "nearly flat": slowest / fastest LRAM size in FLAT_RANGE at one width
HBM_GOAL_FRACTION = 0.6  # LRAM's lookup on the value rows it reads, at the largest memory of a width
DENSE_GOAL_MAX_WIDTH = 8192  # Table 4 (fp32): LRAM is faster than the dense MLP from width 8192
L2_FLUSH_BYTES = 256 * 2**20  # more than any GPU's L2 (H100: 50 MiB), written between timed runs


# ---------------------------------------------------------------- the layers


@dataclass(frozen=True)
class Layer:
    """How to build one layer kind; sizes (ascending) are the memory sizes it may use, empty for the MLP."""
    name: str
    build: Callable[..., nn.Module]  # build(width, size, **options); memory layers take their constructor's options
    sizes: Sequence[int] = ()
    size_label: Callable[[int], str] = str

    @property
    def is_memory(self) -> bool:
        return bool(self.sizes)


def dense_mlp(width, size=None):
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


def lram(width, memory_size, **options):
    return LRAMBlock(width, memory_size=memory_size, **options)


def pkm(width, n_keys, use_triton=None, **options):
    return ProductKeyMemory.from_config(width, replace(LRAM_PAPER_PKM, n_keys=n_keys, **options), use_triton)


LAYERS = {
    "dense": Layer("dense MLP", dense_mlp),
    "lram": Layer("LRAM", lram, sizes=tuple(2**e for e in range(8, 41)),
                  size_label=lambda n: f"N=2^{n.bit_length() - 1}"),
    "pkm": Layer("PKM", pkm, sizes=range(32, 2**17), size_label=lambda n: f"n_keys={n}"),
}


def make(layer_key: str, width: int, size: int | None, use_triton: bool | None = False, **options) -> nn.Module:
    """The layer on the current default device; memory layers get the atomic value gradient unless told otherwise."""
    layer = LAYERS[layer_key]
    if not layer.is_memory:
        return layer.build(width, size)
    return layer.build(width, size, use_triton=use_triton, **(dict(value_grad="atomic") | options))


def memory_label(layer_key: str, size: int | None) -> str:
    return LAYERS[layer_key].size_label(size) if LAYERS[layer_key].is_memory else "-"


@functools.lru_cache(maxsize=None)
def parameter_count(layer_key: str, width: int, size: int | None) -> int:
    """Total parameters of the layer, counted on a meta-device copy (nothing is allocated)."""
    with torch.device("meta"):
        module = make(layer_key, width, size)
    return sum(p.numel() for p in module.parameters())


def choose_size(layer_key: str, width: int, target: int) -> int | None:
    """The memory size whose total parameter count is nearest to target (in log), or None if none is near."""
    sizes = LAYERS[layer_key].sizes
    first_above = bisect.bisect_left(sizes, target, key=lambda s: parameter_count(layer_key, width, s))
    candidates = [sizes[i] for i in (first_above - 1, first_above) if 0 <= i < len(sizes)]
    best = min(candidates, key=lambda s: abs(math.log2(parameter_count(layer_key, width, s) / target)))
    octaves = abs(math.log2(parameter_count(layer_key, width, best) / target))
    return best if octaves <= TARGET_TOLERANCE_OCTAVES else None


# ---------------------------------------------------------------- timing


@dataclass
class Bench:
    device: torch.device
    autocast: Callable  # () -> context manager
    use_triton: bool | None  # None: the kernels on CUDA; False: the PyTorch references (CPU)
    tokens: int
    repeats: int
    warmup: int


_L2_FLUSH = {}


def fresh_inputs(bench: Bench, *inputs):
    """New random values in the inputs (tensors get normal_(), callables are called) and, on a GPU, an L2
    flush, before every run: no run finds the table rows or the inputs of the one before in cache."""
    with torch.no_grad():
        for item in inputs:
            item() if callable(item) else item.normal_()
    if bench.device.type == "cuda":
        if bench.device not in _L2_FLUSH:
            _L2_FLUSH[bench.device] = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=bench.device)
        _L2_FLUSH[bench.device].zero_()


def time_phases(run_once, bench: Bench, inputs=()) -> list[list[float]]:
    """Seconds of each phase of each timed run (languini.timing); run_once(mark) calls mark() at the end of every
    phase. The tensors in inputs get new random values before every run, and a GPU's L2 cache is flushed."""
    return timing.time_phases(run_once, bench.device, bench.repeats, bench.warmup,
                              before_each=lambda: fresh_inputs(bench, *inputs))


def forward_run(module, x, bench):
    def run(mark):
        with torch.no_grad(), bench.autocast():
            module(x)
        mark()
    return run


def training_run(module, x, grad, optimizers, bench):
    """Phases: forward + backward (also to the input, as inside a network), then (with optimizers) their steps."""
    def run(mark):
        module.zero_grad(set_to_none=True)
        x.grad = None
        with bench.autocast():
            out = module(x)
        out.backward(grad)
        mark()
        if optimizers:
            for optimizer in optimizers:
                optimizer.step()
            mark()
    return run


def median_per_token(samples, bench):
    return statistics.median(samples) / bench.tokens


# ---------------------------------------------------------------- measuring one configuration


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


def free_memory_bytes(device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def release(device):
    """Hand freed GPU memory back before the next (maybe larger) layer; CPU memory goes back by itself."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def measure(layer_key: str, width: int, size: int | None, target: int | None, bench: Bench) -> Measurement:
    layer = LAYERS[layer_key]
    params = parameter_count(layer_key, width, size)
    m = Measurement(layer.name, width, memory_label(layer_key, size), params, target)
    # parameters, gradients and Adam's two moments in fp32; activations come on top
    needed, free = 16 * params, free_memory_bytes(bench.device)
    if free is not None and needed > free:
        m.status = f"skipped: parameters, gradients and Adam moments need {needed / 2**30:.1f} GiB, " \
                   f"{free / 2**30:.1f} GiB free"
        return m
    stage = "building"
    try:
        torch.manual_seed(0)
        x = torch.randn(1, bench.tokens, width, device=bench.device, requires_grad=True)
        module = make(layer_key, width, size, bench.use_triton).to(bench.device)
        stage = "forward"
        m.fwd = median_per_token([r[0] for r in time_phases(forward_run(module, x, bench), bench, [x])], bench)
        with torch.no_grad(), bench.autocast():
            grad = torch.randn_like(module(x))
        if layer_key == "lram":
            stage = "lookup"
            m.lookup, m.lookup_gbps, m.lookup_no_torus, m.lookup_bwd, m.lookup_bwd_gbps = time_lookup(module, x, bench)
        stage = "step with Adam"
        adam = torch.optim.Adam(module.parameters(), lr=LEARNING_RATE, fused=bench.device.type == "cuda")
        runs = time_phases(training_run(module, x, grad, [adam], bench), bench, [x])
        m.fwd_bwd = median_per_token([r[0] for r in runs], bench)
        m.adam = median_per_token([r[1] for r in runs], bench)
        m.step_adam = median_per_token([sum(r) for r in runs], bench)
        del module, adam
        release(bench.device)
        if layer.is_memory and bench.use_triton is not False:
            stage = "reverse-index backward"
            module = make(layer_key, width, size, bench.use_triton, value_grad="segment").to(bench.device)
            runs = time_phases(training_run(module, x, grad, [], bench), bench, [x])
            m.fwd_bwd_reverse_index = median_per_token([r[0] for r in runs], bench)
            del module
            release(bench.device)
        if layer.is_memory:
            stage = "step with SparseAdam"
            module = make(layer_key, width, size, bench.use_triton, sparse_values=True).to(bench.device)
            values = {id(p) for p in module.value_parameters()}
            optimizers = [torch.optim.Adam([p for p in module.parameters() if id(p) not in values],
                                           lr=LEARNING_RATE, fused=bench.device.type == "cuda"),
                          torch.optim.SparseAdam(module.value_parameters(), lr=LEARNING_RATE)]
            runs = time_phases(training_run(module, x, grad, optimizers, bench), bench, [x])
            m.sparse_adam = median_per_token([r[1] for r in runs], bench)
            m.step_sparse = median_per_token([sum(r) for r in runs], bench)
    except torch.cuda.OutOfMemoryError:
        m.status = f"out of memory in {stage}"
    return m


def time_lookup(block: LRAMBlock, x, bench):
    """The kernel alone, per token: theta on precomputed heads (forward) and the GB/s of value rows it gathers;
    the lookup on precomputed lattice coordinates (no torus query); theta forward + backward and its GB/s
    (rows gathered twice, their fp32 gradients added once)."""
    with torch.no_grad(), bench.autocast():
        heads = block.heads(x).detach()
        q = torus_query(heads, block.K)[1]
    use_triton = bench.use_triton is not False

    def refresh_q():
        heads.normal_()
        q.copy_(torus_query(heads, block.K)[1])  # lattice coordinates spread over the torus, as theta's

    def forward(mark):
        with torch.no_grad(), bench.autocast():
            theta(heads, block.values, block.K, topk=block.topk, use_triton=use_triton)
        mark()

    def forward_no_torus(mark):
        with torch.no_grad():
            if use_triton:
                from projects.lram_gpt.ops.lookup.triton import interpolate_triton

                interpolate_triton(q, block.values, block.K, block.topk)
            else:
                interpolate(q, block.values, block.K, block.topk)
        mark()

    heads_grad = heads.clone().requires_grad_()
    grad = torch.randn(*heads.shape[:-1], block.values.shape[1], device=heads.device)

    def forward_backward(mark):
        block.values.grad = heads_grad.grad = None
        with bench.autocast():
            out = theta(heads_grad, block.values, block.K, topk=block.topk, use_triton=use_triton)
        out.backward(grad.to(out.dtype))
        mark()

    median = lambda runs: statistics.median(r[0] for r in runs)  # noqa: E731
    seconds = median(time_phases(forward, bench, [heads]))
    no_torus = median(time_phases(forward_no_torus, bench, [refresh_q]))
    with_backward = median(time_phases(forward_backward, bench, [heads_grad]))
    lookups = heads.shape[:-1].numel() * block.topk
    row_bytes = block.values.shape[1] * block.values.element_size()
    gradient_bytes = block.values.shape[1] * 4  # the value gradient accumulates in fp32
    return (seconds / bench.tokens, lookups * row_bytes / seconds / 1e9, no_torus / bench.tokens,
            with_backward / bench.tokens, lookups * (2 * row_bytes + gradient_bytes) / with_backward / 1e9)


def plan(layer_keys, widths, targets):
    """(layer_key, width, size, target) to measure, and notes on targets no size of a layer reaches."""
    configs, notes = [], []
    for width in widths:
        for key in layer_keys:
            if not LAYERS[key].is_memory:
                configs.append((key, width, None, None))
                continue
            chosen, unreachable = {}, []
            for target in targets:
                size = choose_size(key, width, target)
                if size is None:
                    unreachable.append(format_params(target))
                elif size not in chosen:
                    chosen[size] = target
            configs += [(key, width, size, target) for size, target in chosen.items()]
            if unreachable:
                sizes = LAYERS[key].sizes
                notes.append(f"{LAYERS[key].name} w={width}: no memory size within a factor sqrt(2) of "
                             f"{', '.join(unreachable)} parameters (its sizes span "
                             f"{format_params(parameter_count(key, width, sizes[0]))}.."
                             f"{format_params(parameter_count(key, width, sizes[-1]))})")
    return configs, notes


def run_all(configs, bench, log=print, on_result=lambda m: None) -> list[Measurement]:
    """Measure every configuration; once a size does not fit, larger sizes of that layer and width are skipped.

    on_result(m) sees each measurement as soon as it is taken (the CSV is written row by row)."""
    results, failed = [], set()
    for key, width, size, target in configs:
        if (key, width) in failed:
            m = Measurement(LAYERS[key].name, width, memory_label(key, size), parameter_count(key, width, size),
                            target, "skipped: a smaller size did not fit")
        else:
            m = measure(key, width, size, target, bench)
            release(bench.device)  # the measurement's tensors, also after running out of memory
            if m.status != "ok":
                failed.add((key, width))
        log(f"  {m.layer} w={m.width} {m.memory}: {m.status}", flush=True)
        on_result(m)
        results.append(m)
    return results


# ---------------------------------------------------------------- reporting


def hbm_spec_gbps(device_name: str) -> float | None:
    """The device's spec HBM bandwidth in GB/s from languini.hardware's table; None where it records none."""
    spec = device_spec(device_name)
    return spec.hbm_bytes_per_second / 1e9 if spec and spec.hbm_bytes_per_second else None


def format_params(n: int) -> str:
    return f"2^{math.log2(n):.1f}"


def format_time(seconds_per_token):
    if seconds_per_token is None:
        return "-"
    us = seconds_per_token * 1e6
    return f"{us:.0f}" if us >= 1000 else f"{us:.3g}"


def format_share(share):
    return "-" if share is None else f"{100 * share:.0f}%"


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
                     format_time(m.step_sparse), format_share(m.sparse_adam_share),
                     format_time(m.lookup), "-" if m.lookup_gbps is None else f"{m.lookup_gbps:.1f}", fraction,
                     format_time(m.lookup_no_torus), format_time(m.lookup_bwd),
                     "-" if m.lookup_bwd_gbps is None else f"{m.lookup_bwd_gbps:.1f}", m.status))
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


def evaluate_goals(results: list[Measurement], hbm_gbps: float | None = None, precision: str = "bf16") -> list[str]:
    """The goals as a checklist ([x] met, [ ] missed, [?] not judged, [i] a finding, not a goal)."""
    def measured(layer, width=None, target=None, attribute="fwd"):
        return [m for m in results if m.layer == layer and (width is None or m.width == width)
                and getattr(m, attribute) is not None and (target is None or m.target == target)]

    def line(detail_lines, title):
        verdicts = [ok for ok, _ in detail_lines]
        mark = "?" if not verdicts else "x" if all(verdicts) else " "
        details = "; ".join(text for _, text in detail_lines) or "not judged: no width has the numbers it needs"
        return f"[{mark}] {title}: {details}"

    widths = sorted({m.width for m in results})
    lines = []
    for params, speedup in PKM_GOALS:
        checks = []
        for width in widths:
            lram_at, pkm_at = (measured(layer, width, params, "fwd_bwd") for layer in ("LRAM", "PKM"))
            if lram_at and pkm_at:
                ratio = pkm_at[0].fwd_bwd / lram_at[0].fwd_bwd
                checks.append((ratio >= speedup, f"w={width}: PKM/LRAM {ratio:.2f}"))
        lines.append(line(checks, f"LRAM at least {speedup:g}x faster than PKM at {format_params(params)} "
                                  f"parameters (forward + backward)"))
    flatness = []
    for width in widths:
        in_range = [m for m in measured("LRAM", width) if FLAT_RANGE[0] <= m.target <= FLAT_RANGE[1]]
        if len(in_range) >= 2:
            ratio = max(m.fwd for m in in_range) / min(m.fwd for m in in_range)
            span = f"{format_params(min(m.params for m in in_range))}..{format_params(max(m.params for m in in_range))}"
            flatness.append((ratio <= FLAT_MAX_RATIO, f"w={width} ({len(in_range)} sizes, {span}): {ratio:.2f}"))
    lines.append(line(flatness, f"LRAM nearly flat from {format_params(FLAT_RANGE[0])} to "
                                f"{format_params(FLAT_RANGE[1])} parameters: slowest/fastest size at a width <= "
                                f"{FLAT_MAX_RATIO:g} (forward; the range starts where the width's dense weights, "
                                f"5w^2, allow)"))
    bandwidth = []
    for width in widths:
        with_rows = measured("LRAM", width, attribute="lookup_gbps")
        if with_rows and hbm_gbps:
            largest = max(with_rows, key=lambda m: m.params)  # the largest table: its rows come from HBM
            fraction = largest.lookup_gbps / hbm_gbps
            bandwidth.append((fraction >= HBM_GOAL_FRACTION, f"w={width} {largest.memory}: {fraction:.2f}"))
    lines.append(line(bandwidth, f"LRAM's lookup reads its value rows at >= {HBM_GOAL_FRACTION:.0%} of the spec "
                                 f"HBM bandwidth (largest memory of a width)"))
    dense_widths = [w for w in widths if measured("dense MLP", w) and measured("LRAM", w)]
    if precision.startswith("fp32"):
        judged = [w for w in dense_widths if w <= DENSE_GOAL_MAX_WIDTH][-1:]  # the paper's 8192, or the widest below
        checks = []
        for width in judged:
            dense, slowest = measured("dense MLP", width)[0].fwd, max(m.fwd for m in measured("LRAM", width))
            checks.append((dense / slowest > 1, f"w={width}: dense/slowest LRAM {dense / slowest:.2f}"))
        lines.append(line(checks, f"LRAM faster than the fp32 dense MLP (TF32 off) at width {DENSE_GOAL_MAX_WIDTH} "
                                  f"or the widest measured below it (the paper's Table 4 crossover; forward)"))
    elif dense_widths:
        # dense time per token = 16 w^2 / F (two w x 4w matmuls); LRAM's grows as w (w/16 lookups): c w.
        # They cross at w* = c F / 16, with F and c measured at the widest width.
        width = dense_widths[-1]
        dense, lram_fwd = measured("dense MLP", width)[0].fwd, max(m.fwd for m in measured("LRAM", width))
        flops = 16 * width**2 / dense
        crossover = lram_fwd / width * flops / 16
        lines.append(f"[i] {precision} dense MLP against LRAM: at w={width} the dense MLP runs at "
                     f"{flops / 1e12:.0f} TFLOP/s ({dense * 1e6:.3g} µs per token) and LRAM takes "
                     f"{lram_fwd * 1e6:.3g} µs per token ({lram_fwd / width * 1e9:.3g} ns per width unit); "
                     f"LRAM would be faster from w = {lram_fwd / width:.3g} s x {flops:.3g} FLOP/s / 16 = "
                     f"{crossover:,.0f}")
    return lines


class CsvRows:
    """The CSV, one row written (and flushed) per measurement, so a run cut short keeps what it measured."""
    TIMES = {"fwd", "fwd_bwd", "fwd_bwd_reverse_index", "step_adam", "adam", "step_sparse", "sparse_adam", "lookup",
             "lookup_no_torus", "lookup_bwd"}

    def __init__(self, path, meta: dict, hbm_gbps):
        self.columns = [f.name for f in fields(Measurement)] + ["adam_share", "sparse_adam_share",
                                                                 "lookup_hbm_fraction"]
        self.meta, self.hbm_gbps = meta, hbm_gbps
        self.file = open(path, "w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(list(meta) + ["hbm_spec_gbps"] + [f"{c}_us_per_token" if c in self.TIMES else c
                                                               for c in self.columns])
        self.file.flush()

    def write(self, m: Measurement):
        values = {f.name: getattr(m, f.name) for f in fields(Measurement)}
        values |= {n: v * 1e6 for n, v in values.items() if n in self.TIMES and v is not None}
        values |= {"adam_share": m.adam_share, "sparse_adam_share": m.sparse_adam_share,
                   "lookup_hbm_fraction": None if m.lookup_gbps is None or self.hbm_gbps is None
                   else m.lookup_gbps / self.hbm_gbps}
        cells = ["" if values[c] is None else values[c] for c in self.columns]
        self.writer.writerow(list(self.meta.values()) + [self.hbm_gbps] + cells)
        self.file.flush()

    def close(self):
        self.file.close()


def plot(path, results, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted({m.width for m in results})
    colours = {w: plt.cm.viridis(i / max(len(widths) - 1, 1)) for i, w in enumerate(widths)}
    styles = {"dense MLP": dict(marker="*", markersize=10, linestyle="none"),
              "LRAM": dict(marker="o", linestyle="-"), "PKM": dict(marker="s", linestyle="--")}
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


def parse_widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"widths must be comma-separated integers, got {text!r}")
    if any(w <= 0 for w in widths):
        raise argparse.ArgumentTypeError(f"widths must be positive, got {text!r}")
    return widths


def parse_layers(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",")]
    unknown = [k for k in keys if k not in LAYERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown layers {unknown}; choose from {', '.join(LAYERS)}")
    return keys


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="cuda when available")
    parser.add_argument("--widths", type=parse_widths, default=parse_widths(DEFAULT_WIDTHS))
    parser.add_argument("--params", type=parse_params, default=parse_params(DEFAULT_PARAMS),
                        help="total-parameter targets of the memory layers, e.g. 2^20..2^28 or 2^20,2^24")
    parser.add_argument("--layers", type=parse_layers, default=list(LAYERS), help="comma-separated: dense,lram,pkm")
    parser.add_argument("--repeats", type=int, default=PAPER_REPEATS, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (at least 1: the first "
                                                              "optimiser step allocates its state)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per run (the paper's batch: 32 x 256)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="autocast as in languini.trainer; auto: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--hbm_gbps", type=float, default=None,
                        help="HBM bandwidth in GB/s for a GPU missing from the spec table")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 1 or args.tokens < 1:
        parser.error("--repeats, --warmup and --tokens must be at least 1")
    if "lram" in args.layers and any(w % 16 for w in args.widths):
        parser.error(f"LRAM needs widths that are multiples of 16 (16 inputs per head), got {args.widths}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; use --device cpu (reference paths, tiny sizes only)")

    on_gpu = device.type == "cuda"
    autocast, _, precision = precision_for(device, args.precision)
    if precision == "fp32":  # the paper's Table 4: fp32 matmuls, not TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    cpu_name = f"CPU ({platform.processor() or platform.machine()})"
    device_name = torch.cuda.get_device_name(device) if on_gpu else cpu_name
    hbm_gbps = (args.hbm_gbps or hbm_spec_gbps(device_name)) if on_gpu else None
    bench = Bench(device, autocast, None if on_gpu else False, args.tokens, args.repeats, args.warmup)
    meta = {"device": device_name, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": package_version("triton"),
            "precision": precision + (" (TF32 off)" if precision == "fp32" else ""),
            "tokens": args.tokens, "repeats": args.repeats, "warmup": args.warmup,
            "command": shlex.join(["python", "scripts/bench_memory_layers.py", *argv])}

    configs, unreachable = plan(args.layers, args.widths, args.params)
    print(f"# {device_name}: {len(configs)} configurations", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    # The precision is in the name so that an fp32 and a bf16 run can share one results folder.
    stem = args.out / f"memory_layers_{re.sub(r'[^a-z0-9]+', '-', device_name.lower()).strip('-')}_{precision}"
    rows = CsvRows(stem.with_suffix(".csv"), meta, hbm_gbps)
    try:
        results = run_all(configs, bench, on_result=rows.write)
    finally:
        rows.close()

    report = [f"# {device_name}, {precision}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}",
              f"# {meta['command']}",
              f"# times in µs per token: median of {args.repeats} runs of {args.tokens} tokens after "
              f"{args.warmup} warm-up runs" + ("" if on_gpu else "; CPU: PyTorch reference paths"),
              ""]
    report += results_table(results, hbm_gbps)
    report += ["", "Forward time per token by width (the layout of the paper's Table 4):"] + width_table(results)
    report += ["", "Notes:"]
    if args.repeats < PAPER_REPEATS:
        report.append(f"- fewer runs than the paper's median of {PAPER_REPEATS}")
    report.append("- params: the layer's total parameter count; each memory size stands for the --params target "
                  "within a factor sqrt(2) of it")
    report += [f"- {note}" for note in unreachable]
    report.append("- Adam / sparse opt: the optimiser's share of the step (sparse: Adam on the dense weights and "
                  "SparseAdam on the values)")
    report.append("- lookup / no torus / lookup+bwd: LRAM's theta alone on precomputed heads, the lookup alone on "
                  "precomputed lattice coordinates, theta forward + backward (kernel rows, µs per token); GB/s: the "
                  "value rows gathered (backward: twice, plus their fp32 gradients) over that time")
    report.append("- lookup GB/s: bytes of the value rows LRAM's theta gathers per run (tokens x heads x topk rows) "
                  "over the time of theta alone, on precomputed queries")
    if not on_gpu:
        report.append("- fwd+bwd rev-idx: the atomic and reverse-index value gradients differ only in the Triton "
                      "kernels, which the CPU run does not use")
    if on_gpu and hbm_gbps is None:
        report.append(f"- of HBM: n/a, no spec bandwidth for {device_name!r}; pass --hbm_gbps")
    elif on_gpu:
        report.append(f"- of HBM: lookup GB/s over the spec-sheet bandwidth {hbm_gbps:g} GB/s (not measured); "
                      "above 1 means the rows came from cache")
    else:
        report.append("- of HBM: n/a on CPU")
    report += ["", "Goals (issues 4 and 14):"]
    report += (evaluate_goals(results, hbm_gbps, meta["precision"]) if on_gpu
               else ["not judged: the goals are GPU goals and this ran on CPU"])

    print("\n".join(report))
    stem.with_suffix(".txt").write_text("\n".join(report) + "\n")
    plot(stem.with_suffix(".png"), results, f"{device_name}, {precision}, {args.tokens} tokens per run, "
                                            f"median of {args.repeats}")
    print(f"wrote {stem}.txt, .csv and .png")
    return results


if __name__ == "__main__":
    main()
