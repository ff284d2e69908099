"""Compute classes: a training budget given as time on the reference hardware.

A compute class of h hours allows T = 3600 * h * v tokens, where v is the model
config's throughput (tokens/s) on the reference hardware (Languini paper, section 3.1).
The number of optimiser steps is T / (global batch size * sequence length), rounded to
the nearest integer: the step counts the authors published with their GPT configs (18,265 / 36,529 /
36,529 / 21,908 / 43,817 for 6h..96h, in the official code's languini/projects/gpt/README.md) are all
nearest-rounded, not floored.
"""

import dataclasses
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from languini import flops, throughput
from languini.stages import Schedule, Stage, steps_for_budget

PAPER_COMPUTE_CLASSES = ("6h", "12h", "24h", "48h", "96h")
DEFAULT_REFERENCE_HARDWARE = "RTX 3090"

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh])")
_ACCEPTED_FORMS = (
    "a duration <number><unit> with unit s, m or h (e.g. 90s, 15m, 2h, 1.5h), "
    f"such as the paper's classes {', '.join(PAPER_COMPUTE_CLASSES)}"
)


def compute_class_seconds(name: str) -> float:
    """Seconds of reference-hardware time in a compute class such as '6h', '15m', '90s' or '1.5h'."""
    match = _DURATION.fullmatch(name.strip().lower()) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"compute class {name!r} not understood; write {_ACCEPTED_FORMS}")
    # Fraction keeps decimal durations exact: 0.1h is 360 s, not 360.00000000000006.
    seconds = Fraction(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"compute class {name!r} is empty; write {_ACCEPTED_FORMS}")
    return float(seconds)


def training_steps(seconds: float, tokens_per_second: float, global_batch_size: int, seq_len: int) -> int:
    """Optimiser steps that spend `seconds` of reference time: round(seconds * v / (batch * seq_len)).

    Raises ValueError when the budget does not cover a single batch.
    """
    if not tokens_per_second > 0:  # also refuses NaN
        raise ValueError(f"tokens_per_second must be positive, got {tokens_per_second}")
    if global_batch_size <= 0 or seq_len <= 0:
        raise ValueError(f"global batch size and seq_len must be positive, got {global_batch_size} and {seq_len}")
    tokens_per_step = global_batch_size * seq_len
    exact_steps = Fraction(seconds) * Fraction(tokens_per_second) / tokens_per_step
    steps = math.floor(exact_steps + Fraction(1, 2))  # round half up, exactly
    if steps < 1:
        raise ValueError(
            f"{seconds:g} s at {tokens_per_second:,.0f} tokens/s is {float(exact_steps):.3f} batches of "
            f"{global_batch_size} x {seq_len} tokens; choose a longer compute class or a smaller batch"
        )
    return steps


# A forward pass costs a third of a training step (the paper's FLOPs convention: backward = 2 forwards), so
# evaluation is planned at three times the training throughput.
EVAL_SPEEDUP = 3


@dataclass(frozen=True)
class EvalWork:
    """Token positions the model reads in evaluation (forward passes, padding included), from the eval settings."""

    each_during_training: int  # one fast evaluation during training (capped by --eval_every_max_batches)
    evaluations_during_training: int
    final: int  # fast and slow evaluation of every held-out split at the end

    @property
    def during_training(self) -> int:
        return self.each_during_training * self.evaluations_during_training


@dataclass(frozen=True)
class PlannedStage:
    """One sequence-length stage of a plan (languini.stages): its length, steps and reference throughput."""

    seq_len: int
    fraction: float  # of the run's tokens
    steps: int
    tokens_per_second: float
    throughput_row: throughput.ThroughputRow | None  # None when given by --tokens_per_second


