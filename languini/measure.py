"""Timing training steps: the measurement behind a throughput row and the row it makes (measured_row), for
scripts/measure_throughput.py and for a run's plan on a machine without a GPU that has no row for its model
(languini.plan.cpu_row). The step timed is the trainer's own (TrainStep)."""
from __future__ import annotations

import datetime
import gc
import statistics
from dataclasses import dataclass

import torch

from languini import hebbian
from languini.throughput import ModelSpec, ThroughputRow
from languini.timing import time_calls
from languini.trainer import TrainConfig, TrainStep, build_optimizers, build_schedulers, precision_for


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    tokens_per_second: float | None  # None: out of memory
    step_seconds: float | None
    peak_memory_gib: float | None  # None on CPU or out of memory
    spread: float | None = None  # (slowest - fastest) / median of the timed steps; None: out of memory


def measure_batch_size(
    model: torch.nn.Module,
    model_config,
    batch_size: int,
    device: torch.device,
    tcfg: TrainConfig,
    steps: int,
    warmup: int,
) -> Measurement:
    """Median time of `steps` training steps after `warmup` untimed ones; tokens/s None on OOM.

    The steps are Trainer's, with tcfg's optimiser, schedule, precision, compile, gradient clipping,
    micro-batches and Hebbian Softmax (batch_size is the global batch, split into tcfg.micro_batches; tcfg.batch_size
    is unused).
    """
    micro_batches = tcfg.micro_batches
    if micro_batches < 1 or batch_size % micro_batches:
        raise ValueError(f"batch size {batch_size} is not divisible into {micro_batches} micro-batches")
    optimizers, dense_params = build_optimizers(model, tcfg.lr, device)
    schedulers = build_schedulers(optimizers, tcfg, warmup + steps)
    autocast, scaler, _ = precision_for(device, tcfg.precision)
    if tcfg.compile:
        torch._dynamo.reset()  # a fresh graph per batch size; the recompile limit would otherwise fall back to eager
    train_model = torch.compile(model) if tcfg.compile else model
    train_step = TrainStep(model, train_model, optimizers, dense_params, schedulers, autocast, scaler, tcfg.grad_clip,
                           micro_batches, device, hebbian=hebbian.for_run(model, tcfg))
    is_cuda = device.type == "cuda"
    if is_cuda:
        torch.cuda.reset_peak_memory_stats(device)

    durations = []
    try:
        shape = (micro_batches, batch_size // micro_batches, model_config.seq_len + 1)
        tokens = torch.randint(model_config.vocab_size, shape, device=device)
        inputs, targets = tokens[..., :-1], tokens[..., 1:]
        states = [None] * micro_batches
        timing = time_calls(lambda: train_step(inputs, targets, states), device, steps, warmup)
        durations = list(timing.seconds)
    except RuntimeError as error:  # cuBLAS and compiled graphs report OOM as plain RuntimeErrors
        if not isinstance(error, torch.cuda.OutOfMemoryError) and "out of memory" not in str(error).lower():
            raise
        durations = []
    finally:
        train_step.close()
    # Free this batch size's activations, gradients and Adam state before the next one.
    model.zero_grad(set_to_none=True)
    optimizers = schedulers = scaler = train_model = train_step = dense_params = None
    states = inputs = targets = tokens = None
    gc.collect()
    if not durations:
        torch.cuda.empty_cache()
        return Measurement(batch_size, None, None, None)
    peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30 if is_cuda else None
    if is_cuda:
        torch.cuda.empty_cache()
    step_seconds = statistics.median(durations)
    return Measurement(batch_size, batch_size * model_config.seq_len / step_seconds, step_seconds, peak_memory_gib,
                       timing.spread)


def measured_row(model: ModelSpec, hardware: str, measurement: Measurement, seq_len: int, precision: str,
                 compiled: bool, note: str) -> ThroughputRow:
    """The registry row of a measurement of `model` on `hardware`, dated today (source `measured`)."""
    return ThroughputRow(model.project, model.config, model.fingerprint, model.flags, hardware, measurement.batch_size,
                         seq_len, measurement.tokens_per_second, measurement.peak_memory_gib, precision, compiled,
                         torch.__version__, datetime.date.today().isoformat(), "measured", note)
