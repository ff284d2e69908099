"""Measure a model's training throughput: a registry row for compute classes.

    python scripts/measure_throughput.py gpt small --sweep                  # best over batch sizes
    python scripts/measure_throughput.py gpt small --batch_size 32          # one batch size
    python scripts/measure_throughput.py gpt cpu --vocab_size 16384 --batch_size 16 --registry runs/throughput.csv
    python scripts/measure_throughput.py lram_gpt small --sweep --derive "RTX 3090" --baseline gpt:small

Takes the model flags of the project's train.py (each overrides that field of the named config), so the
row is of the model a run trains; the row records the model's fingerprint and those flags. Times full
training steps of an untrained model on random tokens (forward, backward, Adam step, mixed precision),
reports the median tokens/s after warm-up and the peak memory, prints forward FLOPs at batch 1 and MFU.
The step timed is the trainer's own: --grad_clip and --micro_batches (train.py's flags, with its defaults)
make it the step of a run that sets them; with micro-batches the sweep grows the micro-batch. --hebbian_softmax
true (with --hebbian_limit, --hebbian_min_mix) times the step with the Hebbian Softmax: a row of its own, as a run
with it is charged at its own throughput.
With --registry the `measured` row is appended to that CSV (projects/<project>/throughput.csv is the one
training reads); without it the row is printed, to be added by hand once checked. A row whose timed steps spread
over more than half their median (a busy machine) is not written (--force true writes it) and is printed with a
warning. On a CPU only CPU-sized
configs are timed (--paper_config_on_cpu true for others), and the row goes to runs/throughput.csv, which
train.py reads first on this machine, not to a project's committed registry (--cpu_row_in_project true).

--derive HARDWARE --baseline PROJECT:CONFIG gives a row for hardware one does not have: it measures the
baseline too, in the same run on the same device, and derives this model's row on HARDWARE as the
baseline's published row there times the ratio of the two measured throughputs (source `derived`, the
note names its sources). One accelerator only, as in the Languini paper; on CPU it works for tiny
configs and labels the row `cpu`.
"""

import argparse
import dataclasses
import importlib
import importlib.metadata
import shlex
import sys
from pathlib import Path

import torch

from languini import flops, hebbian, throughput
from languini.flags import Parser, add_dataclass_flags, overrides, parse_bool
from languini.measure import Measurement, measure_batch_size, measured_row
from languini.plan import BUSY_SPREAD, cpu_sized
from languini.trainer import TrainConfig, precision_for

MIN_TIMED_STEPS = 10
PROJECTS = Path(__file__).resolve().parents[1] / "projects"


def load_configs(project: str):
    """projects/<project>/configs.py, or SystemExit naming what is missing."""
    return _import(project, "configs")


def _import(project: str, name: str):
    module_name = f"projects.{project}.{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name not in (module_name, f"projects.{project}"):
            raise
        raise SystemExit(f"no module {module_name}: is {project!r} a project under projects/?") from error


def load_project(project: str, config: str, model_overrides: dict | None = None, step_settings: dict | None = None):
    """The project's Model class, the model config (the named one with `model_overrides`) and its ModelSpec
    (trained with `step_settings`, languini.hebbian.settings)."""
    configs = load_configs(project)
    model_module = _import(project, "model")
    if config not in configs.SIZES:
        raise SystemExit(f"{project} has no config {config!r}; choose one of {sorted(configs.SIZES)}")
    model_config = dataclasses.replace(configs.SIZES[config], **(model_overrides or {}))
    return model_module.Model, model_config, throughput.model_spec(project, config, model_config, step_settings)


SLOWER_IN_A_ROW = 2  # on a CPU the sweep stops once this many larger batches in a row are slower than the best


