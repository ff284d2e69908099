"""Speed of the memory layers against the MLP they replace: Figure 3 and Table 4 of Goucher & Troll (LRAM).

Times these layers on random tokens x [1, tokens, w]:
- dense MLP: w -> 4w -> w with GELU;
- LRAM: projects.lram_gpt LRAMBlock (memory sub-network of section 3.1, value_dim 64, top-32), memory_size
  chosen to hit each total-parameter target;
- PKM: projects.pkm_gpt ProductKeyMemory as in the LRAM paper (8 heads, k_dim 64, knn 32, v_dim = w),
  n_keys chosen to hit each target; on a GPU with its fastest product-key search (the Triton kernels of
  languini/ops/product_keys), so that LRAM is compared with the best PKM this project can make;
  --pkm_search torch times the old path (torch.topk) instead (the command line in the CSV says which);
- PEER: projects.peer_gpt PEER as in its paper's isoFLOP study (He 2024, section 3.1: 8 heads, 16 experts per head,
  query width 128), n_keys (n_keys^2 experts of 2 w parameters) chosen to hit each target; the same product-key
  search (--pkm_search applies to it too) and its expert kernels. Its tables have no value-gradient variants (no
  reverse-index column); its sparse step makes both expert tables row-sparse.
- UltraMemV2: projects.ultramem_gpt UltraMemV2 with that project's defaults (Tucker rank 2, knn 32, k_dim and
  value_dim w / 4), n_keys (n_keys^2 values and pre-values of w / 4 each) chosen to hit each target; its own
  search (the candidate grid's top-k kernel) and value kernels; its sparse step makes both value tables row-sparse.
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

Writes under --out memory_layers_<device>_<precision>.csv, one row per layer and size (with the device, date,
torch and triton versions and the command line), each row as soon as it is measured, so a run cut short keeps
what it measured. Then it reports that CSV as scripts/report_memory_layers.py does: the tables and the facts the
goals in projects/lram_gpt/README.md are read against, printed and written to .txt, and the plot (.png).
Every run starts from fresh random inputs after an L2 flush (GPU). --precision fp32 turns TF32 off (the paper's
Table 4 conditions).

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from languini import timing
from languini.flags import Parser
from languini.hardware import device_spec
from languini.trainer import precision_for
from projects.lram_gpt.memory import LRAMBlock, theta
from projects.lram_gpt.ops.lookup.naive import interpolate, torus_query
from projects.peer_gpt.peer import PAPER_PEER, PEER
from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, ProductKeyMemory
from projects.ultramem_gpt.ultramem import UltraMemV2

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report_memory_layers  # noqa: E402  (a sibling script, not a package)
from report_memory_layers import Measurement  # noqa: E402

PAPER_REPEATS = report_memory_layers.PAPER_REPEATS
DEFAULT_WIDTHS = "512,768,2048,3072,4096,6144,8192,12288"  # Figure 3's and Table 4's widths, and the model's 768
DEFAULT_PARAMS = "2^20..2^30"
TARGET_TOLERANCE_OCTAVES = 0.5  # a memory size counts for a target within a factor sqrt(2) of it
LEARNING_RATE = 1e-4  # the paper's rate for dense weights; the step time does not depend on it

L2_FLUSH_BYTES = 256 * 2**20  # more than any GPU's L2 (H100: 50 MiB), written between timed runs


# ---------------------------------------------------------------- the layers


@dataclass(frozen=True)
class Layer:
    """How to build one layer kind; sizes (ascending) are the memory sizes it may use, empty for the MLP.

    A memory layer's build(width, size, use_triton, triton_search=None, sparse_values=False, **options) returns
    the layer on the default device: use_triton for its kernels, triton_search (product-key layers) for the search
    alone, sparse_values for row-sparse gradients of its tables (`tables(layer)`, stepped by SparseAdam), and
    value_grad ("atomic" or "segment") where value_grads says it has both reductions.
    """
    name: str
    build: Callable[..., nn.Module]
    sizes: Sequence[int] = ()
    size_label: Callable[[int], str] = str
    value_grads: bool = False  # the atomic and the reverse-index ("segment") value gradient (Triton kernels)
    product_key_search: bool = False  # searches product keys: --pkm_search picks its path
    tables: Callable[[nn.Module], list] = lambda layer: layer.value_parameters()  # the row-sparse ones

    @property
    def is_memory(self) -> bool:
        return bool(self.sizes)


def dense_mlp(width, size=None):
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


def lram(width, memory_size, **options):
    return LRAMBlock(width, memory_size=memory_size, **options)


def pkm(width, n_keys, use_triton=None, triton_search=None, **options):
    layer = ProductKeyMemory.from_config(width, replace(LRAM_PAPER_PKM, n_keys=n_keys, **options), use_triton)
    if triton_search is not None:
        layer.triton_search = triton_search
    return layer


def peer(width, n_keys, use_triton=None, triton_search=None, sparse_values=False):
    return PEER(width, heads=PAPER_PEER.heads, k_dim=PAPER_PEER.k_dim, n_keys=n_keys, knn=PAPER_PEER.knn,
                use_triton=use_triton, sparse_experts=sparse_values, triton_search=triton_search)


def ultramem(width, n_keys, use_triton=None, sparse_values=False):
    return UltraMemV2(width, n_keys=n_keys, use_triton=use_triton, sparse_values=sparse_values)


# One entry per layer kind; a new memory layer is one more entry: its build function as above, its sizes (ascending,
# the parameter count rising with them) and label, and which of the options it has.
LAYERS = {
    "dense": Layer("dense MLP", dense_mlp),
    "lram": Layer("LRAM", lram, sizes=tuple(2**e for e in range(8, 41)),
                  size_label=lambda n: f"N=2^{n.bit_length() - 1}", value_grads=True),
    "pkm": Layer("PKM", pkm, sizes=range(32, 2**17), size_label=lambda n: f"n_keys={n}", value_grads=True,
                 product_key_search=True),
    "peer": Layer("PEER", peer, sizes=range(PAPER_PEER.knn, 2**15), size_label=lambda n: f"n_keys={n}",
                  product_key_search=True, tables=lambda layer: layer.expert_parameters()),
    "ultramem": Layer("UltraMemV2", ultramem, sizes=range(32, 2**15), size_label=lambda n: f"n_keys={n}"),
}


def make(layer_key: str, width: int, size: int | None, use_triton: bool | None = False, pkm_search: str = "auto",
         **options) -> nn.Module:
    """The layer on the current default device; memory layers with both value gradients get the atomic one unless
    told otherwise. pkm_search: "auto" (the Triton search with the Triton kernels), "triton" or "torch"
    (torch.topk), for the layers that search product keys."""
    layer = LAYERS[layer_key]
    if not layer.is_memory:
        return layer.build(width, size)
    if layer.product_key_search and pkm_search != "auto":
        options["triton_search"] = pkm_search == "triton"
    if layer.value_grads:
        options = dict(value_grad="atomic") | options
    return layer.build(width, size, use_triton=use_triton, **options)


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
    pkm_search: str  # "auto", "triton" or "torch": see make()
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
        module = make(layer_key, width, size, bench.use_triton, bench.pkm_search).to(bench.device)
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
        if layer.value_grads and bench.use_triton is not False:
            stage = "reverse-index backward"
            module = make(layer_key, width, size, bench.use_triton, bench.pkm_search,
                          value_grad="segment").to(bench.device)
            runs = time_phases(training_run(module, x, grad, [], bench), bench, [x])
            m.fwd_bwd_reverse_index = median_per_token([r[0] for r in runs], bench)
            del module
            release(bench.device)
        if layer.is_memory:
            stage = "step with SparseAdam"
            module = make(layer_key, width, size, bench.use_triton, bench.pkm_search,
                          sparse_values=True).to(bench.device)
            tables = layer.tables(module)
            optimizers = [torch.optim.Adam([p for p in module.parameters() if all(p is not t for t in tables)],
                                           lr=LEARNING_RATE, fused=bench.device.type == "cuda"),
                          torch.optim.SparseAdam(tables, lr=LEARNING_RATE)]
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


# ---------------------------------------------------------------- the CSV


def hbm_spec_gbps(device_name: str) -> float | None:
    """The device's spec HBM bandwidth in GB/s from languini.hardware's table; None where it records none."""
    spec = device_spec(device_name)
    return spec.hbm_bytes_per_second / 1e9 if spec and spec.hbm_bytes_per_second else None


format_params = report_memory_layers.format_params


class CsvRows:
    """The CSV, one row written (and flushed) per measurement, so a run cut short keeps what it measured."""

    def __init__(self, path, meta: dict, hbm_gbps):
        self.meta, self.hbm_gbps = meta, hbm_gbps
        self.file = open(path, "w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(report_memory_layers.csv_header())
        self.file.flush()

    def write(self, m: Measurement):
        self.writer.writerow(report_memory_layers.csv_cells(self.meta, self.hbm_gbps, m))
        self.file.flush()

    def close(self):
        self.file.close()


# ---------------------------------------------------------------- command line


parse_params = report_memory_layers.parse_params


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
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="cuda when available")
    parser.add_argument("--widths", type=parse_widths, default=parse_widths(DEFAULT_WIDTHS))
    parser.add_argument("--params", type=parse_params, default=parse_params(DEFAULT_PARAMS),
                        help="total-parameter targets of the memory layers, e.g. 2^20..2^28 or 2^20,2^24")
    parser.add_argument("--layers", type=parse_layers, default=list(LAYERS),
                        help=f"comma-separated, of {','.join(LAYERS)} (default: all)")
    parser.add_argument("--repeats", type=int, default=PAPER_REPEATS, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (at least 1: the first "
                                                              "optimiser step allocates its state)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per run (the paper's batch: 32 x 256)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="autocast as in languini.trainer; auto: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--hbm_gbps", type=float, default=None,
                        help="HBM bandwidth in GB/s for a GPU missing from the spec table")
    parser.add_argument("--pkm_search", choices=["triton", "torch"], default=None,
                        help="PKM's and PEER's product-key search: the Triton kernels (default on a GPU) or "
                             "torch.topk (the old path, slower; on CPU the default)")
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
    bench = Bench(device, autocast, None if on_gpu else False, args.pkm_search or "auto", args.tokens, args.repeats,
                  args.warmup)
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

    print(flush=True)
    report_memory_layers.write_report(report_memory_layers.read_csv(stem.with_suffix(".csv")), args.out,
                                      extra_notes=unreachable)
    return results


if __name__ == "__main__":
    main()
