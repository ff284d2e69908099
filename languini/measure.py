"""Timing training steps: the measurement behind a throughput row (scripts/measure_throughput.py, and train.py
on a machine without a GPU that has no row for its model)."""
from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from languini import aux_loss
from languini.timing import time_calls
from languini.trainer import build_optimizers, detach, precision_for, step_optimizers

LEARNING_RATE = 6e-4  # the paper's GPT learning rate; the step time does not depend on it


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    tokens_per_second: float | None  # None: out of memory
    step_seconds: float | None
    peak_memory_gib: float | None  # None on CPU or out of memory


def measure_batch_size(
    model: torch.nn.Module,
    model_config,
    batch_size: int,
    device: torch.device,
    precision: str,
    steps: int,
    warmup: int,
    compile_model: bool,
) -> Measurement:
    """Median time of `steps` training steps after `warmup` untimed ones; tokens/s None on OOM."""
    optimizers, _ = build_optimizers(model, LEARNING_RATE, device)  # the trainer's optimisers and step
    autocast, scaler, _ = precision_for(device, precision)  # the trainer's mixed precision
    if compile_model:
        torch._dynamo.reset()  # a fresh graph per batch size; the recompile limit would otherwise fall back to eager
    forward = torch.compile(model) if compile_model else model
    is_cuda = device.type == "cuda"
    if is_cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def train_step(state):
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits, state, aux = aux_loss.unpack(forward(inputs, state))
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) + aux_loss.total(aux)
        (loss if scaler is None else scaler.scale(loss)).backward()
        step_optimizers(optimizers, scaler)
        return detach(state)

    durations = []
    try:
        tokens = torch.randint(model_config.vocab_size, (batch_size, model_config.seq_len + 1), device=device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        state = None

        def step():
            nonlocal state
            state = train_step(state)

        durations = list(time_calls(step, device, steps, warmup).seconds)
    except RuntimeError as error:  # cuBLAS and compiled graphs report OOM as plain RuntimeErrors
        if not isinstance(error, torch.cuda.OutOfMemoryError) and "out of memory" not in str(error).lower():
            raise
        durations = []
    # Free this batch size's activations, gradients and Adam state before the next one.
    model.zero_grad(set_to_none=True)
    optimizers = scaler = forward = None
    state = inputs = targets = tokens = None
    gc.collect()
    if not durations:
        torch.cuda.empty_cache()
        return Measurement(batch_size, None, None, None)
    peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30 if is_cuda else None
    if is_cuda:
        torch.cuda.empty_cache()
    step_seconds = statistics.median(durations)
    return Measurement(batch_size, batch_size * model_config.seq_len / step_seconds, step_seconds, peak_memory_gib)
