"""Perplexity by training frequency (languini/frequency.py) against a brute-force count and a loop over targets."""
import math
from collections import Counter

import numpy as np
import pytest
import torch

from languini import frequency
from languini.books import END_OF_DOC, BooksDataset
from languini.evaluation import score_batch
from tests.core.test_books import VOCAB, write_official


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(0)
    # Zipf-like ids below 3000: counts from thousands down to none
    books = [np.minimum(rng.zipf(1.3, size=n), 2999) for n in (4000, 2500, 6000)]
    write_official(tmp_path, {"train": books, "test": [np.arange(5, 50)]})
    return BooksDataset(tmp_path, VOCAB), books


def brute_force_buckets(books, scale):
    counts = Counter(int(t) for b in books for t in b)
    counts[END_OF_DOC] += len(books)  # each book ends with one in the training stream
    edges = [10_000 * scale, 1_000 * scale, 100 * scale]
    names = []
    for token in range(VOCAB):
        c = counts[token]
        names.append(">10K" if c >= edges[0] else "1K-10K" if c >= edges[1] else "100-1K" if c >= edges[2] else "<100")
    return counts, names


def test_buckets_match_a_brute_force_count_and_are_kept_beside_the_dataset(dataset, monkeypatch):
    ds, books = dataset
    train_tokens = sum(len(b) + 1 for b in books)
    # a thesis-sized split 100 times larger than ours: the thresholds become 100, 10 and 1 occurrences
    monkeypatch.setattr(frequency, "THESIS_TRAIN_TOKENS", train_tokens * 100)
    buckets = frequency.FrequencyBuckets.of_dataset(ds, VOCAB)
    counts, names = brute_force_buckets(books, 0.01)
    assert buckets.train_tokens == train_tokens and buckets.thresholds == pytest.approx((100, 10, 1))
    assert [frequency.NAMES[b] for b in buckets.token_bucket.tolist()] == names
    assert buckets.vocab_ids == [names.count(n) for n in frequency.NAMES] and min(buckets.vocab_ids) > 0
    assert frequency.counts_path(ds).parent == ds.dir and frequency.counts_path(ds).exists()
    monkeypatch.setattr(frequency, "count_tokens", lambda *a, **k: pytest.fail("counted twice"))
    again = frequency.FrequencyBuckets.of_dataset(ds, VOCAB)
    assert torch.equal(again.token_bucket, buckets.token_bucket)


def test_per_bucket_loss_against_a_loop_over_targets(dataset, monkeypatch):
    ds, books = dataset
    monkeypatch.setattr(frequency, "THESIS_TRAIN_TOKENS", sum(len(b) + 1 for b in books) * 100)
    buckets = frequency.FrequencyBuckets.of_dataset(ds, VOCAB)
    _, names = brute_force_buckets(books, 0.01)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, VOCAB, generator=generator)
    # targets from every bucket: frequent ids, rare ones and ids never seen in training
    targets = torch.tensor([1, 2, 3, 7, 30, 200, 900, 2500, 5000, 16000] * 15).view(3, 50)
    mask = torch.rand(3, 50, generator=generator) > 0.2
    sums = score_batch(logits, targets, mask, torch.ones(VOCAB), buckets)
    record = buckets.record(sums[5:].tolist())
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    for row in record["buckets"]:
        losses = [-log_probs[b, t, targets[b, t]].item() for b in range(3) for t in range(50)
                  if mask[b, t] and names[targets[b, t]] == row["bucket"]]
        assert row["scored_tokens"] == len(losses) > 0
        assert row["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-6)
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"]))
    assert sum(r["scored_tokens"] for r in record["buckets"]) == int(mask.sum()) == sums[1]
    assert record["buckets"][0]["train_count_below"] is None and record["buckets"][-1]["train_count_at_least"] == 0
