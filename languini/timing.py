"""One timing harness for the benchmarks and the throughput measurement.

Untimed warm-up runs, then timed runs, each split into phases at the marks it sets. On a GPU the marks are
CUDA events (no synchronisation inside the timed runs; one at the end), on a CPU time.perf_counter (CPU
kernels are synchronous). Report the median and the spread of the runs, not one run.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed run."""
    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median of the runs: 0 when every run took the same time."""
        return (max(self.seconds) - min(self.seconds)) / self.median


def _stamp(device: torch.device, cpu_clock: Callable):
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return cpu_clock()


def _seconds_between(start, end, device: torch.device) -> float:
    return start.elapsed_time(end) / 1000 if device.type == "cuda" else end - start


def time_phases(run_once: Callable, device: torch.device, repeats: int, warmup: int,
                before_each: Callable | None = None, cpu_clock: Callable = time.perf_counter) -> list[list[float]]:
    """Seconds of each phase of each of `repeats` timed runs after `warmup` untimed ones.

    run_once(mark) runs once and calls mark() at the end of every phase; before_each() runs before every run,
    untimed (fresh inputs, a cache flush). cpu_clock: the CPU's clock (time.process_time: the seconds this process
    ran, not those other processes took from it on a shared machine; meaningful with one thread).
    """
    device = torch.device(device)
    for _ in range(warmup):
        if before_each:
            before_each()
        run_once(lambda: None)
    runs = []
    for _ in range(repeats):
        if before_each:
            before_each()
        stamps = [_stamp(device, cpu_clock)]
        run_once(lambda: stamps.append(_stamp(device, cpu_clock)))
        runs.append(stamps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return [[_seconds_between(a, b, device) for a, b in zip(s, s[1:])] for s in runs]


def time_calls(fn: Callable, device: torch.device, repeats: int, warmup: int) -> Timing:
    """The seconds of `repeats` calls of fn() after `warmup` untimed ones."""
    def run_once(mark):
        fn()
        mark()

    return Timing(tuple(run[0] for run in time_phases(run_once, device, repeats, warmup)))
