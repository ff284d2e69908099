"""Perplexity by training frequency (J. Rae's thesis, Table 4.2): every scored target falls into a bucket by how
often its token id occurs in the training split, and each bucket gets its own loss and perplexity.

The thesis's buckets are > 10K, 1K-10K, 100-1K and < 100 occurrences in the training set of its Gutenberg corpus
(175,181,505 tokens, section 4.3.2). A split of another size gets the same buckets of relative frequency: the
thresholds are multiplied by (training tokens / 175,181,505), and every row says the thresholds it used. A
bucket holds the ids counted at least its lower and below its upper threshold. The counts (the training stream:
every book and its end-of-document token) are made once per dataset and kept beside it, in
`<books_<vocab>>/train_token_counts_<fingerprint>.npy`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from languini.atomic_write import write_atomically
from languini.books import END_OF_DOC, BooksDataset, DataError

THESIS_TRAIN_TOKENS = 175_181_505  # the Gutenberg training set of the thesis's Table 4.2
THESIS_THRESHOLDS = (10_000, 1_000, 100)  # its bucket edges, most frequent first
NAMES = (">10K", "1K-10K", "100-1K", "<100")


def count_tokens(dataset: BooksDataset, vocab_size: int, show_progress: bool = True) -> np.ndarray:
    """How often each token id occurs in the training stream: every train book and one end-of-document token each."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    books = dataset.books("train")
    # disable=None: a bar only on a terminal, so that redirected logs hold no bar fragments
    for book in tqdm(books, desc="counting training tokens", unit="book", disable=None if show_progress else True,
                     leave=False):
        tokens = np.load(book.path, mmap_mode="r")
        if tokens.size and int(tokens.max()) >= vocab_size:
            raise DataError(f"Token id {int(tokens.max())} >= vocab size {vocab_size} in {book.path}.")
        counts += np.bincount(tokens, minlength=vocab_size)
    counts[END_OF_DOC] += len(books)
    return counts


def counts_path(dataset: BooksDataset) -> Path:
    return dataset.dir / f"train_token_counts_{dataset.fingerprint}.npy"


def train_counts(dataset: BooksDataset, vocab_size: int, main: bool = True) -> np.ndarray:
    """The training split's token counts, read from beside the dataset or counted once and kept there (where the
    folder cannot be written, counted and not kept)."""
    path = counts_path(dataset)
    if path.exists():
        counts = np.load(path)
        if counts.shape == (vocab_size,):
            return counts
    counts = count_tokens(dataset, vocab_size, show_progress=main)
    try:
        write_atomically(path, lambda f: np.save(f, counts))
    except OSError as error:
        if main:
            print(f"Could not keep the training token counts in {path} ({error}); counted for this run only.")
    return counts


class FrequencyBuckets:
    """The bucket of every token id, and the per-bucket rows of an evaluation."""

    n_sums = 2 * len(NAMES)  # what sums() returns: the loss and the tokens of each bucket

    def __init__(self, counts: np.ndarray):
        self.train_tokens = int(counts.sum())
        self.scale = self.train_tokens / THESIS_TRAIN_TOKENS
        self.thresholds = tuple(t * self.scale for t in THESIS_THRESHOLDS)
        counts_t = torch.from_numpy(counts)
        # bucket 0 for ids counted at least the first threshold, ..., the last for ids below the last one
        self.token_bucket = sum((counts_t < t).long() for t in self.thresholds)
        self.vocab_ids = torch.bincount(self.token_bucket, minlength=len(NAMES)).tolist()

    @classmethod
    def of_dataset(cls, dataset: BooksDataset, vocab_size: int, main: bool = True) -> FrequencyBuckets:
        return cls(train_counts(dataset, vocab_size, main))

    def sums(self, loss: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per bucket, the summed loss of the masked targets, then their number: (2 * buckets,) float64."""
        if self.token_bucket.device != targets.device:
            self.token_bucket = self.token_bucket.to(targets.device)
        bucket = self.token_bucket[targets]
        n = len(NAMES)  # the buckets
        loss_sums = torch.zeros(n, dtype=torch.float64, device=loss.device)
        loss_sums.index_add_(0, bucket, torch.where(mask, loss, 0.0).double())
        return torch.cat([loss_sums, torch.bincount(bucket, weights=mask.double(), minlength=n)])

    def record(self, sums: list[float]) -> dict:
        """The by-frequency entry of an eval row from the bucket sums of sums()."""
        n = len(NAMES)
        edges = (math.inf, *self.thresholds, 0)
        buckets = []
        for i, name in enumerate(NAMES):
            loss_sum, tokens = sums[i], int(sums[n + i])
            loss = loss_sum / tokens if tokens else None
            buckets.append({"bucket": name, "train_count_at_least": edges[i + 1],
                            "train_count_below": edges[i] if i else None, "vocab_ids": self.vocab_ids[i],
                            "scored_tokens": tokens, "loss": loss,
                            "perplexity": math.exp(loss) if loss is not None else None})
        return {"train_tokens": self.train_tokens, "scale_to_thesis": self.scale, "buckets": buckets}