@dataclass(frozen=True)
class TrainingPlan:
    """What a compute class buys for one model; derived quantities are properties."""

    model: throughput.ModelSpec
    compute_class: str
    reference_hardware: str
    tokens_per_second: float
    throughput_row: throughput.ThroughputRow | None  # None when given by --tokens_per_second
    global_batch_size: int
    seq_len: int
    steps: int
    flops_per_forward: float | None = None  # forward FLOPs of one sequence at batch 1
    local_hardware: str | None = None
    local_row: throughput.ThroughputRow | None = None  # the registry row of one local device
    local_devices: int = 1
    evaluation: EvalWork | None = None
    compiled: bool = False
    stages: tuple[PlannedStage, ...] | None = None  # --stages; then tokens_per_second is their average

    def schedule(self) -> Schedule:
        """The step-by-step lengths and throughputs the trainer follows."""
        if self.stages is None:
            return Schedule.single(self.seq_len, self.steps, self.tokens_per_second)
        return Schedule(tuple(s.seq_len for s in self.stages), tuple(s.steps for s in self.stages),
                               tuple(s.tokens_per_second for s in self.stages))

    @property
    def throughput_source(self) -> str:
        return "--tokens_per_second" if self.throughput_row is None else self.throughput_row.source

    @property
    def tokens(self) -> int:
        return self.schedule().tokens(self.steps, self.global_batch_size)

    @property
    def accelerator_seconds(self) -> float:
        return self.schedule().accelerator_seconds(self.steps, self.global_batch_size)

    @property
    def accelerator_hours(self) -> float:
        return self.accelerator_seconds / 3600

    @property
    def total_flops(self) -> float | None:
        """3 x forward FLOPs per sequence x sequences trained (backward counted as 2 forwards)."""
        if self.flops_per_forward is None:
            return None
        return flops.train_flops_per_token(self.flops_per_forward, self.seq_len) * self.tokens

    @property
    def local_tokens_per_second(self) -> float | None:
        """Training throughput of all local devices together, assuming linear data-parallel scaling."""
        return None if self.local_row is None else self.local_row.tokens_per_second * self.local_devices

    @property
    def expected_wall_seconds(self) -> float | None:
        """Training wall time on the local devices at their registry throughput (evaluation not included)."""
        if self.local_row is not None and self.stages is not None:  # then every stage's row is a local one
            return sum(s.steps * self.global_batch_size * s.seq_len / (s.tokens_per_second * self.local_devices)
                       for s in self.stages)
        return None if self.local_row is None else self.tokens / self.local_tokens_per_second

    def expected_eval_seconds(self, positions: int) -> float | None:
        """Wall time of evaluating `positions` token positions locally, at EVAL_SPEEDUP x training throughput."""
        return None if self.local_row is None else positions / (EVAL_SPEEDUP * self.local_tokens_per_second)


