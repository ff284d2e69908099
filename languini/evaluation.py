"""Fast and slow evaluation (Languini paper, section 4.2.1) and normalised perplexity (eq. 10).

Normalised perplexity = exp(total loss in nats / total UTF-8 bytes of the decoded target text). We count
bytes, as the paper's equation says; the official code counts characters, which differs on non-ASCII text.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from languini.books import Book, distribute, eval_batches, sliding_windows


def normalised_perplexity(total_loss: float, total_bytes: int) -> float:
    return math.exp(total_loss / total_bytes)


def fast_positions(books: list[Book], batch_size: int, seq_len: int, max_batches: int | None) -> int:
    """Token positions (padding included) Evaluator.fast feeds the model on one process: for planning."""
    streams = [sum(books[i].length + 1 for i in stream) for stream in distribute([b.length for b in books], batch_size)
               if stream]
    if not streams:
        return 0
    n_batches = -(-(max(streams) - 1) // seq_len)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    return n_batches * len(streams) * seq_len


def slow_positions(books: list[Book], seq_len: int, max_windows: int | None, stateful: bool) -> int:
    """Token positions (padding included) Evaluator.slow feeds the model on one process: for planning."""
    length = sum(b.length + 1 for b in books)  # the split as one stream, end-of-document tokens included
    if length < 2:
        return 0
    if stateful:  # read once in windows of seq_len
        windows = -(-(length - 1) // seq_len)
    else:  # the first window ends at min(seq_len, last target), each later one `stride` further
        last, stride = length - 1, max(seq_len // 4, 1)
        windows = 1 + -(-(last - min(seq_len, last)) // stride)
    if max_windows is not None:
        windows = min(windows, max_windows)
    return windows * seq_len


@dataclass
class EvalResult:
    loss_sum: float  # nats, summed over scored targets
    tokens: int
    bytes: int

    def as_dict(self) -> dict:
        return {"loss": self.loss_sum / max(self.tokens, 1),
                "normalised_perplexity": normalised_perplexity(self.loss_sum, max(self.bytes, 1)),
                "scored_tokens": self.tokens, "scored_bytes": self.bytes}


def scored_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, bytes_per_token: torch.Tensor):
    """Summed loss, scored tokens and their bytes over the masked positions."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    mask = mask.flatten()
    # where, not multiply: a padded position must not turn the sum into nan
    return (torch.where(mask, loss, 0.0).sum(), mask.sum(),
            torch.where(mask, bytes_per_token[targets.flatten()], 0).sum())


class Evaluator:
    def __init__(self, bytes_per_token: torch.Tensor, vocab_size: int, seq_len: int, device: torch.device,
                 batch_size: int = 16, max_batches: int | None = 500, slow_max_windows: int | None = None,
                 autocast=contextlib.nullcontext, rank: int = 0, world_size: int = 1):
        self.bytes_per_token = bytes_per_token.to(device)
        self.vocab_size, self.seq_len, self.device = vocab_size, seq_len, device
        self.batch_size, self.max_batches, self.slow_max_windows = batch_size, max_batches, slow_max_windows
        self.autocast, self.rank, self.world_size = autocast, rank, world_size

    @torch.no_grad()
    def _run(self, model, batches, desc: str) -> EvalResult:
        """Sum the loss over batches; a stateful model carries its state from one batch to the next."""
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        state = None
        for x, y, mask in tqdm(batches, desc=desc, unit="batch", leave=False, disable=self.rank != 0):
            x, y, mask = (t.to(self.device, non_blocking=True) for t in (x, y, mask))
            with self.autocast():
                logits, state = model(x, state)
            totals += torch.stack(scored_loss(logits, y, mask, self.bytes_per_token)).double()
        if self.world_size > 1:
            dist.all_reduce(totals)
        loss, tokens, n_bytes = totals.tolist()
        return EvalResult(loss, int(tokens), int(n_bytes))

    def fast(self, model, books: list[Book]) -> EvalResult:
        """All predictions of up to max_batches batches of batch_size streams."""
        was_training = model.training
        model.eval()
        try:
            return self._run(model, eval_batches(books, self.vocab_size, self.batch_size, self.seq_len,
                                                 self.rank, self.world_size, self.max_batches), "fast eval")
        finally:
            model.train(was_training)

    def slow(self, model, books: list[Book], stateful: bool) -> EvalResult:
        """Batch 1 over the split as one stream: windows of seq_len moved by seq_len/4, only the last quarter
        scored (the paper's 512/128); a stateful model instead reads the stream once, carrying its state."""
        was_training = model.training
        model.eval()
        try:
            if stateful:
                if self.world_size > 1 and self.rank > 0:  # one stream cannot be split; rank 0 reads it
                    batches = []
                else:
                    batches = eval_batches(books, self.vocab_size, 1, self.seq_len, 0, 1, self.slow_max_windows)
                return self._run(model, batches, "slow eval")
            return self._run(model, sliding_windows(books, self.vocab_size, self.seq_len, max(self.seq_len // 4, 1),
                                                    self.batch_size, self.rank, self.world_size,
                                                    self.slow_max_windows), "slow eval")
        finally:
            model.train(was_training)