def sweep_batch_sizes(measure, max_batch_size: int, stop_when_slower: bool,
                      min_batch_size: int = 1) -> list[Measurement]:
    """Double the batch size from min_batch_size until out of memory, then bisect towards the largest batch that
    fits.

    On CPU nothing runs out of memory before the machine swaps, so `stop_when_slower` also ends the doubling
    once SLOWER_IN_A_ROW larger batches in a row are slower than the best so far (one noisy measurement does not
    end it).
    """
    results = {}
    batch_size, largest_fit, smallest_oom, slower = min_batch_size, None, None, 0
    while batch_size <= max_batch_size:
        result = results[batch_size] = measure(batch_size)
        if result.tokens_per_second is None:
            smallest_oom = batch_size
            break
        best = max((r.tokens_per_second for r in results.values() if r.tokens_per_second is not None))
        slower = slower + 1 if stop_when_slower and result.tokens_per_second < best else 0
        largest_fit = batch_size
        if slower >= SLOWER_IN_A_ROW:
            break
        batch_size *= 2
    if largest_fit is None:
        raise SystemExit(f"out of memory at batch size {min_batch_size}: this config does not fit on this device "
                         "at the sweep's smallest batch")
    while smallest_oom is not None and smallest_oom - largest_fit > 1:
        middle = (largest_fit + smallest_oom) // 2
        result = results[middle] = measure(middle)
        if result.tokens_per_second is None:
            smallest_oom = middle
        else:
            largest_fit = middle
    return [results[b] for b in sorted(results)]


def format_measurement(m: Measurement) -> str:
    if m.tokens_per_second is None:
        return f"{m.batch_size:>10}  {'out of memory':>12}"
    memory = "n/a" if m.peak_memory_gib is None else f"{m.peak_memory_gib:.2f}"
    return f"{m.batch_size:>10}  {m.tokens_per_second:>12,.0f}  {m.step_seconds * 1000:>9.1f}  {memory:>9}"


def optional_float(text: str) -> float | None:
    """A float flag where None (as train.py's flags read it) means off."""
    return None if text.strip().lower() == "none" else float(text)