def plan_training(
    model: throughput.ModelSpec,
    compute_class: str,
    global_batch_size: int,
    seq_len: int,
    registry: Path | str | None = None,
    reference_hardware: str = DEFAULT_REFERENCE_HARDWARE,
    tokens_per_second: float | None = None,
    flops_per_forward: float | None = None,
    local_hardware: str | None = None,
    local_devices: int = 1,
    evaluation: EvalWork | None = None,
    compiled: bool = False,
    row: throughput.ThroughputRow | None = None,
    stage_models: list[tuple[Stage, throughput.ModelSpec, throughput.ThroughputRow | None]] | None = None,
) -> TrainingPlan:
    """Plan a run of `model`: throughput from `tokens_per_second` if given, else from `row` (measured for
    this run on the reference hardware), else from the registry row of that very model (throughput.lookup)
    on the reference hardware, eager or compiled as the run is.

    `registry` defaults to projects/<project>/throughput.csv. Raises
    throughput.ThroughputNotFoundError (naming the measuring command) when no row matches.

    stage_models (--stages): each stage with the model at its length (the model's config at that seq_len) and a
    row measured for this run or None; each stage's throughput is found as above, and the budget is split as
    languini.steps_for_budget says.
    """
    if stage_models is not None:
        return _plan_stages(model, compute_class, global_batch_size, seq_len, registry, reference_hardware,
                            tokens_per_second, flops_per_forward, local_hardware, local_devices, evaluation, compiled,
                            stage_models)
    registry = throughput.registry_path(model.project) if registry is None else Path(registry)
    if tokens_per_second is not None:
        row = None
    elif row is None:
        row = throughput.lookup(registry, model, reference_hardware, compiled)
    if row is not None:
        tokens_per_second = row.tokens_per_second
    seconds = compute_class_seconds(compute_class)
    local_row = None
    if row is not None and local_hardware is not None and throughput.hardware_matches(row.hardware, local_hardware):
        local_row = row
    elif local_hardware is not None:
        try:
            local_row = throughput.lookup(registry, model, local_hardware, compiled)
        except throughput.ThroughputNotFoundError:
            pass  # the wall-time estimate is optional; format_plan says how to get it
    return TrainingPlan(
        model=model,
        compute_class=compute_class,
        reference_hardware=reference_hardware,
        tokens_per_second=float(tokens_per_second),
        throughput_row=row,
        global_batch_size=global_batch_size,
        seq_len=seq_len,
        steps=training_steps(seconds, tokens_per_second, global_batch_size, seq_len),
        flops_per_forward=flops_per_forward,
        local_hardware=local_hardware,
        local_row=local_row,
        local_devices=local_devices,
        evaluation=evaluation,
        compiled=compiled,
    )


def _plan_stages(model, compute_class, global_batch_size, seq_len, registry, reference_hardware, tokens_per_second,
                 flops_per_forward, local_hardware, local_devices, evaluation, compiled, stage_models) -> TrainingPlan:
    registry = throughput.registry_path(model.project) if registry is None else Path(registry)
    rows, rates = [], []
    for i, (stage, spec, row) in enumerate(stage_models):
        if tokens_per_second is None and row is None:
            try:
                row = throughput.lookup(registry, spec, reference_hardware, compiled)
            except throughput.ThroughputNotFoundError as error:
                raise throughput.ThroughputNotFoundError(
                    f"stage {i + 1} of --stages (seq_len {stage.seq_len}) is charged at its own throughput: "
                    f"{error}") from None
        rows.append(None if tokens_per_second is not None else row)
        rates.append(tokens_per_second if tokens_per_second is not None else row.tokens_per_second)
    parsed = tuple(stage for stage, _, _ in stage_models)
    steps = steps_for_budget(parsed, compute_class_seconds(compute_class), rates, global_batch_size)
    planned = tuple(PlannedStage(s.seq_len, float(s.fraction), n, float(v), r)
                    for s, n, v, r in zip(parsed, steps, rates, rows))
    # wall time expected here only when every stage's row was measured on this hardware
    local = [r for r in rows if r is not None and local_hardware is not None
             and throughput.hardware_matches(r.hardware, local_hardware)]
    plan = TrainingPlan(model=model, compute_class=compute_class, reference_hardware=reference_hardware,
                        tokens_per_second=1.0, throughput_row=rows[-1], global_batch_size=global_batch_size,
                        seq_len=seq_len, steps=sum(steps), flops_per_forward=flops_per_forward,
                        local_hardware=local_hardware, local_row=local[-1] if len(local) == len(rows) else None,
                        local_devices=local_devices, evaluation=evaluation, compiled=compiled, stages=planned)
    # the run's average reference throughput, so that tokens / tokens_per_second is the plan's accelerator time
    return dataclasses.replace(plan, tokens_per_second=plan.tokens / plan.accelerator_seconds)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _throughput_text(plan: TrainingPlan) -> str:
    row = plan.throughput_row
    if plan.stages is not None:
        return f"{plan.tokens_per_second:,.0f} tokens/s on average over the stages (each at its own, below)"
    if row is None:
        return f"{plan.tokens_per_second:,.0f} tokens/s (--tokens_per_second)"
    when = f", {row.date}" if row.date else ""
    text = f"{plan.tokens_per_second:,.0f} tokens/s ({row.source} on {row.hardware}{when})"
    if row.source == "derived":
        text += f"\n  {row.note.split('; ')[0]}"
    return text


