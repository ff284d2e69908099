"""The space accounting of thesis 5.5 (state bits plus a backup Bloom filter at alpha / 2 for the false
negatives) against hand computations, and the whole evaluation on a stub model whose scores are known."""
import math

import pytest
import torch

from projects.neural_bloom import meta_learning, tasks


def test_backup_filter_accounting_by_hand():
    # 8 slots x 4 floats x 32 bits = 1024 bits; 3 misses at alpha 1%: the backup filter runs at 0.5%,
    # log2(1 / 0.005) / ln 2 = 7.643856 / 0.693147 = 11.027753 bits per element, 33.083260 bits in all
    point = meta_learning.Operating(alpha=0.01, threshold=0.0, state_bits=1024, false_negatives=3.0,
                                    model_fpr=0.004, negatives=50_000)
    assert point.backup_bits == pytest.approx(33.083260, abs=1e-5)
    assert point.total_bits == pytest.approx(1057.083260, abs=1e-5)
    assert point.combined_fpr == pytest.approx(0.004 + 0.996 * 0.005)  # eps + (1 - eps) delta = 0.00898


def test_threshold_passes_at_most_eps_of_the_negatives():
    scores = torch.arange(10.0)  # 0..9
    assert meta_learning.threshold_at(scores, 0.2) == 7.0  # 8 and 9 are above: 2 / 10
    assert meta_learning.threshold_at(scores, 0.25) == 7.0  # 2.5 negatives cannot pass, 2 do
    assert meta_learning.threshold_at(scores, 0.0) == 9.0  # none above


def test_operating_point_counts_misses_per_set_by_hand():
    members = [torch.tensor([0.9, 0.2, 0.7]), torch.tensor([0.1, 0.8])]  # 0.2 and 0.1 are missed at 0.5
    negatives = torch.tensor([0.6, 0.1, 0.3, 0.55])
    point = meta_learning.operating_point(0.05, 0.5, 64, members, negatives)
    assert point.false_negatives == 1.0  # (1 + 1) / 2 sets
    assert point.model_fpr == 0.5  # 0.6 and 0.55 of 4
    assert point.total_bits == pytest.approx(64 + math.log2(40) / math.log(2))  # 64 + 7.6889


class StubModel:
    """Members at positions 0 and 1 of their set score -10 (two misses per set), other members +10, non-members
    their last byte / 255 (below 1)."""

    def write(self, x_set):
        return x_set

    def read(self, state, x_query):
        stored = {bytes(row.tolist()): i for i, row in enumerate(state[0])}
        out = [(-10.0 if stored[key] < 2 else 10.0) if key in stored else float(row[-1]) / 255
               for row in x_query[0] for key in [bytes(row.tolist())]]
        return torch.tensor(out)[None]

    def state_floats(self, n):
        return 6


def test_evaluation_accounts_for_exactly_the_misses():
    words = [f"w{i:03d}" for i in range(200)]
    universe = tasks.word_universe(words, 4)
    task = tasks.DatabaseTask(universe, universe, 20)
    points, draws = meta_learning.evaluate(StubModel(), task, 20, [0.05, 0.01], test_sets=3,
                                           negatives=3000, check_sets=0)
    assert len(draws) == 3 and all(len(q) == 1000 for _, q in draws)
    for alpha, point in points.items():
        assert point.false_negatives == 2.0
        assert point.state_bits == 6 * 32
        assert point.total_bits == pytest.approx(192 + 2 * math.log2(2 / alpha) / math.log(2))
        assert point.model_fpr <= alpha / 2
        assert point.negatives == 3000
