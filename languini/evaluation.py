"""Fast and slow evaluation (Languini paper, section 4.2.1), normalised perplexity (eq. 10), top-k accuracy.

Normalised perplexity = exp(total loss in nats / total length of the decoded target text), in two
conventions: `normalised_perplexity` divides by UTF-8 bytes, as the paper's equation says;
`normalised_perplexity_chars` divides by characters, counted as the official Languini code counts them (each
row of scored targets decoded on its own, the characters of the strings summed), which is how the paper's
tables were made. Characters are never more than bytes, so the character convention is the higher number;
they differ only on non-ASCII text.

Every row also gives the loss and perplexity by training frequency (languini/frequency.py), and with a neural cache
(languini/neural_cache.py) the slow evaluation gives a second row, mode slow_cache, from the same forward passes.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from languini import aux_loss, model_contract, model_parallel
from languini.books import (
    SLOW_EVAL_PROTOCOLS,
    SLOW_EVAL_SAMPLES,
    Book,
    distribute,
    eval_batches,
    first_windows,
    sliding_windows,
    token_count,
    window_plan,
)
from languini.frequency import FrequencyBuckets
from languini.model_contract import WithMemoryStats
from languini.neural_cache import CacheSettings, NeuralCache

TOP_K = (1, 10)  # the accuracies the official code reports


def normalised_perplexity(total_loss: float, total_length: int) -> float:
    return math.exp(total_loss / total_length)


def default_last_n(seq_len: int) -> int:
    """The slow eval's window step (and targets scored per window) when none is given: the paper's 128 of 512."""
    return max(seq_len // 4, 1)


def _stream_length(books: list[Book]) -> int:
    """Tokens of the books as one stream, end-of-document tokens included (read from the files' headers)."""
    return sum(token_count(b.path) + 1 for b in books)


def fast_positions(books: list[Book], batch_size: int, seq_len: int, max_batches: int | None) -> int:
    """Token positions (padding included) Evaluator.fast feeds the model on one process: for planning."""
    streams = [_stream_length([books[i] for i in stream])
               for stream in distribute([b.list_length for b in books], batch_size) if stream]
    if not streams:
        return 0
    n_batches = -(-(max(streams) - 1) // seq_len)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    return n_batches * len(streams) * seq_len


def slow_positions(books: list[Book], seq_len: int, max_windows: int | None, stateful: bool,
                   protocol: str = "last_n", last_n: int | None = None, sample: str = "spread") -> int:
    """Token positions (padding included) Evaluator.slow feeds the model on one process: for planning.

    protocol, last_n, sample: as Evaluator's slow_protocol, slow_last_n and slow_sample (a stateful model reads
    the split once)."""
    length = _stream_length(books)  # the split as one stream
    if stateful:  # read once in windows of seq_len
        windows = -(-(max(length, 1) - 1) // seq_len)
        if max_windows is not None:
            windows = min(windows, max_windows)
    elif sample == "first" and max_windows is not None:
        windows = len(first_windows(window_plan(length, seq_len, last_n or default_last_n(seq_len), "every_target"),
                                    max_windows * seq_len))
    else:
        windows = len(window_plan(length, seq_len, last_n or default_last_n(seq_len), protocol)[:max_windows])
    return windows * seq_len


@dataclass
class EvalResult:
    loss_sum: float  # nats, summed over scored targets
    tokens: int
    bytes: int
    chars: int | None = None  # None: no decoder to count them
    top1: int = 0  # scored targets that were the most likely token
    top10: int = 0  # ... among the ten most likely
    by_frequency: dict | None = None  # FrequencyBuckets.record: loss and perplexity by training frequency

    def as_dict(self) -> dict:
        frequency = {"by_frequency": self.by_frequency} if self.by_frequency is not None else {}
        if not self.tokens:  # nothing scored (a split shorter than the slow eval's first window): no numbers
            return {"loss": None, "normalised_perplexity": None, "normalised_perplexity_chars": None,
                    "top1_accuracy": None, "top10_accuracy": None, "scored_tokens": 0, "scored_bytes": 0,
                    "scored_chars": 0 if self.chars is not None else None, **frequency}
        return {**frequency, "loss": self.loss_sum / self.tokens,
                "normalised_perplexity": normalised_perplexity(self.loss_sum, max(self.bytes, 1)),
                "normalised_perplexity_chars": (normalised_perplexity(self.loss_sum, max(self.chars, 1))
                                                if self.chars is not None else None),
                "top1_accuracy": self.top1 / self.tokens, "top10_accuracy": self.top10 / self.tokens,
                "scored_tokens": self.tokens, "scored_bytes": self.bytes, "scored_chars": self.chars}


def score_batch(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                bytes_per_token: torch.Tensor, frequency: FrequencyBuckets | None = None) -> torch.Tensor:
    """Sums over the masked positions, as float64: loss (nats), tokens, bytes, top-1 and top-10 hits; then, given
    `frequency`, the loss and tokens of each frequency bucket."""
    logits, targets, mask = logits.float().flatten(0, 1), targets.flatten(), mask.flatten()
    loss = F.cross_entropy(logits, targets, reduction="none")
    ranked = logits.topk(min(max(TOP_K), logits.shape[-1]), dim=-1).indices == targets[:, None]
    # where, not multiply: a padded position must not turn the sum into nan
    sums = [torch.where(mask, loss, 0.0).sum(), mask.sum(), torch.where(mask, bytes_per_token[targets], 0).sum(),
            *((ranked[:, :k].any(dim=-1) & mask).sum() for k in TOP_K)]
    sums = torch.stack([s.double() for s in sums])
    return sums if frequency is None else torch.cat([sums, frequency.sums(loss, targets, mask)])


def count_chars(targets: torch.Tensor, mask: torch.Tensor, decode: Callable[[list[list[int]]], list[str]]) -> int:
    """Characters of the scored targets, each row decoded on its own (the official code's count)."""
    return sum(len(text) for text in decode([row[m].tolist() for row, m in zip(targets, mask)]))


class Evaluator:
    """Fast and slow evaluation of a model on the books of a split.

    decode: the tokenizer's decode (SentencePieceProcessor.decode) to count characters; None: no character
    count. slow_protocol, slow_last_n: how a stateless model's slow eval moves its windows and which
    targets it scores (books.window_plan; the paper: last_n, 128 of 512); None: seq_len // 4. frequency: the
    training-frequency buckets every row reports; cache: a neural cache the slow eval also reports
    (slow_and_cached).
    """

    def __init__(self, bytes_per_token: torch.Tensor, vocab_size: int, seq_len: int, device: torch.device,
                 batch_size: int = 16, max_batches: int | None = 500, slow_max_windows: int | None = None,
                 autocast=contextlib.nullcontext, rank: int = 0, world_size: int = 1,
                 decode: Callable[[list[list[int]]], list[str]] | None = None, slow_protocol: str = "last_n",
                 slow_last_n: int | None = None, frequency: FrequencyBuckets | None = None,
                 cache: CacheSettings | None = None, slow_sample: str = "spread"):
        self.bytes_per_token = bytes_per_token.to(device)
        self.frequency, self.cache = frequency, cache
        self.vocab_size, self.seq_len, self.device = vocab_size, seq_len, device
        self.batch_size, self.max_batches, self.slow_max_windows = batch_size, max_batches, slow_max_windows
        self.autocast, self.rank, self.world_size, self.decode = autocast, rank, world_size, decode
        self.slow_protocol, self.slow_sample = slow_protocol, slow_sample
        self.slow_last_n = slow_last_n or default_last_n(seq_len)
        if slow_protocol not in SLOW_EVAL_PROTOCOLS:  # checked now, not after hours of training
            raise ValueError(f"--slow_eval must be one of {', '.join(SLOW_EVAL_PROTOCOLS)}, not {slow_protocol!r}")
        if slow_sample not in SLOW_EVAL_SAMPLES:
            raise ValueError(f"--slow_eval_sample must be one of {', '.join(SLOW_EVAL_SAMPLES)}, not {slow_sample!r}")
        if not 0 < self.slow_last_n <= seq_len:
            raise ValueError(f"--slow_eval_last_n must be in 1..seq_len ({seq_len}), not {self.slow_last_n}")

    @torch.no_grad()
    def _run(self, model, batches, desc: str, cache: NeuralCache | None = None) -> list[EvalResult]:
        """Sum over batches; a stateful model carries its state from one batch to the next. Returns the result,
        and with a cache (whose batches are the stream's scored positions in order) the cache's result too."""
        n_sums = len(TOP_K) + 3 + (self.frequency.n_sums if self.frequency else 0)
        totals = torch.zeros(2 if cache else 1, n_sums + 1, dtype=torch.float64, device=self.device)  # then chars
        chars, state, inputs = 0, None, []
        hook = (model_contract.output_head(model, "--eval_cache_size").register_forward_hook(
            lambda head, args, output: inputs.append(args[0])) if cache else None)
        # a model-parallel model runs as many forward passes on every process (empty batches where one has none)
        batches = model_parallel.lockstep(batches, model, self.device)
        try:
            for x, y, mask in tqdm(batches, desc=desc, unit="batch", leave=False,
                                   disable=None if self.rank == 0 else True):
                if self.decode is not None:
                    chars += count_chars(y, mask, self.decode)
                x, y, mask = (t.to(self.device, non_blocking=True) for t in (x, y, mask))
                with self.autocast():
                    logits, state, _ = aux_loss.unpack(model(x, state))  # auxiliary losses are no part of perplexity
                totals[0, :-1] += score_batch(logits, y, mask, self.bytes_per_token, self.frequency)
                if cache:
                    mixed = cache.mix(inputs.pop()[mask], logits[mask], y[mask])
                    totals[1, :-1] += score_batch(mixed[None], y[mask][None], mask[mask][None], self.bytes_per_token,
                                                  self.frequency)
        finally:
            if hook is not None:
                hook.remove()
        totals[:, -1] = chars
        if self.world_size > 1:
            dist.all_reduce(totals)
        results = []
        for row in totals.tolist():
            loss, tokens, n_bytes, top1, top10 = row[:5]
            results.append(EvalResult(loss, int(tokens), int(n_bytes),
                                      int(row[-1]) if self.decode is not None else None, int(top1), int(top10),
                                      self.frequency.record(row[5:-1]) if self.frequency else None))
        return results

    def fast(self, model, books: list[Book]) -> EvalResult:
        """All predictions of up to max_batches batches of batch_size streams."""
        was_training = model.training
        model.eval()
        try:
            return self._run(model, eval_batches(books, self.vocab_size, self.batch_size, self.seq_len,
                                                 self.rank, self.world_size, self.max_batches), "fast eval")[0]
        finally:
            model.train(was_training)

    @property
    def first_targets(self) -> bool:
        """Whether a capped slow eval scores the split's first max_windows x seq_len targets, whatever the model
        (--slow_eval_sample first): a stateless model then reads them with the every_target protocol."""
        return self.slow_sample == "first" and self.slow_max_windows is not None

    def slow_protocol_for(self, stateful: bool) -> dict:
        """How slow() evaluates such a model: the protocol, the window, the targets scored per window, the cap
        on windows (None: the whole split; else a stream's first windows, or a stateless model's evenly spaced)
        and, when capped, the sample (`first`: the split's first max_windows x seq_len targets; `spread`)."""
        sample = {} if self.slow_max_windows is None else {
            "sample": "first" if stateful or self.first_targets else "spread"}
        if stateful:  # as the official LSTM eval.py: windows of seq_len, every target, the state carried
            return {"protocol": "stream", "window": self.seq_len, "last_n": self.seq_len,
                    "max_windows": self.slow_max_windows, **sample}
        return {"protocol": "every_target" if self.first_targets else self.slow_protocol, "window": self.seq_len,
                "last_n": self.slow_last_n, "max_windows": self.slow_max_windows, **sample}

    def _windows(self, books: list[Book], rank: int, world_size: int):
        return sliding_windows(books, self.vocab_size, self.seq_len, self.slow_last_n, self.batch_size, rank,
                               world_size, self.slow_max_windows,
                               "every_target" if self.first_targets else self.slow_protocol, self.slow_sample)

    def slow(self, model, books: list[Book], stateful: bool) -> EvalResult:
        """Batch 1 over the split as one stream: windows of seq_len moved by slow_last_n, scored as
        slow_protocol says; a stateful model instead reads the stream once, carrying its state."""
        return self.slow_and_cached(model, books, stateful)[0]

    def slow_and_cached(self, model, books: list[Book], stateful: bool) -> tuple[EvalResult, EvalResult | None]:
        """The slow eval, and from the same forward passes the slow eval with the neural cache (None without one).
        The cache reads the stream in order, so with it one process reads every window."""
        was_training = model.training
        model.eval()
        cache = NeuralCache(self.cache) if self.cache else None
        try:
            if stateful or cache:
                if self.world_size > 1 and self.rank > 0:  # one stream cannot be split; rank 0 reads it
                    batches = []
                elif stateful:
                    batches = eval_batches(books, self.vocab_size, 1, self.seq_len, 0, 1, self.slow_max_windows)
                else:
                    batches = self._windows(books, 0, 1)
            else:
                batches = self._windows(books, self.rank, self.world_size)
            results = self._run(model, batches, "slow eval", cache)
            return results[0], (results[1] if cache else None)
        finally:
            model.train(was_training)


def evaluate_splits(evaluator: Evaluator, model, dataset, splits: list[str], stateful: bool,
                    modes: tuple[str, ...] = ("fast", "slow"), write_row: Callable[[dict], None] | None = None,
                    say: Callable[[str], None] = print) -> dict:
    """Every mode on every split: {"eval": {mode: {split: row}}} and the memory statistics of models with a
    memory (over the fast eval, one pass over the split). Each slow row names its protocol; the rows given to
    write_row also carry the evaluation's wall time (`wall_seconds`, which results.json leaves out)."""
    cached = "slow" in modes and evaluator.cache is not None
    results = {mode: {} for mode in (*modes, *(("slow_cache",) if cached else ()))}
    memory_stats = {}
    for split in splits:
        books = dataset.books(split)
        rows, seconds = {}, {}
        if "fast" in modes:
            if isinstance(model, WithMemoryStats):
                model.reset_memory_stats()
            started = time.perf_counter()
            rows["fast"] = {**evaluator.fast(model, books).as_dict(), "max_batches": evaluator.max_batches}
            seconds["fast"] = time.perf_counter() - started
            if isinstance(model, WithMemoryStats):
                memory_stats[split] = model.memory_stats()
        if "slow" in modes:
            started = time.perf_counter()
            slow, with_cache = evaluator.slow_and_cached(model, books, stateful)
            rows["slow"] = {**slow.as_dict(), **evaluator.slow_protocol_for(stateful)}
            seconds["slow"] = time.perf_counter() - started
            if with_cache is not None:  # from the same forward passes, so the same wall time
                rows["slow_cache"] = {**with_cache.as_dict(), **evaluator.slow_protocol_for(stateful),
                                      **evaluator.cache.record()}
                seconds["slow_cache"] = seconds["slow"]
        for mode, row in rows.items():
            results[mode][split] = row
            if write_row is not None:
                write_row({"split": split, "mode": mode, **row, "wall_seconds": seconds[mode]})
        say(f"  {split:>12}: " + "  ".join(
            f"{mode} {_format(row['normalised_perplexity'])} / {_format(row['normalised_perplexity_chars'])}"
            for mode, row in rows.items()) + "  (normalised perplexity per byte / per character)")
    return {"eval": results, **({"memory_stats": memory_stats} if memory_stats else {})}


def describe_slow_protocol(protocol: dict) -> str:
    """One line on what a slow_protocol_for(...) dict means."""
    window, n, cap = protocol["window"], protocol["last_n"], protocol.get("max_windows")
    text = {"stream": f"the split read once in windows of {window}, the state carried",
            "last_n": f"windows of {window} moved by {n}, only their last {n} targets scored",
            "every_target": f"windows of {window} moved by {n}, their last {n} targets scored, the first "
                            "window's all"}[protocol["protocol"]]
    if cap is not None and protocol.get("sample") == "first":
        text += f"; the split's first {cap * window:,} targets at most (the same for every model)"
    elif cap is not None:
        text += (f"; at most the first {cap:,} windows" if protocol["protocol"] == "stream"
                 else f"; at most {cap:,} windows, evenly spaced over the split")
    return text


def _format(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