def format_plan(plan: TrainingPlan) -> str:
    """Aligned plain-text summary for `train.py --dry_run`."""
    rows = [
        ("project / config", f"{plan.model.project} / {plan.model.config}"
                             f"{' ' + plan.model.flags if plan.model.flags else ''}"),
        ("model fingerprint", plan.model.fingerprint),
        ("compute class", plan.compute_class),
        ("reference hardware", plan.reference_hardware),
        ("throughput", _throughput_text(plan)),
        ("global batch size", f"{plan.global_batch_size:,}"),
        ("sequence length", f"{plan.seq_len:,}"),
        *_stage_rows(plan),
        ("steps", f"{plan.steps:,}"),
        ("tokens", f"{plan.tokens:,} ({plan.tokens / 1e9:.3f}B)"),
        ("accelerator hours", f"{plan.accelerator_hours:.3f} ({plan.accelerator_seconds:,.0f} s on {plan.reference_hardware})"),
    ]
    if plan.total_flops is None:
        rows.append(("estimated FLOPs", "unknown (no forward FLOPs given)"))
    else:
        rows.append(("forward FLOPs (batch 1)", f"{plan.flops_per_forward / 1e9:.1f} GFLOPs"))
        rows.append(("estimated FLOPs", f"{plan.total_flops:.4g} ({plan.total_flops / 1e18:.3f} exaFLOPs = 3 x forward x sequences)"))
    if plan.local_hardware is not None:
        rows += _wall_time_rows(plan)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  " + value.replace("\n", "\n" + " " * (width + 2)) for label, value in rows)


def _stage_rows(plan: TrainingPlan) -> list[tuple[str, str]]:
    """One row per stage of --stages: its length, share of the tokens, steps and the throughput it is charged at."""
    rows = []
    for i, stage in enumerate(plan.stages or ()):
        tokens = stage.steps * plan.global_batch_size * stage.seq_len
        source = ("--tokens_per_second" if stage.throughput_row is None
                  else f"{stage.throughput_row.source} on {stage.throughput_row.hardware}")
        rows.append((f"stage {i + 1}", f"{stage.seq_len} tokens x {stage.steps:,} steps = "
                     f"{tokens:,} tokens ({stage.fraction:.0%}), {tokens / stage.tokens_per_second:,.0f} s at "
                     f"{stage.tokens_per_second:,.0f} tokens/s ({source})"))
    return rows


def _wall_time_rows(plan: TrainingPlan) -> list[tuple[str, str]]:
    if plan.local_row is None:
        return [("expected wall time", f"unknown: no registry row for this model on {plan.local_hardware}; measure "
                                       f"it with {throughput.measure_command(plan.model, compiled=plan.compiled)}")]
    devices = f" x {plan.local_devices}" if plan.local_devices > 1 else ""
    train = plan.expected_wall_seconds
    rows = [("expected wall time", f"training {_duration(train)} on {plan.local_hardware}{devices} at "
                                   f"{plan.local_row.tokens_per_second:,.0f} tokens/s each")]
    work = plan.evaluation
    if work is not None:
        during, final = plan.expected_eval_seconds(work.during_training), plan.expected_eval_seconds(work.final)
        rows += [
            ("", f"evaluation {_duration(during + final)}: {work.evaluations_during_training} x "
                 f"{work.each_during_training:,} positions during training ({_duration(during)}), {work.final:,} "
                 f"at the end ({_duration(final)}); forward passes at {EVAL_SPEEDUP}x the training throughput"),
            ("", f"total {_duration(train + during + final)} (the compute class counts training only)"),
        ]
    return rows
