"""The timing harness against a clock it is handed: known sleeps, known phases."""
import time

import pytest
import torch

from languini.timing import Timing, time_calls, time_phases


def test_phases_are_split_at_the_marks_and_warmup_is_untimed():
    calls = []

    def run_once(mark):
        calls.append("run")
        time.sleep(0.002)
        mark()
        time.sleep(0.004)
        mark()

    runs = time_phases(run_once, torch.device("cpu"), repeats=3, warmup=2, before_each=lambda: calls.append("before"))
    assert calls == ["before", "run"] * 5
    assert len(runs) == 3 and all(len(run) == 2 for run in runs)
    # a sleep lasts at least as long as asked; the second phase asked for twice the first
    assert all(first >= 0.002 and second >= 0.004 for first, second in runs)


def test_a_process_clock_does_not_count_sleeping():
    def run_once(mark):
        time.sleep(0.05)
        mark()

    wall = time_phases(run_once, torch.device("cpu"), repeats=1, warmup=0)
    process = time_phases(run_once, torch.device("cpu"), repeats=1, warmup=0, cpu_clock=time.process_time)
    assert wall[0][0] >= 0.05 and process[0][0] < 0.02


def test_median_and_spread_by_hand():
    timing = Timing((0.3, 0.1, 0.2, 0.5))
    assert timing.median == pytest.approx(0.25) and timing.spread == pytest.approx(0.4 / 0.25)
    assert Timing((2.0, 2.0)).spread == 0.0


def test_time_calls_times_each_call():
    counter = []
    timing = time_calls(lambda: counter.append(time.sleep(0.001)), torch.device("cpu"), repeats=4, warmup=1)
    assert len(counter) == 5 and len(timing.seconds) == 4 and min(timing.seconds) >= 0.001
