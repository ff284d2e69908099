"""The plan of a run: what its budget buys one model on this hardware, computed in one place.

plan_run turns the training settings (--compute_class or --max_steps, --stages, --tokens_per_second,
--reference_hardware, the eval settings) into a Plan: the steps and tokens, the reference throughput they are
charged at and the registry row it came from, each sequence-length stage, the evaluation the run will do and the
wall time expected here. The dry run prints it (format_plan), the trainer follows it (Plan.steps,
Plan.schedule), config.json and results.json record it (Plan.record), and a resumed run keeps the plan it
started with (resumed).

The throughput comes from --tokens_per_second, else from the project's registry row of this very model on the
reference hardware (languini.throughput.lookup), else, on the CPU path (a CPU-sized config on a machine without
a GPU: cpu_sized), from timing the model on this CPU (cpu_row), kept in <out_dir>/throughput.csv.

The arithmetic stays beside it: languini.compute_class (a class in seconds, seconds to steps), languini.stages
(steps per stage, the schedule), languini.throughput (the registry), languini.evaluation (positions read).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from languini import evaluation, flops, measure, stages, throughput
from languini.compute_class import (
    DEFAULT_REFERENCE_HARDWARE,
    PAPER_COMPUTE_CLASSES,
    compute_class_seconds,
    training_steps,
)
from languini.run_folder import RUN_CONFIG
from languini.trainer import (
    CPU_PROGRESS_BATCHES,
    DEFAULT_WARMUP,
    TrainConfig,
    eval_every_max_batches,
    precision_for,
    progress_evaluations,
    progress_split,
    warmup_steps,
)

CPU_CONFIG = "cpu"
CPU_SUFFIX = "_cpu"  # configs named cpu or <anything>_cpu are sized for a CPU: without a GPU, timed on it
CPU_MEASURE_STEPS, CPU_MEASURE_WARMUP = 15, 3  # timing a model on this CPU when the registry has no row for it
BUSY_SPREAD = 0.5  # (slowest - fastest) / median of the timed steps above which the timing is called unreliable
# A forward pass costs a third of a training step (the paper's FLOPs convention: backward = 2 forwards), so
# evaluation is planned at three times the training throughput.
EVAL_SPEEDUP = 3
# On a CPU the ratio depends on the model: on the development CPU (2026-11-26, the README's walkthrough) a qLSTM's
# evaluation ran at about 3x its training throughput, the GPT's cpu config on a 16,384-token vocabulary at 1.7x.
# Planned at 1.5x there, so that the evaluation sized to the class keeps within its budget.
CPU_EVAL_SPEEDUP = 1.5
# A stateful model's slow evaluation reads each split as one stream at batch 1, which on the development CPU ran at
# about the training throughput (a qLSTM, 2026-11-26): planned at 1x.
STREAM_EVAL_SPEEDUP = 1
# On the CPU path evaluation is sized to the class: at most this fraction of the expected training time
# (--eval_budget); a GPU run evaluates as the protocol says unless asked.
CPU_EVAL_BUDGET = 0.25
# The final evaluation sized to a CPU class reads a sample fixed by the class, the same for every project (so their
# numbers compare): the sample a model of this training speed evaluates within the budget (a CPU-sized model on
# the development 2-core CPU: between lram_gpt's 5,000 tokens/s and the GPT's 26,000). A slower model takes
# longer than the budget over it, a faster one less; the plan says how long.
CPU_EVAL_REFERENCE_TOKENS_PER_SECOND = 10_000
# A --max_steps run on the CPU path evaluates within the budget of its expected training time, but never less than
# this: a short smoke test may spend a minute evaluating, not the eleven a whole split would take.
MAX_STEPS_MIN_EVAL_SECONDS = 60


def cpu_sized(config_name: str | None) -> bool:
    """Whether a --config is sized for a CPU (None: the default there, 'cpu'): 'cpu' or a name ending in '_cpu'.
    On a machine without a GPU such a config takes the CPU path: reference hardware 'cpu', no compute class's
    GPU config or batch, and a model without a throughput row is timed on this CPU."""
    return config_name is None or config_name == CPU_CONFIG or config_name.endswith(CPU_SUFFIX)


@dataclass(frozen=True)
class EvalWork:
    """Token positions the model reads in evaluation (forward passes, padding included), from the eval settings."""

    each_during_training: int  # one fast evaluation during training (capped by --eval_every_max_batches)
    evaluations_during_training: int
    final: int  # fast and slow evaluation of every held-out split at the end
    final_in_streams: int = 0  # of `final`, the positions read as one stream at batch 1 (a stateful slow eval)

    @property
    def during_training(self) -> int:
        return self.each_during_training * self.evaluations_during_training


@dataclass(frozen=True)
class EvalCaps:
    """The evaluation settings a run uses in place of its flags' (size_evaluation): on the CPU path the smaller
    subset of every evaluation during training, and where evaluation would take more than `fraction` of the
    expected training time, fewer evaluations during training and lower caps on the final one (`sized`)."""

    fraction: float
    eval_max_batches: int | None
    eval_every_max_batches: int
    slow_eval_max_windows: int | None
    eval_every: int | None
    sized: bool  # the budget lowered a cap or the number of evaluations
    slow_eval_sample: str = "spread"  # first: the caps are the class's, the same sample for every model

    def apply(self, tcfg: TrainConfig) -> TrainConfig:
        return dataclasses.replace(tcfg, eval_max_batches=self.eval_max_batches,
                                   eval_every_max_batches=self.eval_every_max_batches,
                                   slow_eval_max_windows=self.slow_eval_max_windows, eval_every=self.eval_every,
                                   slow_eval_sample=self.slow_eval_sample)


@dataclass(frozen=True)
class PlannedStage:
    """One sequence-length stage of a plan (languini.stages): its length, steps and reference throughput."""

    seq_len: int
    fraction: float  # of the run's tokens
    steps: int
    tokens_per_second: float | None  # None: unknown (--max_steps without a row)
    throughput_row: throughput.ThroughputRow | None  # None when given by --tokens_per_second (or unknown)
    rows: int = 1  # sequences per stream and step (languini.stages.rows_per_stream)


@dataclass(frozen=True)
class Plan:
    """What a budget buys one model: steps, tokens, the throughput they are charged at, the evaluation and the wall
    time expected here; derived quantities are properties."""

    model: throughput.ModelSpec
    compute_class: str | None  # None: a --max_steps budget
    reference_hardware: str
    tokens_per_second: float | None  # reference throughput (with stages, their average); None: unknown
    throughput_row: throughput.ThroughputRow | None  # None when given by --tokens_per_second (or unknown)
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
    given_tokens_per_second: float | None = None  # --tokens_per_second, which overrides every row
    eval_caps: EvalCaps | None = None  # caps sized to the budget (size_evaluation); None: the flags' own
    warmup_steps: int | None = None  # the learning rate's linear warm-up (trainer.warmup_steps)
    warmup_reason: str = ""  # why it is that many steps
    notes: tuple[str, ...] = ()  # said under the plan

    def schedule(self) -> stages.Schedule:
        """The step-by-step lengths and throughputs the trainer follows."""
        if self.stages is None:
            return stages.Schedule.single(self.seq_len, self.steps, self.tokens_per_second)
        return stages.Schedule(tuple(s.seq_len for s in self.stages), tuple(s.steps for s in self.stages),
                               tuple(s.tokens_per_second for s in self.stages), tuple(s.rows for s in self.stages))

    @property
    def throughput_source(self) -> str:
        return "--tokens_per_second" if self.throughput_row is None else self.throughput_row.source

    @property
    def tokens(self) -> int:
        return self.schedule().tokens(self.steps, self.global_batch_size)

    @property
    def accelerator_seconds(self) -> float | None:
        return self.schedule().accelerator_seconds(self.steps, self.global_batch_size)

    @property
    def accelerator_hours(self) -> float | None:
        seconds = self.accelerator_seconds
        return None if seconds is None else seconds / 3600

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
            return sum(s.steps * self.global_batch_size * s.rows * s.seq_len / (s.tokens_per_second * self.local_devices)
                       for s in self.stages)
        return None if self.local_row is None else self.tokens / self.local_tokens_per_second

    def expected_eval_seconds(self, positions: int, in_streams: int = 0) -> float | None:
        """Wall time of evaluating `positions` token positions locally, at eval_speedup x training throughput, of
        which `in_streams` at STREAM_EVAL_SPEEDUP x."""
        if self.local_row is None:
            return None
        rate = self.local_tokens_per_second
        return (positions - in_streams) / (self.eval_speedup * rate) + in_streams / (STREAM_EVAL_SPEEDUP * rate)

    @property
    def eval_speedup(self) -> float:
        """Evaluation's throughput over training's on the local hardware, as planned."""
        return CPU_EVAL_SPEEDUP if self.local_hardware == "cpu" else EVAL_SPEEDUP

    def expected_final_eval_seconds(self) -> float | None:
        work = self.evaluation
        return None if work is None else self.expected_eval_seconds(work.final, work.final_in_streams)

    def throughput_record(self) -> dict | None:
        """The throughput the budget came from, for results.json: the registry row, or the hand-set value."""
        if self.throughput_row is not None:
            return dataclasses.asdict(self.throughput_row)
        return None if self.given_tokens_per_second is None else {
            "source": "--tokens_per_second", "tokens_per_second": self.given_tokens_per_second}

    def training_config(self, tcfg: TrainConfig) -> TrainConfig:
        """tcfg with the evaluation caps this plan sized (unchanged where it sized none)."""
        return tcfg if self.eval_caps is None else self.eval_caps.apply(tcfg)

    def record(self) -> dict:
        """The budget as config.json keeps it (what a resumed run continues with: resumed)."""
        return {"steps": self.steps, "tokens_per_second": self.tokens_per_second,
                "throughput_row": self.throughput_record(),
                **({"stages": self.schedule().records(self.global_batch_size)} if self.stages is not None else {}),
                **({"eval_caps": dataclasses.asdict(self.eval_caps)} if self.eval_caps is not None else {})}


def plan_compute_class(
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
    stage_models: list[tuple[stages.Stage, throughput.ModelSpec, throughput.ThroughputRow | None]] | None = None,
    stage_batch: str = "tokens",
) -> Plan:
    """What a compute class buys `model`: throughput from `tokens_per_second` if given, else from `row`
    (measured for this run on the reference hardware), else from the registry row of that very model
    (throughput.lookup) on the reference hardware, eager or compiled as the run is.

    `registry` defaults to projects/<project>/throughput.csv. Raises throughput.ThroughputNotFoundError (naming the
    measuring command) when no row matches.

    stage_models (--stages): each stage with the model at its length (the model's config at that seq_len) and a
    row measured for this run or None; each stage's throughput is found as above, and the budget is split as
    languini.stages.steps_for_budget says.
    """
    registry = throughput.registry_path(model.project) if registry is None else Path(registry)
    if stage_models is not None:
        return _plan_stages(model, compute_class, global_batch_size, seq_len, registry, reference_hardware,
                            tokens_per_second, flops_per_forward, local_hardware, local_devices, evaluation, compiled,
                            stage_models, stage_batch)
    given = tokens_per_second
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
    return Plan(model=model, compute_class=compute_class, reference_hardware=reference_hardware,
                tokens_per_second=float(tokens_per_second), throughput_row=row, global_batch_size=global_batch_size,
                seq_len=seq_len, steps=training_steps(seconds, tokens_per_second, global_batch_size, seq_len),
                flops_per_forward=flops_per_forward, local_hardware=local_hardware, local_row=local_row,
                local_devices=local_devices, evaluation=evaluation, compiled=compiled, given_tokens_per_second=given)


def _plan_stages(model, compute_class, global_batch_size, seq_len, registry, reference_hardware, tokens_per_second,
                 flops_per_forward, local_hardware, local_devices, evaluation, compiled, stage_models,
                 stage_batch) -> Plan:
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
    per_stream = stages.rows_per_stream(parsed, stage_batch)
    steps = stages.steps_for_budget(parsed, compute_class_seconds(compute_class), rates, global_batch_size, per_stream)
    planned = tuple(PlannedStage(s.seq_len, float(s.fraction), n, float(v), r, k)
                    for s, n, v, r, k in zip(parsed, steps, rates, rows, per_stream))
    # wall time expected here only when every stage's row was measured on this hardware
    local = [r for r in rows if r is not None and local_hardware is not None
             and throughput.hardware_matches(r.hardware, local_hardware)]
    plan = Plan(model=model, compute_class=compute_class, reference_hardware=reference_hardware,
                tokens_per_second=1.0, throughput_row=rows[-1], global_batch_size=global_batch_size,
                seq_len=seq_len, steps=sum(steps), flops_per_forward=flops_per_forward,
                local_hardware=local_hardware, local_row=local[-1] if len(local) == len(rows) else None,
                local_devices=local_devices, evaluation=evaluation, compiled=compiled, stages=planned,
                given_tokens_per_second=tokens_per_second)
    # the run's average reference throughput, so that tokens / tokens_per_second is the plan's accelerator time
    return dataclasses.replace(plan, tokens_per_second=plan.tokens / plan.accelerator_seconds)


def plan_run(model: throughput.ModelSpec, model_cls, model_cfg, tcfg: TrainConfig, device: torch.device,
             world_size: int, flops_per_forward: float | None, dataset, stateful: bool, cpu_path: bool, out_dir: str,
             say, keep_timing: bool = True) -> Plan:
    """The plan of a run of `model` (model_cls(model_cfg)) with these training settings on `world_size` of
    `device`: a --max_steps budget, or a --compute_class one (plan_compute_class), which on the CPU path
    (cpu_path: a CPU-sized config without a GPU) times a model it has no row for (cpu_row). The evaluation it
    will do is planned from `dataset` (None: not planned); `say` prints the CPU timing's progress; keep_timing:
    whether that timing is kept for the next runs here (not by a dry run; never when the machine looked busy)."""
    staged = stages.parse(tcfg.stages, model_cfg.seq_len) if tcfg.stages is not None else None
    local_hw = throughput.local_device_name(device)
    if tcfg.max_steps is not None:
        plan = _plan_steps(model, model_cfg, tcfg, local_hw, world_size, flops_per_forward, staged)
        fraction = eval_budget(tcfg, cpu_path)
        if dataset is None or not cpu_path or not fraction:
            return plan
        # bounded to the budget of its expected training time here: at this CPU's row if there is one (not timed
        # now), else at the reference speed
        here = dataclasses.replace(tcfg, reference_hardware=local_hw)
        row = None if tcfg.tokens_per_second is not None else (
            kept_row(model, out_dir, local_hw, tcfg)
            or _registry_row(throughput.registry_path(model.project), model, here))
        rate = row.tokens_per_second * world_size if row else CPU_EVAL_REFERENCE_TOKENS_PER_SECOND
        return size_evaluation(plan, dataset, tcfg, model_cfg.seq_len, stateful, fraction, cpu_path, rate)
    if tcfg.compute_class is None:
        raise ValueError("Give a budget: --compute_class (e.g. 6h, 24h, 15m, 90s) or --max_steps N.")
    registry = throughput.registry_path(model.project)

    def plan_for(row=None, time_stage=None):
        return plan_compute_class(
            model, tcfg.compute_class, tcfg.batch_size, model_cfg.seq_len, registry, tcfg.reference_hardware,
            tcfg.tokens_per_second, flops_per_forward, local_hw, world_size, compiled=tcfg.compile, row=row,
            stage_models=stage_models(model, model_cfg, staged, time_stage, tcfg.stage_batch) if staged else None,
            stage_batch=tcfg.stage_batch)

    # The CPU path's reference is this machine: this CPU's own timing of the model when it has one (kept in
    # <out_dir>/throughput.csv), else the committed cpu row, else the model is timed now (--retime: always).
    # Processes would time it differently, so not under torchrun.
    if (cpu_path and world_size == 1 and tcfg.tokens_per_second is None
            and throughput.hardware_matches(tcfg.reference_hardware, local_hw)):
        def this_cpu(spec, cfg, rows=1):  # rows: sequences per stream, so timed at the stage's batch
            timed = dataclasses.replace(tcfg, batch_size=tcfg.batch_size * rows)
            if tcfg.retime:
                return cpu_row(spec, model_cls, cfg, timed, out_dir, device, say, keep_timing)
            return (kept_row(spec, out_dir, local_hw, tcfg) or _registry_row(registry, spec, tcfg)
                    or cpu_row(spec, model_cls, cfg, timed, out_dir, device, say, keep_timing))

        plan = plan_for(time_stage=this_cpu) if staged else plan_for(this_cpu(model, model_cfg))
    else:
        try:
            plan = plan_for()
        except throughput.ThroughputNotFoundError as error:
            if device.type == "cpu" and not cpu_path:
                raise throughput.ThroughputNotFoundError(
                    f"{error}\nWithout a GPU only a CPU-sized config ('{CPU_CONFIG}' or a name ending in "
                    f"'{CPU_SUFFIX}') is timed on this CPU; '{model.config}' is planned against the registry."
                ) from None
            raise
    if dataset is not None:
        plan = dataclasses.replace(plan, evaluation=eval_work(dataset, tcfg, model_cfg.seq_len, plan.steps, stateful))
        fraction = eval_budget(tcfg, cpu_path)
        if fraction:
            plan = size_evaluation(plan, dataset, tcfg, model_cfg.seq_len, stateful, fraction, cpu_path)
    plan = dataclasses.replace(plan, warmup_steps=warmup_steps(tcfg, plan.steps), warmup_reason=_warmup_reason(tcfg))
    if cpu_path and tcfg.compute_class in PAPER_COMPUTE_CLASSES:
        plan = dataclasses.replace(plan, notes=(
            f"Note: without a GPU, --compute_class {tcfg.compute_class} means {tcfg.compute_class} of this CPU "
            f"training the toy config '{model.config}', not the paper's {tcfg.compute_class} class on an RTX 3090. "
            "For a smoke run of a few minutes use --compute_class 2m; to plan the paper's class, name its "
            "config (--config small --dry_run true) on the book data it is defined for (vocab 16384).",))
    return plan


def _plan_steps(model, model_cfg, tcfg: TrainConfig, local_hw: str, world_size: int, flops_per_forward,
                staged) -> Plan:
    """A --max_steps plan: the registry row of the model (or --tokens_per_second), where there is one, only
    gives its accelerator time; with --stages, each stage at its own length's throughput."""
    registry, row = throughput.registry_path(model.project), None
    tok_s = tcfg.tokens_per_second
    if tok_s is None:
        row = _registry_row(registry, model, tcfg)  # None: accelerator time unknown
        tok_s = row.tokens_per_second if row else None
    planned = None
    if staged:
        rows = [None if tcfg.tokens_per_second else _registry_row(registry, spec, tcfg)
                for _, spec, _ in stage_models(model, model_cfg, staged)]
        per_stream = stages.rows_per_stream(staged, tcfg.stage_batch)
        planned = tuple(PlannedStage(s.seq_len, float(s.fraction), n,
                                     tcfg.tokens_per_second or (r.tokens_per_second if r else None), r, k)
                        for s, n, r, k in zip(staged, stages.steps_for_total(staged, tcfg.max_steps, per_stream),
                                              rows, per_stream))
    return Plan(model=model, compute_class=None, reference_hardware=tcfg.reference_hardware, tokens_per_second=tok_s,
                throughput_row=row, global_batch_size=tcfg.batch_size, seq_len=model_cfg.seq_len,
                steps=tcfg.max_steps, flops_per_forward=flops_per_forward, local_hardware=local_hw,
                local_devices=world_size, compiled=tcfg.compile, stages=planned,
                given_tokens_per_second=tcfg.tokens_per_second)


def _registry_row(registry: Path, spec: throughput.ModelSpec, tcfg: TrainConfig) -> throughput.ThroughputRow | None:
    """The registry row of `spec` on the reference hardware, or None."""
    try:
        return throughput.lookup(registry, spec, tcfg.reference_hardware, tcfg.compile)
    except throughput.ThroughputNotFoundError:
        return None


def stage_models(model: throughput.ModelSpec, model_cfg, staged: tuple, time_stage=None,
                 stage_batch: str = "tokens") -> list[tuple]:
    """Each stage with the model at its length (the config at the stage's seq_len), charged at that model's
    throughput, and its row from `time_stage(spec, config, rows per stream)` where given (else None: the
    registry's)."""
    models = []
    for stage, rows in zip(staged, stages.rows_per_stream(staged, stage_batch)):
        cfg = dataclasses.replace(model_cfg, seq_len=stage.seq_len)
        spec = throughput.model_spec(model.project, model.config, cfg, dict(model.step_settings))
        models.append((stage, spec, time_stage(spec, cfg, rows) if time_stage else None))
    return models


THROUGHPUT_MARGIN = 0.25  # a run whose training speed differs from its plan's by more is told so


def throughput_check(plan: Plan, tokens: int, train_seconds: float) -> dict | None:
    """The run's training speed against the speed its plan expected here (the local row: on the CPU path the row
    its compute class was charged at); None without a local row. `within_margin` is False when the two differ by
    more than THROUGHPUT_MARGIN: then the class was not this machine's time."""
    if plan.expected_wall_seconds is None or not train_seconds > 0 or not tokens:
        return None
    expected = plan.tokens / plan.expected_wall_seconds
    measured = tokens / train_seconds
    row = plan.local_row
    return {"expected_tokens_per_second": expected, "measured_tokens_per_second": measured,
            "ratio": measured / expected, "margin": THROUGHPUT_MARGIN,
            "within_margin": abs(measured / expected - 1) <= THROUGHPUT_MARGIN,
            "row": f"{row.source} on {row.hardware}, {row.date}"}


def describe_throughput_check(check: dict) -> str:
    """The warning a run prints when its speed was off its plan's by more than the margin."""
    ratio = check["ratio"]
    return (f"Warning: training ran at {check['measured_tokens_per_second']:,.0f} tokens/s, {ratio:.2f}x the "
            f"{check['expected_tokens_per_second']:,.0f} its plan expected here (row: {check['row']}), beyond the "
            f"{check['margin']:.0%} margin: its compute class was {1 / ratio:.2f}x this run's training time. The "
            "machine was busier (or idler) than when the row was timed; on a CPU, time it again on an idle machine "
            "with --retime true.")


def kept_row(model: throughput.ModelSpec, out_dir: str, hardware: str, tcfg: TrainConfig
             ) -> throughput.ThroughputRow | None:
    """This CPU's own row for `model`, kept in <out_dir>/throughput.csv by an earlier timing here, or None."""
    try:
        return throughput.lookup(Path(out_dir) / "throughput.csv", model, hardware, tcfg.compile)
    except throughput.ThroughputNotFoundError:
        return None


def cpu_row(model: throughput.ModelSpec, model_cls, model_cfg, tcfg: TrainConfig, out_dir: str, device: torch.device,
            say, keep: bool = True) -> throughput.ThroughputRow:
    """This CPU's row for `model`, timed now (the median of CPU_MEASURE_STEPS training steps after
    CPU_MEASURE_WARMUP) and, if `keep`, kept in <out_dir>/throughput.csv, so later runs (and resumed ones) get the
    same steps; never kept when the steps' times spread over more than BUSY_SPREAD of their median (a busy
    machine's timing would fix the steps of every later run)."""
    kept, hardware = Path(out_dir) / "throughput.csv", throughput.local_device_name(device)
    say(f"Timing {model} on this CPU: {CPU_MEASURE_STEPS} training steps at batch {tcfg.batch_size} after "
        f"{CPU_MEASURE_WARMUP} untimed ones...")
    precision = precision_for(device, tcfg.precision)[2]
    torch.manual_seed(0)
    timed = measure.measure_batch_size(model_cls(model_cfg).to(device).train(), model_cfg, tcfg.batch_size, device,
                                       tcfg, CPU_MEASURE_STEPS, CPU_MEASURE_WARMUP)  # the steps this run trains
    spread = "unknown" if timed.spread is None else f"{timed.spread:.0%}"
    row = measure.measured_row(model, hardware, timed, model_cfg.seq_len, precision, tcfg.compile,
                               f"fixed batch size; timed by train.py before its run (median of {CPU_MEASURE_STEPS} "
                               f"steps, spread {spread}; micro_batches {tcfg.micro_batches}, grad_clip "
                               f"{tcfg.grad_clip})")
    busy = timed.spread is not None and timed.spread > BUSY_SPREAD
    if keep and not busy:
        throughput.append_row(kept, row)
        where = (f"kept in {throughput.display_path(kept)} for the next runs of this model here (--retime true times "
                 "it again)")
    else:
        where = ("not kept: the next run times it again" + (" (a dry run writes nothing; --keep_timing true keeps "
                                                            "it)" if not keep else ""))
    say(f"Measured {row.tokens_per_second:,.0f} tokens/s (median; the steps' times spread over {spread} of it); "
        f"{where}. Its compute classes are this machine's time.")
    if busy:
        say(f"Warning: the steps' times spread over {timed.spread:.0%} of their median: this machine looks busy, "
            "so the class buys another number of steps than on an idle one; the timing is not kept. Train when it "
            "is idle.")
    return row


def eval_work(dataset, tcfg: TrainConfig, seq_len: int, steps: int, stateful: bool) -> EvalWork:
    """The evaluation a run of `steps` steps will do on `dataset` with these eval settings, in token positions."""
    held_out = [s for s in dataset.splits if s != "train"]
    fast = sum(evaluation.fast_positions(dataset.books(s), tcfg.eval_batch_size, seq_len, tcfg.eval_max_batches)
               for s in held_out)
    slow = sum(evaluation.slow_positions(dataset.books(s), seq_len, tcfg.slow_eval_max_windows, stateful,
                                         tcfg.slow_eval, tcfg.slow_eval_last_n, tcfg.slow_eval_sample)
               for s in held_out)
    each = evaluation.fast_positions(dataset.books(progress_split(dataset.splits)), tcfg.eval_batch_size, seq_len,
                                     eval_every_max_batches(tcfg))
    return EvalWork(each, progress_evaluations(tcfg, steps), fast + slow, slow if stateful else 0)


def _warmup_reason(tcfg: TrainConfig) -> str:
    if tcfg.warmup_steps is not None:
        return "--warmup_steps" + (", at most a tenth of the run (warmup_then_cosine)"
                                   if tcfg.lr_schedule == "warmup_then_cosine" else "")
    return f"{DEFAULT_WARMUP}, or a tenth of the run if shorter, so that it reaches the peak lr"


def eval_budget(tcfg: TrainConfig, cpu_path: bool) -> float | None:
    """The fraction of the training time evaluation may take: --eval_budget, else CPU_EVAL_BUDGET on the CPU path
    and no limit elsewhere (0 or none: no limit)."""
    if tcfg.eval_budget is not None:
        return tcfg.eval_budget or None
    return CPU_EVAL_BUDGET if cpu_path else None


def size_evaluation(plan: Plan, dataset, tcfg: TrainConfig, seq_len: int, stateful: bool, fraction: float,
                    cpu_path: bool, local_rate: float | None = None) -> Plan:
    """The plan with the evaluation settings of a run whose evaluation may take `fraction` of its training time
    (EvalCaps; `plan` unchanged where nothing changes).

    Every evaluation during training reads the same first batches of the valid split, CPU_PROGRESS_BATCHES on the
    CPU path unless --eval_every_max_batches says otherwise, so that the learning curves of all runs on a dataset
    compare; there are fewer of them where they would take more than a third of the allowance (the last step's
    always kept). The final evaluation gets two thirds, shared equally by the held-out splits and by the fast and
    slow evaluation of each; a cap is only ever lowered, and the final fast evaluation reads at least the subset
    of the evaluations during training.

    At a compute class on the CPU path the final evaluation's sample is the class's, not the model's: its caps are
    what a model of CPU_EVAL_REFERENCE_TOKENS_PER_SECOND reads in the allowance, and the slow eval scores the
    split's first targets (sample `first`), so every project at a class scores the same targets. Otherwise (a
    --max_steps run, --eval_budget on a GPU) the caps come from the model's own speed here (the plan's local row,
    else local_rate) and are set only where the flags' evaluation would not fit (a --max_steps run's allowance
    is at least MAX_STEPS_MIN_EVAL_SECONDS); without either, only the subset is set."""
    progress = tcfg.eval_every_max_batches or (CPU_PROGRESS_BATCHES if cpu_path else None)
    subset = dataclasses.replace(tcfg, eval_every_max_batches=progress)
    progress = eval_every_max_batches(subset)
    work = eval_work(dataset, subset, seq_len, plan.steps, stateful)
    unsized = EvalCaps(fraction, tcfg.eval_max_batches, progress, tcfg.slow_eval_max_windows, tcfg.eval_every, False)
    by_class = cpu_path and plan.compute_class is not None
    here = plan.local_tokens_per_second or local_rate  # this machine's training throughput

    def seconds(positions: int, in_streams: int = 0) -> float:  # as Plan.expected_eval_seconds, at `here`
        return (positions - in_streams) / (plan.eval_speedup * here) + in_streams / (STREAM_EVAL_SPEEDUP * here)

    if by_class:
        allowed, rate = fraction * compute_class_seconds(plan.compute_class), CPU_EVAL_REFERENCE_TOKENS_PER_SECOND
    else:
        allowed, rate = (None, None) if here is None else (fraction * plan.tokens / here, here)
        if allowed is not None and plan.compute_class is None:  # a --max_steps run: a smoke test may take a minute
            allowed = max(allowed, MAX_STEPS_MIN_EVAL_SECONDS)
        if allowed is None or seconds(work.during_training) + seconds(work.final, work.final_in_streams) <= allowed:
            return dataclasses.replace(plan, eval_caps=unsized if progress != eval_every_max_batches(tcfg) else None,
                                       evaluation=work)
    held_out = [s for s in dataset.splits if s != "train"]
    evaluations = work.evaluations_during_training
    if here is not None:
        evaluations = min(evaluations, max(int(allowed / 3 // max(seconds(work.each_during_training), 1e-9)), 1))
    every = tcfg.eval_every if evaluations == work.evaluations_during_training else -(-plan.steps // evaluations)
    # at a class the final evaluation's share does not depend on the model's evaluations during training
    final = 2 * allowed / 3 if by_class else allowed - evaluations * seconds(work.each_during_training)
    per_mode = final / (2 * max(len(held_out), 1))  # seconds

    def batches_within(seconds: float, books) -> int:
        per_batch = evaluation.fast_positions(books, tcfg.eval_batch_size, seq_len, 1)
        return max(int(seconds * plan.eval_speedup * rate // max(per_batch, 1)), progress, 1)

    fast_cap = min(batches_within(per_mode, dataset.books(s)) for s in held_out)
    fast_cap = fast_cap if tcfg.eval_max_batches is None else min(tcfg.eval_max_batches, fast_cap)
    if by_class:  # windows of seq_len targets, read by a stateless model in windows moved by last_n
        last_n = tcfg.slow_eval_last_n or evaluation.default_last_n(seq_len)
        windows = max(int(per_mode * plan.eval_speedup * rate * last_n / seq_len // seq_len), 1)
    else:
        windows = max(int(per_mode * (STREAM_EVAL_SPEEDUP if stateful else plan.eval_speedup) * rate // seq_len), 1)
    slow_cap = windows if tcfg.slow_eval_max_windows is None else min(tcfg.slow_eval_max_windows, windows)
    caps = EvalCaps(fraction, fast_cap, progress, slow_cap, every, True, "first" if by_class else "spread")
    return dataclasses.replace(plan, eval_caps=caps,
                               evaluation=eval_work(dataset, caps.apply(tcfg), seq_len, plan.steps, stateful))


def resumed(plan: Plan, run_dir: Path, say) -> Plan:
    """A resumed compute-class run keeps the budget and stages it started with (its config.json), even if the
    registry has gained a newer row since; `plan` otherwise."""
    if plan.compute_class is None:
        return plan
    try:
        started = json.loads((run_dir / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return plan
    if "tokens_per_second" in started and (started["steps"], started["tokens_per_second"]) != (
            plan.steps, plan.tokens_per_second):
        say(f"Continuing with the budget the run started with: {started['steps']:,} steps at "
            f"{started['tokens_per_second']:,.0f} tokens/s (the registry now gives {plan.steps:,} steps at "
            f"{plan.tokens_per_second:,.0f}).")
        kept = started.get("throughput_row")
        plan = dataclasses.replace(plan, steps=started["steps"], tokens_per_second=started["tokens_per_second"],
                                   throughput_row=throughput.ThroughputRow(**kept) if kept and "project" in kept
                                   else None)
    if plan.eval_caps is not None or "eval_caps" in started:
        plan = dataclasses.replace(plan, eval_caps=EvalCaps(**started["eval_caps"]) if "eval_caps" in started
                                   else None)
    stages_started = started.get("stages")
    total = sum(s["tokens"] for s in stages_started or ()) or 1
    return dataclasses.replace(plan, stages=tuple(
        PlannedStage(s["seq_len"], s["tokens"] / total, s["steps"], s["tokens_per_second"], None,
                     s.get("sequences_per_step", plan.global_batch_size) // plan.global_batch_size)
        for s in stages_started) if stages_started else None)


TOKEN_UNITS = ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, ""))
FLOP_UNITS = ((1e18, " exaFLOPs"), (1e15, " petaFLOPs"), (1e12, " teraFLOPs"), (1e9, " GFLOPs"), (1e6, " MFLOPs"),
              (1, " FLOPs"))


def _scaled(value: float, units: tuple) -> str:
    """value in the largest unit that keeps it at 1 or more, to 3 significant digits: 30.7K, 1.2B, 769 petaFLOPs."""
    size, name = next(((size, name) for size, name in units if value >= size), units[-1])
    return f"{value / size:.3g}{name}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _throughput_text(plan: Plan) -> str:
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


def describe_schedule(schedule: stages.Schedule) -> str:
    return ", then ".join(f"{n:,} steps at {length}" for length, n in zip(schedule.seq_lens, schedule.steps))


def plan_summary(plan: Plan, parameters: int | None) -> dict:
    """The plan in numbers, as `train.py --plan_json` writes it (None where unknown): what a tool planning many
    runs (scripts/compare.py) tabulates."""
    work = plan.evaluation
    evaluation = None
    if work is not None and plan.local_row is not None:
        evaluation = plan.expected_eval_seconds(work.during_training) + plan.expected_final_eval_seconds()
    return {"project": plan.model.project, "config": plan.model.config, "model_flags": plan.model.flags,
            "model_fingerprint": plan.model.fingerprint, "parameters": parameters,
            "compute_class": plan.compute_class, "reference_hardware": plan.reference_hardware,
            "tokens_per_second": plan.tokens_per_second, "throughput_source": plan.throughput_source,
            "global_batch_size": plan.global_batch_size, "seq_len": plan.seq_len, "steps": plan.steps,
            "tokens": plan.tokens, "accelerator_seconds": plan.accelerator_seconds, "total_flops": plan.total_flops,
            "local_hardware": plan.local_hardware, "expected_train_seconds": plan.expected_wall_seconds,
            "expected_eval_seconds": evaluation}


def format_plan(plan: Plan) -> str:
    """The plan as `train.py --dry_run` prints it: one line for --max_steps, an aligned table for a compute
    class; its notes below."""
    if plan.compute_class is None:
        caps = plan.eval_caps
        bounded = "" if caps is None or not caps.sized else (
            f"\nEvaluation bounded to the budget of {caps.fraction:.0%} of its training time (--eval_budget; 0 lifts "
            f"it): {_caps_text(plan)}.")
        return (f"Training {plan.model.project}/{plan.model.config} for --max_steps {plan.steps} (no compute class)"
                + (f" in stages: {describe_schedule(plan.schedule())}." if plan.stages is not None else ".")
                + bounded)
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
        *([("warm-up", f"{plan.warmup_steps:,} step{'s' * (plan.warmup_steps != 1)} ({plan.warmup_reason})")] if plan.warmup_steps is not None
          else []),
        ("tokens", f"{plan.tokens:,} ({_scaled(plan.tokens, TOKEN_UNITS)})"),
        ("accelerator hours", f"{plan.accelerator_hours:.3f} ({plan.accelerator_seconds:,.0f} s on {plan.reference_hardware})"),
    ]
    if plan.total_flops is None:
        rows.append(("estimated FLOPs", "unknown (no forward FLOPs given)"))
    else:
        rows.append(("forward FLOPs (batch 1)", _scaled(plan.flops_per_forward, FLOP_UNITS)))
        rows.append(("estimated FLOPs", f"{plan.total_flops:.4g} ({_scaled(plan.total_flops, FLOP_UNITS)} = 3 x forward "
                                        "x sequences)"))
    if plan.local_hardware is not None:
        rows += _wall_time_rows(plan)
    width = max(len(label) for label, _ in rows)
    return "\n".join([f"{label:<{width}}  " + value.replace("\n", "\n" + " " * (width + 2)) for label, value in rows]
                     + list(plan.notes))


def _stage_rows(plan: Plan) -> list[tuple[str, str]]:
    """One row per stage of --stages: its length, share of the tokens, steps and the throughput it is charged at."""
    rows = []
    for i, stage in enumerate(plan.stages or ()):
        sequences = plan.global_batch_size * stage.rows
        tokens = stage.steps * sequences * stage.seq_len
        source = ("--tokens_per_second" if stage.throughput_row is None
                  else f"{stage.throughput_row.source} on {stage.throughput_row.hardware}")
        rows.append((f"stage {i + 1}", f"{stage.seq_len} tokens x {sequences:,} sequences x {stage.steps:,} steps = "
                     f"{tokens:,} tokens ({stage.fraction:.0%}), {tokens / stage.tokens_per_second:,.0f} s at "
                     f"{stage.tokens_per_second:,.0f} tokens/s ({source})"))
    return rows


def _wall_time_rows(plan: Plan) -> list[tuple[str, str]]:
    if plan.local_row is None and plan.local_hardware == "cpu" and not cpu_sized(plan.model.config):
        return [("expected wall time", f"not estimated: '{plan.model.config}' is a paper config, trained on a GPU "
                                       f"(there: {throughput.measure_command(plan.model, compiled=plan.compiled)})")]
    if plan.local_row is None:
        return [("expected wall time", f"unknown: no registry row for this model on {plan.local_hardware}; measure "
                                       f"it with {throughput.measure_command(plan.model, compiled=plan.compiled)}")]
    devices = f" x {plan.local_devices}" if plan.local_devices > 1 else ""
    train = plan.expected_wall_seconds
    rows = [("expected wall time", f"training {_duration(train)} on {plan.local_hardware}{devices} at "
                                   f"{plan.local_row.tokens_per_second:,.0f} tokens/s each")]
    work = plan.evaluation
    if work is not None:
        during, final = plan.expected_eval_seconds(work.during_training), plan.expected_final_eval_seconds()
        streams = (f" ({work.final_in_streams:,} of them read as one stream at batch 1, at "
                   f"{STREAM_EVAL_SPEEDUP}x)" if work.final_in_streams else "")
        rows += [
            ("", f"evaluation {_duration(during + final)}: {work.evaluations_during_training} x "
                 f"{work.each_during_training:,} positions during training ({_duration(during)}), {work.final:,} "
                 f"at the end ({_duration(final)}); forward passes at {plan.eval_speedup:g}x the training throughput"
                 f"{streams}"),
            ("", f"total {_duration(train + during + final)} (the compute class counts training only)"),
        ]
    caps = plan.eval_caps
    if caps is not None and caps.sized and caps.slow_eval_sample == "first":
        rows.append(("evaluation sized", f"to the class, the same sample for every project: what a model of "
                                         f"{CPU_EVAL_REFERENCE_TOKENS_PER_SECOND:,} tokens/s evaluates in "
                                         f"{caps.fraction:.0%} of the class (--eval_budget; 0 turns it off): "
                                         f"{_caps_text(plan)}"))
        if work is not None and plan.local_row is not None:
            share = (plan.expected_eval_seconds(work.during_training) + plan.expected_final_eval_seconds()) / train
            rows.append(("", f"at this model's speed the evaluation takes {share:.0%} of the training time"))
    elif caps is not None and caps.sized:
        rows.append(("evaluation sized", f"to at most {caps.fraction:.0%} of the training time (--eval_budget; 0 turns "
                                         f"it off): {_caps_text(plan)}"))
    return rows


def _caps_text(plan: Plan) -> str:
    caps, work = plan.eval_caps, plan.evaluation
    slow = (f"the first {caps.slow_eval_max_windows * plan.seq_len:,} targets per split"
            if caps.slow_eval_sample == "first" else f"{caps.slow_eval_max_windows:,} windows per split")
    return (f"fast eval {caps.eval_max_batches:,} batches per split, slow eval {slow}, "
            f"{work.evaluations_during_training} evaluation{'s' * (work.evaluations_during_training != 1)} during "
            f"training of the same {caps.eval_every_max_batches:,} batches")