def build_parser(configs=None, first_pass: bool = False) -> argparse.ArgumentParser:
    """The script's flags and, given a project's configs module, its model flags as train.py has them.

    The first pass only finds the project (whose model flags are not known yet).
    """
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     add_help=not first_pass)
    optional = {"nargs": "?"} if first_pass else {}
    parser.add_argument("project", help="package name under projects/, e.g. gpt", **optional)
    parser.add_argument("config", help="a name in the project's configs.SIZES, e.g. small", **optional)
    batch = parser.add_mutually_exclusive_group(required=not first_pass)
    batch.add_argument("--batch_size", type=int, help="measure this batch size only")
    batch.add_argument("--sweep", action="store_true", help="grow the batch until out of memory and keep the best")
    parser.add_argument("--registry", help="registry CSV to append the row to (training reads "
                                           "projects/<project>/throughput.csv); without it the row is printed")
    parser.add_argument("--steps", type=int, default=20, help=f"timed steps, at least {MIN_TIMED_STEPS} (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before timing (default 5)")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                        help="auto: bf16 autocast where supported, fp16 + loss scaling on older GPUs, fp32 on CPU")
    parser.add_argument("--compile", type=parse_bool, default=False, help="time the torch.compile'd model (true/false)")
    parser.add_argument("--grad_clip", type=optional_float,
                        default=TrainConfig.grad_clip, help="max gradient norm, as train.py's --grad_clip; None "
                        f"disables clipping (default {TrainConfig.grad_clip})")
    parser.add_argument("--micro_batches", type=int, default=TrainConfig.micro_batches,
                        help="gradient-accumulation steps, as train.py's --micro_batches; the batch size is the "
                             f"global batch (default {TrainConfig.micro_batches})")
    parser.add_argument("--hebbian_softmax", type=parse_bool, default=False,
                        help="time the step with the Hebbian Softmax, as train.py's flag (true/false)")
    parser.add_argument("--hebbian_limit", type=int, default=TrainConfig.hebbian_limit,
                        help=f"as train.py's (default {TrainConfig.hebbian_limit})")
    parser.add_argument("--hebbian_min_mix", type=float, default=TrainConfig.hebbian_min_mix,
                        help=f"as train.py's (default {TrainConfig.hebbian_min_mix})")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max_batch_size", type=int, default=4096, help="largest batch size the sweep tries")
    parser.add_argument("--min_batch_size", type=int, default=1,
                        help="batch size the sweep starts from (doubling; default 1): spares a slow model's small "
                             "batches, which a GPU never trains at best")
    parser.add_argument("--paper_config_on_cpu", type=parse_bool, default=False,
                        help="time a config that is not CPU-sized ('cpu', '*_cpu') on a CPU: minutes per step for "
                             "the paper's sizes, and a row no compute class uses (true/false; default false)")
    parser.add_argument("--cpu_row_in_project", type=parse_bool, default=False,
                        help="let a CPU row go into a project's committed registry (projects/<p>/throughput.csv), "
                             "whose cpu rows set the steps of every clone's CPU runs; by default a CPU row goes "
                             "only to another file, e.g. runs/throughput.csv, which train.py reads on this machine "
                             "(true/false; default false)")
    parser.add_argument("--force", type=parse_bool, default=False,
                        help=f"write the row to --registry even when the timed steps spread over more than "
                             f"{BUSY_SPREAD:.0%} of their median, the sign of a busy machine (true/false; default "
                             "false)")
    parser.add_argument("--derive", metavar="HARDWARE",
                        help="also derive a row for this reference hardware by ratio to --baseline (e.g. 'RTX 3090')")
    parser.add_argument("--baseline", metavar="PROJECT:CONFIG",
                        help="with --derive: an unmodified config with a row on that hardware, e.g. gpt:small")
    if configs is not None:
        add_dataclass_flags(parser, configs.ModelConfig, "model (each overrides that field of the config, as in "
                            "the project's train.py)", defaults="defaults: those of the config named")
    elif not first_pass:
        parser.add_argument_group("model", "the model flags of the project's train.py, each overriding that field of "
                                           "the config: `python scripts/measure_throughput.py PROJECT --help` lists "
                                           "them")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    # The model flags depend on the project, so the project is read first.
    known, _ = build_parser(first_pass=True).parse_known_args(argv)
    parser = build_parser(load_configs(known.project) if known.project else None)
    args = parser.parse_args(argv)
    if args.steps < MIN_TIMED_STEPS:
        parser.error(f"--steps must be at least {MIN_TIMED_STEPS} so the median is stable")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step allocates and autotunes)")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch_size must be positive")
    if not 1 <= args.min_batch_size <= args.max_batch_size:
        parser.error(f"--min_batch_size must lie in 1..--max_batch_size ({args.max_batch_size})")
    if args.micro_batches < 1:
        parser.error("--micro_batches must be at least 1")
    if args.batch_size is not None and args.batch_size % args.micro_batches:
        parser.error(f"--batch_size {args.batch_size} is not divisible into {args.micro_batches} micro-batches")
    if (args.derive is None) != (args.baseline is None):
        parser.error("--derive and --baseline go together: --derive 'RTX 3090' --baseline gpt:small")
    if args.baseline is not None and args.baseline.count(":") != 1:
        parser.error(f"--baseline is PROJECT:CONFIG, e.g. gpt:small; got {args.baseline!r}")
    if torch.device(args.device).type == "cpu":
        if not cpu_sized(args.config) and not args.paper_config_on_cpu:
            parser.error(f"'{args.config}' is a paper config: on a CPU a step takes minutes and no compute class "
                         "uses the row. Time it on a GPU, time a CPU-sized config ('cpu' or '*_cpu'), or pass "
                         "--paper_config_on_cpu true.")
        if args.registry is not None and in_project_registry(args.registry) and not args.cpu_row_in_project:
            parser.error(f"--registry {args.registry} is a project's committed registry: its cpu rows set the steps "
                         "of every clone's CPU runs. Keep this machine's row in runs/throughput.csv (train.py reads "
                         "it here first), or pass --cpu_row_in_project true to commit a row timed on an idle CPU.")
    return args


def in_project_registry(path: str) -> bool:
    """Whether `path` is a project's committed registry, projects/<p>/throughput.csv."""
    resolved = Path(path).resolve()
    return resolved.name == "throughput.csv" and resolved.parent.parent == PROJECTS.resolve()


