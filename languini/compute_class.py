"""Compute classes: a training budget given as time on the reference hardware.

A compute class of h hours allows T = 3600 * h * v tokens, where v is the model
config's throughput (tokens/s) on the reference hardware (Languini paper, section 3.1).
The number of optimiser steps is T / (global batch size * sequence length), rounded to
the nearest integer: the step counts the authors published with their GPT configs (18,265 / 36,529 /
36,529 / 21,908 / 43,817 for 6h..96h, in the official code's languini/projects/gpt/README.md) are all
nearest-rounded, not floored.

What a class buys one model (its throughput row, stages, evaluation, wall time) is planned in languini.plan.
"""

import math
import re
from fractions import Fraction

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
    if isinstance(name, str) and name.strip().endswith("M"):
        raise ValueError(f"compute class {name!r}: write minutes with a lower-case m ({name.strip()[:-1]}m); an "
                         "upper-case M reads as million as easily as minutes")
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
