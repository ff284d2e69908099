"""Sequence-length stages (Shortformer's staged training): `--stages 128:0.25,512` trains the first quarter of
the run's tokens on sequences of 128 tokens and the rest on 512, with the same optimiser throughout.

How many sequences a step trains at each stage (`--stage_batch`):
- tokens (the default, as the Shortformer authors' fairseq `--max-tokens`): every step trains the same tokens,
  batch_size x the last stage's length, so a stage at a quarter of that length reads 4 sequences per stream:
  each stream's text of the stage is cut into 4 consecutive parts read side by side (rows_per_stream), a quarter
  of the tokens takes a quarter of the updates, and a carried state starts afresh where the rows change;
- sequences: batch_size sequences at every length, one per stream (a stage at a quarter of the length trains a
  quarter of the tokens per step).

Every stream continues at its running offset when the length changes (a pure function of the step, so resume is
exact anywhere). Each stage is charged at its own reference throughput: the accelerator time is the sum over
stages of the stage's tokens over that stage's tokens/s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

FORM = "LENGTH:FRACTION,...,LENGTH, e.g. 128:0.25,512 (the last stage takes the remaining tokens)"
STAGE_BATCHES = ("tokens", "sequences")


@dataclass(frozen=True)
class Stage:
    seq_len: int
    fraction: Fraction  # of the run's tokens


def parse(text: str | None, seq_len: int) -> tuple[Stage, ...]:
    """The stages of `--stages` (None: one stage at the model's seq_len); ValueError for anything else than
    FORM with fractions in (0, 1) summing below 1 and lengths from 1 to the model's seq_len."""
    if text is None or not text.strip():
        return (Stage(seq_len, Fraction(1)),)
    items = [item.strip() for item in text.split(",")]
    stages, used = [], Fraction(0)
    for i, item in enumerate(items):
        last = i == len(items) - 1
        length, _, fraction = item.partition(":")
        if last and fraction:
            raise ValueError(f"--stages {text}: the last stage takes the remaining tokens; write {length.strip()}, "
                             f"not {item}")
        if not last and not fraction:
            raise ValueError(f"--stages {text}: stage {item} needs its fraction of the tokens; write {FORM}")
        try:
            length = int(length)
            fraction = Fraction(fraction.strip()) if fraction else None
        except ValueError:
            raise ValueError(f"--stages {text}: {item!r} not understood; write {FORM}") from None
        if not 1 <= length <= seq_len:
            raise ValueError(f"--stages {text}: length {length} is not in 1..{seq_len} (the model's seq_len; "
                             "raise it with --seq_len)")
        if fraction is not None and not 0 < fraction < 1:
            raise ValueError(f"--stages {text}: fraction {item.partition(':')[2]} is not in (0, 1)")
        if fraction is not None:
            used += fraction
        stages.append(Stage(length, fraction if fraction is not None else 1 - used))
    if used >= 1:
        raise ValueError(f"--stages {text}: the fractions sum to {float(used):g}; they must leave the last stage "
                         "some tokens (sum below 1)")
    return tuple(stages)


def rows_per_stream(stages: tuple[Stage, ...], stage_batch: str = "tokens") -> tuple[int, ...]:
    """Sequences each stream contributes to a step at each stage: the last stage's length over the stage's with
    `tokens` (which must divide it), 1 with `sequences`."""
    if stage_batch not in STAGE_BATCHES:
        raise ValueError(f"--stage_batch must be one of {', '.join(STAGE_BATCHES)}, not {stage_batch!r}")
    if stage_batch == "sequences":
        return (1,) * len(stages)
    last = stages[-1].seq_len
    uneven = [s.seq_len for s in stages if last % s.seq_len]
    if uneven:
        raise ValueError(f"--stage_batch tokens keeps the tokens of a step fixed, so every stage's length must divide "
                         f"the last one's ({last}); {uneven} do not. Choose such lengths or --stage_batch sequences.")
    return tuple(last // s.seq_len for s in stages)


def steps_for_budget(stages: tuple[Stage, ...], seconds: float, tokens_per_second: list[float],
                     global_batch_size: int, rows: tuple[int, ...] | None = None) -> list[int]:
    """Optimiser steps per stage that spend `seconds` of reference time: the run's tokens N solve
    sum_i f_i N / v_i = seconds, and stage i takes round(f_i N / (batch * r_i * L_i)) steps, r_i its rows per
    stream (rows_per_stream; None: 1 each). One stage: the compute class's usual
    round(seconds * v / (batch * seq_len))."""
    rows = rows or (1,) * len(stages)
    if any(not v > 0 for v in tokens_per_second):
        raise ValueError(f"tokens_per_second must be positive, got {tokens_per_second}")
    tokens = Fraction(seconds) / sum(s.fraction / Fraction(v) for s, v in zip(stages, tokens_per_second, strict=True))
    steps = [math.floor(s.fraction * tokens / (global_batch_size * r * s.seq_len) + Fraction(1, 2))
             for s, r in zip(stages, rows, strict=True)]
    _check_steps(stages, steps, f"{seconds:g} s of reference time")
    return steps


def steps_for_total(stages: tuple[Stage, ...], total_steps: int, rows: tuple[int, ...] | None = None) -> list[int]:
    """`total_steps` (--max_steps) split so that stage i holds its fraction of the tokens: steps in proportion to
    f_i / (r_i L_i), rounded at the stage boundaries."""
    rows = rows or (1,) * len(stages)
    weights = [s.fraction / (s.seq_len * r) for s, r in zip(stages, rows, strict=True)]
    bounds = [math.floor(total_steps * sum(weights[:i + 1]) / sum(weights) + Fraction(1, 2))
              for i in range(len(stages))]
    steps = [b - a for a, b in zip([0] + bounds[:-1], bounds)]
    _check_steps(stages, steps, f"{total_steps} steps")
    return steps


def schedule_for_steps(text: str | None, seq_len: int, total_steps: int,
                       tokens_per_second: float | None = None, stage_batch: str = "tokens") -> "Schedule":
    """The schedule of `total_steps` steps for `--stages text`, every stage at `tokens_per_second`."""
    parsed = parse(text, seq_len)
    rows = rows_per_stream(parsed, stage_batch)
    return Schedule(tuple(s.seq_len for s in parsed), tuple(steps_for_total(parsed, total_steps, rows)),
                    (tokens_per_second,) * len(parsed), rows)


def _check_steps(stages, steps, budget: str) -> None:
    empty = [s.seq_len for s, n in zip(stages, steps) if n < 1]
    if empty:
        raise ValueError(f"{budget} leave no step for the stage(s) at length {empty} "
                         f"(steps per stage {steps}); choose a longer budget, a smaller batch or fewer stages")


@dataclass(frozen=True)
class Schedule:
    """Which length each step trains at, and the tokens and reference time spent before a step."""

    seq_lens: tuple[int, ...]
    steps: tuple[int, ...]
    tokens_per_second: tuple[float | None, ...]  # each stage's reference throughput; None: unknown
    rows: tuple[int, ...] | None = None  # sequences per stream and step at each stage (rows_per_stream); None: 1s

    def __post_init__(self):
        if self.rows is None:
            object.__setattr__(self, "rows", (1,) * len(self.seq_lens))

    @staticmethod
    def single(seq_len: int, steps: int, tokens_per_second: float | None = None) -> "Schedule":
        return Schedule((seq_len,), (steps,), (tokens_per_second,))

    def stage_at(self, step: int) -> int:
        """The index of the stage step `step` (0-based) belongs to (steps beyond the schedule: the last)."""
        start = 0
        for i, n in enumerate(self.steps):
            start += n
            if step < start:
                return i
        return len(self.steps) - 1

    def first_step(self, stage: int) -> int:
        return sum(self.steps[:stage])

    def resets_state_at(self, step: int) -> bool:
        """Whether a carried state starts afresh before step `step`: where the rows per stream change, a row no
        longer continues the text of the row it had (the start of a stage after one with other rows)."""
        stage = self.stage_at(step)
        return stage > 0 and step == self.first_step(stage) and self.rows[stage] != self.rows[stage - 1]

    @property
    def total_steps(self) -> int:
        return sum(self.steps)

    def steps_done(self, step: int) -> list[int]:
        """Steps of each stage among the first `step` steps (steps beyond the schedule count in the last stage)."""
        done, start = [], 0
        for i, n in enumerate(self.steps):
            last = i == len(self.steps) - 1
            done.append(max(step - start, 0) if last else min(max(step - start, 0), n))
            start += n
        return done

    def seq_len_at(self, step: int) -> int:
        """The length of step `step` (0-based)."""
        return self.seq_lens[self.stage_at(step)]

    def rows_at(self, step: int) -> int:
        """The sequences each stream contributes to step `step` (0-based)."""
        return self.rows[self.stage_at(step)]

    def offset(self, step: int) -> int:
        """Tokens each stream has read before step `step`: where its next sequence (or its stage's text) starts."""
        return sum(n * length * r for n, length, r in zip(self.steps_done(step), self.seq_lens, self.rows))

    def row_starts(self, step: int) -> list[int]:
        """Where each of a stream's rows_at(step) sequences of step `step` starts in the stream: the stage's text
        of each stream cut into that many consecutive parts, each read one length per step."""
        stage = self.stage_at(step)
        begin, length, r = self.offset(self.first_step(stage)), self.seq_lens[stage], self.rows[stage]
        within = step - self.first_step(stage)
        part = self.steps[stage] * length  # each row's share of the stage's text
        return [begin + j * part + within * length for j in range(r)]

    def tokens(self, step: int, global_batch_size: int) -> int:
        return global_batch_size * self.offset(step)

    def accelerator_seconds(self, step: int, global_batch_size: int) -> float | None:
        """Reference time of the first `step` steps: each stage's tokens at its own throughput (None if one of
        the stages begun has no throughput)."""
        seconds = 0.0
        for n, length, r, v in zip(self.steps_done(step), self.seq_lens, self.rows, self.tokens_per_second):
            if n and v is None:
                return None
            seconds += n * global_batch_size * r * length / v if n else 0.0
        return seconds

    def records(self, global_batch_size: int) -> list[dict]:
        """One dict per stage (for results.json and config.json)."""
        return [{"seq_len": length, "steps": n, "sequences_per_step": global_batch_size * r,
                 "tokens": n * global_batch_size * r * length, "tokens_per_second": v,
                 "accelerator_seconds": n * global_batch_size * r * length / v if v else None}
                for length, n, r, v in zip(self.seq_lens, self.steps, self.rows, self.tokens_per_second)]