def run_note(args: argparse.Namespace, n_fitted: int, argv) -> str:
    """The registry row's note: what was measured, the Triton version and the command that measured it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        triton = f"triton {importlib.metadata.version('triton')}"
    except importlib.metadata.PackageNotFoundError:
        triton = "no triton"
    measured = f"best of {n_fitted} batch sizes" if args.sweep else "fixed batch size"
    return f"{measured}; {triton}; {shlex.join(['python', 'scripts/measure_throughput.py', *argv])}"


def refuse_multiple_gpus(device: torch.device) -> None:
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if count > 1:
        raise SystemExit(
            f"{count} GPUs are visible. Throughput is measured on a single accelerator, as in the Languini "
            "paper: a compute class is time on one reference device, and this script only ever uses one. "
            "Choose one GPU, e.g. CUDA_VISIBLE_DEVICES=0 python scripts/measure_throughput.py ..."
        )


def measure_model(project: str, config: str, model_overrides: dict, args: argparse.Namespace,
                  device: torch.device, precision: str, with_hebbian: bool = False):
    """Time one model at one batch size or over the sweep (with_hebbian: with args' Hebbian Softmax); prints its
    table, FLOPs and MFU.

    Returns its ModelSpec, its sequence length, the best Measurement and how many batch sizes fitted.
    """
    train_config = TrainConfig(precision=precision, compile=args.compile, grad_clip=args.grad_clip,
                               micro_batches=args.micro_batches, hebbian_softmax=with_hebbian,
                               hebbian_limit=args.hebbian_limit, hebbian_min_mix=args.hebbian_min_mix)
    model_class, model_config, spec = load_project(project, config, model_overrides, hebbian.settings(train_config))
    torch.manual_seed(0)
    model = model_class(model_config).to(device).train()
    hardware = throughput.local_device_name(device)
    seq_len = model_config.seq_len
    flops_per_forward = flops.forward_flops(model, seq_len, model_config.vocab_size, device)

    print(f"{spec} on {hardware}: seq_len {seq_len}, {precision}, "
          f"{'compiled' if args.compile else 'eager'}, torch {torch.__version__}; "
          f"{args.micro_batches} micro-batch{'es' if args.micro_batches > 1 else ''}, grad_clip {args.grad_clip}"
          f"{', Hebbian Softmax' if with_hebbian else ''}; "
          f"median of {args.steps} steps after {args.warmup} warm-up steps")
    print(f"{'batch size':>10}  {'tokens/s':>12}  {'step ms':>9}  {'peak GiB':>9}")

    def measure(batch_size: int) -> Measurement:
        result = measure_batch_size(model, model_config, batch_size, device, train_config, args.steps, args.warmup)
        print(format_measurement(result), flush=True)
        return result

    if args.sweep:  # over the micro-batch: the global batch is micro_batches of it
        micro = args.micro_batches
        results = sweep_batch_sizes(lambda b: measure(b * micro), args.max_batch_size // micro,
                                    stop_when_slower=device.type != "cuda",
                                    min_batch_size=max(1, args.min_batch_size // micro))
    else:
        results = [measure(args.batch_size)]
    fitted = [r for r in results if r.tokens_per_second is not None]
    if not fitted:
        raise SystemExit(f"out of memory at batch size {args.batch_size}")
    best = max(fitted, key=lambda r: r.tokens_per_second)

    memory = "n/a" if best.peak_memory_gib is None else f"{best.peak_memory_gib:.2f} GiB"
    print(f"best: batch size {best.batch_size}, {best.tokens_per_second:,.0f} tokens/s, peak memory {memory}")
    peak = flops.device_peak(hardware)
    if peak is None:
        utilisation = f"MFU n/a (no spec peak FLOP/s for {hardware!r})"
    else:
        value = flops.mfu(flops_per_forward, seq_len, best.tokens_per_second, peak.flops_per_second)
        utilisation = f"MFU {value:.1%} of {peak.flops_per_second / 1e12:g} TFLOP/s ({peak.precision} {peak.source})"
    print(f"forward FLOPs at batch 1: {flops_per_forward:,} ({flops_per_forward / 1e9:.3f} GFLOPs); {utilisation}")
    return spec, seq_len, best, len(fitted)


def baseline_reference(args: argparse.Namespace) -> throughput.ThroughputRow:
    """The --baseline's row on the --derive hardware; SystemExit when it has none."""
    project, config = args.baseline.split(":")
    load_project(project, config)  # a wrong name fails here, before anything is timed
    try:
        return throughput.lookup(throughput.registry_path(project), throughput.model_spec(project, config),
                                 args.derive, args.compile)
    except (throughput.ThroughputNotFoundError, ValueError) as error:
        raise SystemExit(f"--baseline {args.baseline} cannot anchor --derive {args.derive!r}: {error}") from error


def main(argv=None) -> list[throughput.ThroughputRow]:
    """Measure, derive if asked, and append the rows to --registry (else print them); returns the rows."""
    args = parse_args(argv)
    device = torch.device(args.device)
    refuse_multiple_gpus(device)
    try:
        precision = precision_for(device, args.precision)[2]
    except ValueError as error:
        raise SystemExit(str(error)) from error
    reference = baseline_reference(args) if args.derive else None
    model_overrides = overrides(args, load_configs(args.project).ModelConfig)
    spec, seq_len, best, n_fitted = measure_model(args.project, args.config, model_overrides, args, device, precision,
                                                  args.hebbian_softmax)
    hardware = throughput.local_device_name(device)
    row = measured_row(spec, hardware, best, seq_len, precision, args.compile,
                       run_note(args, n_fitted, argv))
    rows, measured = [row], [(f"{spec.project} {spec.config}", best)]
    if reference is not None:
        base_project, base_config = args.baseline.split(":")
        print()
        _, _, base, _ = measure_model(base_project, base_config, {}, args, device, precision)
        measured.append((args.baseline, base))
        ratio = best.tokens_per_second / base.tokens_per_second
        derived = dataclasses.replace(
            row, hardware=reference.hardware, tokens_per_second=reference.tokens_per_second * ratio,
            peak_memory_gib=None, source="derived",
            note=f"derived: {reference.tokens_per_second:,.0f} tokens/s of {base_project} {base_config} "
                 f"({reference.source}, {reference.hardware}) x {ratio:.4f} = {best.tokens_per_second:,.0f} / "
                 f"{base.tokens_per_second:,.0f} tokens/s of this model / {base_project} {base_config}, both "
                 f"measured in this run on {hardware}; {run_note(args, n_fitted, argv)}")
        print(f"\nderived for {reference.hardware}: {reference.tokens_per_second:,.0f} x {ratio:.4f} = "
              f"{derived.tokens_per_second:,.0f} tokens/s (assumes the ratio measured on {hardware} holds there)")
        rows.append(derived)
    busy = [(what, m.spread) for what, m in measured if m.spread is not None and m.spread > BUSY_SPREAD]
    if busy:
        said = "; ".join(f"{what}'s steps spread over {spread:.0%} of their median" for what, spread in busy)
        advice = (f"This machine looked busy ({said}; more than {BUSY_SPREAD:.0%}), so the tokens/s may be far "
                  "below what it gives when idle. Measure again on an idle machine (nothing else running: `top`, "
                  "`nvidia-smi`), or with more --steps")
        if args.registry and not args.force:
            raise SystemExit(f"Not written to {args.registry}. {advice}; --force true writes it anyway.")
        print(f"\nWarning: {advice}.")
    if args.registry:
        for new in rows:
            throughput.append_row(args.registry, new)
        print(f"appended {len(rows)} row{'s' if len(rows) > 1 else ''} to {args.registry}")
    else:
        print(f"\nNot saved (no --registry). Training reads {throughput.display_path(throughput.registry_path(args.project))}; "
              f"once checked, add to it:\n{throughput.csv_text(rows, header=False)}", end="")
    return rows


if __name__ == "__main__":
    main()
