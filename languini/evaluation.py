"""Fast and slow evaluation (Languini paper, section 4.2.1), normalised perplexity (eq. 10), top-k accuracy.

Normalised perplexity = exp(total loss in nats / total length of the decoded target text), in two
conventions: `normalised_perplexity` divides by UTF-8 bytes, as the paper's equation says;
`normalised_perplexity_chars` divides by characters, counted as the official Languini code counts them (each
row of scored targets decoded on its own, the characters of the strings summed), which is how the paper's
tables were made. Characters are never more than bytes, so the character convention is the higher number;
they differ only on non-ASCII text.
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

from languini import aux_loss, model_parallel
from languini.books import (
    SLOW_EVAL_PROTOCOLS,
    Book,
    distribute,
    eval_batches,
    sliding_windows,
    token_count,
    window_plan,
)
from languini.model_contract import WithMemoryStats

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
                   protocol: str = "last_n", last_n: int | None = None) -> int:
    """Token positions (padding included) Evaluator.slow feeds the model on one process: for planning.

    protocol, last_n: as Evaluator's slow_protocol and slow_last_n (a stateful model reads the split once)."""
    length = _stream_length(books)  # the split as one stream
    if stateful:  # read once in windows of seq_len
        windows = -(-(max(length, 1) - 1) // seq_len)
        if max_windows is not None:
            windows = min(windows, max_windows)
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

    def as_dict(self) -> dict:
        if not self.tokens:  # nothing scored (a split shorter than the slow eval's first window): no numbers
            return {"loss": None, "normalised_perplexity": None, "normalised_perplexity_chars": None,
                    "top1_accuracy": None, "top10_accuracy": None, "scored_tokens": 0, "scored_bytes": 0,
                    "scored_chars": 0 if self.chars is not None else None}
        return {"loss": self.loss_sum / self.tokens,
                "normalised_perplexity": normalised_perplexity(self.loss_sum, max(self.bytes, 1)),
                "normalised_perplexity_chars": (normalised_perplexity(self.loss_sum, max(self.chars, 1))
                                                if self.chars is not None else None),
                "top1_accuracy": self.top1 / self.tokens, "top10_accuracy": self.top10 / self.tokens,
                "scored_tokens": self.tokens, "scored_bytes": self.bytes, "scored_chars": self.chars}


def score_batch(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                bytes_per_token: torch.Tensor) -> torch.Tensor:
    """Sums over the masked positions, as float64: loss (nats), tokens, bytes, top-1 and top-10 hits."""
    logits, targets, mask = logits.float().flatten(0, 1), targets.flatten(), mask.flatten()
    loss = F.cross_entropy(logits, targets, reduction="none")
    ranked = logits.topk(min(max(TOP_K), logits.shape[-1]), dim=-1).indices == targets[:, None]
    # where, not multiply: a padded position must not turn the sum into nan
    sums = [torch.where(mask, loss, 0.0).sum(), mask.sum(), torch.where(mask, bytes_per_token[targets], 0).sum(),
            *((ranked[:, :k].any(dim=-1) & mask).sum() for k in TOP_K)]
    return torch.stack([s.double() for s in sums])


def count_chars(targets: torch.Tensor, mask: torch.Tensor, decode: Callable[[list[list[int]]], list[str]]) -> int:
    """Characters of the scored targets, each row decoded on its own (the official code's count)."""
    return sum(len(text) for text in decode([row[m].tolist() for row, m in zip(targets, mask)]))


class Evaluator:
    """Fast and slow evaluation of a model on the books of a split.

    decode: the tokenizer's decode (SentencePieceProcessor.decode) to count characters; None: no character
    count. slow_protocol, slow_last_n: how a stateless model's slow eval moves its windows and which
    targets it scores (books.window_plan; the paper: last_n, 128 of 512); None: seq_len // 4.
    """

    def __init__(self, bytes_per_token: torch.Tensor, vocab_size: int, seq_len: int, device: torch.device,
                 batch_size: int = 16, max_batches: int | None = 500, slow_max_windows: int | None = None,
                 autocast=contextlib.nullcontext, rank: int = 0, world_size: int = 1,
                 decode: Callable[[list[list[int]]], list[str]] | None = None, slow_protocol: str = "last_n",
                 slow_last_n: int | None = None):
        self.bytes_per_token = bytes_per_token.to(device)
        self.vocab_size, self.seq_len, self.device = vocab_size, seq_len, device
        self.batch_size, self.max_batches, self.slow_max_windows = batch_size, max_batches, slow_max_windows
        self.autocast, self.rank, self.world_size, self.decode = autocast, rank, world_size, decode
        self.slow_protocol = slow_protocol
        self.slow_last_n = slow_last_n or default_last_n(seq_len)
        if slow_protocol not in SLOW_EVAL_PROTOCOLS:  # checked now, not after hours of training
            raise ValueError(f"--slow_eval must be one of {', '.join(SLOW_EVAL_PROTOCOLS)}, not {slow_protocol!r}")
        if not 0 < self.slow_last_n <= seq_len:
            raise ValueError(f"--slow_eval_last_n must be in 1..seq_len ({seq_len}), not {self.slow_last_n}")

    @torch.no_grad()
    def _run(self, model, batches, desc: str) -> EvalResult:
        """Sum over batches; a stateful model carries its state from one batch to the next."""
        totals = torch.zeros(len(TOP_K) + 4, dtype=torch.float64, device=self.device)  # the sums, then chars
        chars, state = 0, None
        # a model-parallel model runs as many forward passes on every process (empty batches where one has none)
        batches = model_parallel.lockstep(batches, model, self.device)
        for x, y, mask in tqdm(batches, desc=desc, unit="batch", leave=False, disable=None if self.rank == 0 else True):
            if self.decode is not None:
                chars += count_chars(y, mask, self.decode)
            x, y, mask = (t.to(self.device, non_blocking=True) for t in (x, y, mask))
            with self.autocast():
                logits, state, _ = aux_loss.unpack(model(x, state))  # auxiliary losses are no part of perplexity
            totals[:-1] += score_batch(logits, y, mask, self.bytes_per_token)
        totals[-1] = chars
        if self.world_size > 1:
            dist.all_reduce(totals)
        loss, tokens, n_bytes, top1, top10, chars = totals.tolist()
        return EvalResult(loss, int(tokens), int(n_bytes), int(chars) if self.decode is not None else None,
                          int(top1), int(top10))

    def fast(self, model, books: list[Book]) -> EvalResult:
        """All predictions of up to max_batches batches of batch_size streams."""
        was_training = model.training
        model.eval()
        try:
            return self._run(model, eval_batches(books, self.vocab_size, self.batch_size, self.seq_len,
                                                 self.rank, self.world_size, self.max_batches), "fast eval")
        finally:
            model.train(was_training)

    def slow_protocol_for(self, stateful: bool) -> dict:
        """How slow() evaluates such a model: the protocol, the window, the targets scored per window and the cap
        on windows (None: the whole split; else a stream's first windows, or a stateless model's evenly spaced)."""
        if stateful:  # as the official LSTM eval.py: windows of seq_len, every target, the state carried
            return {"protocol": "stream", "window": self.seq_len, "last_n": self.seq_len,
                    "max_windows": self.slow_max_windows}
        return {"protocol": self.slow_protocol, "window": self.seq_len, "last_n": self.slow_last_n,
                "max_windows": self.slow_max_windows}

    def slow(self, model, books: list[Book], stateful: bool) -> EvalResult:
        """Batch 1 over the split as one stream: windows of seq_len moved by slow_last_n, scored as
        slow_protocol says; a stateful model instead reads the stream once, carrying its state."""
        was_training = model.training
        model.eval()
        try:
            if stateful:
                if self.world_size > 1 and self.rank > 0:  # one stream cannot be split; rank 0 reads it
                    batches = []
                else:
                    batches = eval_batches(books, self.vocab_size, 1, self.seq_len, 0, 1, self.slow_max_windows)
                return self._run(model, batches, "slow eval")
            return self._run(model, sliding_windows(books, self.vocab_size, self.seq_len, self.slow_last_n,
                                                    self.batch_size, self.rank, self.world_size,
                                                    self.slow_max_windows, self.slow_protocol), "slow eval")
        finally:
            model.train(was_training)


def evaluate_splits(evaluator: Evaluator, model, dataset, splits: list[str], stateful: bool,
                    modes: tuple[str, ...] = ("fast", "slow"), write_row: Callable[[dict], None] | None = None,
                    say: Callable[[str], None] = print) -> dict:
    """Every mode on every split: {"eval": {mode: {split: row}}} and the memory statistics of models with a
    memory (over the fast eval, one pass over the split). Each slow row names its protocol; the rows given to
    write_row also carry the evaluation's wall time (`wall_seconds`, which results.json leaves out)."""
    results = {mode: {} for mode in modes}
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
            rows["slow"] = {**evaluator.slow(model, books, stateful).as_dict(), **evaluator.slow_protocol_for(stateful)}
            seconds["slow"] = time.perf_counter() - started
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
    if cap is not None:
        text += (f"; at most the first {cap:,} windows" if protocol["protocol"] == "stream"
                 else f"; at most {cap:,} windows, evenly spaced over the split")
    return text


def _format(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
