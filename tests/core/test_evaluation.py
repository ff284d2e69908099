"""Normalised perplexity against hand computations; fast/slow evaluation with known models."""
import math

import pytest
import torch

from languini.books import END_OF_DOC, BooksDataset
from languini import evaluation
from languini.evaluation import Evaluator, normalised_perplexity, scored_loss
from tests.core.test_books import VOCAB, book, write_official


def test_normalised_perplexity_by_hand():
    # Two predictions with probabilities 1/2 and 1/4 over 3 + 1 bytes: exp((ln 2 + ln 4) / 4) = 8 ** (1/4).
    assert normalised_perplexity(math.log(2) + math.log(4), 4) == pytest.approx(8 ** 0.25)


def test_scored_loss_by_hand():
    # Vocab of 4; position 0 predicts token 1 with p = 1/2, position 1 is masked out, position 2 uniform.
    logits = torch.log(torch.tensor([[[1 / 6, 1 / 2, 1 / 6, 1 / 6], [1, 0, 0, 0], [1 / 4] * 4]]))
    targets = torch.tensor([[1, 2, 3]])
    mask = torch.tensor([[True, False, True]])
    bytes_per_token = torch.tensor([0, 3, 5, 1])
    loss, tokens, n_bytes = scored_loss(logits, targets, mask, bytes_per_token)
    assert loss.item() == pytest.approx(math.log(2) + math.log(4))
    assert tokens.item() == 2 and n_bytes.item() == 3 + 1


class Uniform(torch.nn.Module):
    def forward(self, x, state=None):
        return torch.zeros(*x.shape, VOCAB), None


class SeenBefore(torch.nn.Module):
    """Uniform on its first batch; afterwards (state carried) it predicts `previous token + 1` with certainty."""

    def forward(self, x, state=None):
        logits = torch.zeros(*x.shape, VOCAB)
        if state is not None:
            logits = torch.full((*x.shape, VOCAB), -30.0).scatter_(2, ((x + 1) % VOCAB).unsqueeze(-1), 30.0)
        return logits, torch.ones(1)


@pytest.fixture
def data(tmp_path):
    write_official(tmp_path, {"train": [book(10, 5)], "test": [book(100, 9), book(200, 4), book(300, 6)]})
    return BooksDataset(tmp_path, VOCAB)


def test_uniform_model_scores_log_vocab_per_token(data):
    bytes_per_token = torch.full((VOCAB,), 2)
    bytes_per_token[END_OF_DOC] = 0  # control tokens decode to no text
    ev = Evaluator(bytes_per_token, VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=2)
    # Fast: streams [book 9 tokens] and [book 4, book 6] -> 10 and 12 tokens with separators, 9 + 11 targets,
    # 3 of them end-of-document. Slow: one stream of 22 tokens, 21 targets.
    for result, targets in ((ev.fast(Uniform(), data.books("test")), 20),
                            (ev.slow(Uniform(), data.books("test"), stateful=False), 21)):
        assert result.tokens == targets
        assert result.loss_sum == pytest.approx(targets * math.log(VOCAB))
        assert result.bytes == 2 * (targets - 3)


def test_slow_eval_of_a_stateful_model_carries_its_state(data):
    ev = Evaluator(torch.ones(VOCAB, dtype=torch.long), VOCAB, seq_len=4, device=torch.device("cpu"))
    result = ev.slow(SeenBefore(), data.books("test"), stateful=True)
    # Stream 100..108 EOD 200..203 EOD 300..305 EOD: the first window (4 targets) is uniform; later a target
    # is wrong only at a book boundary: (108, EOD), (EOD, 200), (203, EOD), (EOD, 300), (305, EOD): 5 x 60 nats.
    assert result.tokens == 21
    assert result.loss_sum == pytest.approx(4 * math.log(VOCAB) + 5 * 60, rel=1e-4)


class CountsPositions(torch.nn.Module):
    """Uniform; counts the token positions it reads (padding included), optionally carrying a state."""

    def __init__(self, stateful: bool, vocab: int = VOCAB):
        super().__init__()
        self.stateful, self.vocab, self.positions = stateful, vocab, 0

    def forward(self, x, state=None):
        self.positions += x.numel()
        return torch.zeros(*x.shape, self.vocab), torch.ones(1) if self.stateful else None


@pytest.mark.parametrize("max_batches, max_windows, fast, slow, slow_stateful", [
    # Streams [book 9 tokens] and [book 4, book 6] (10 and 12 tokens with separators): ceil(11 / 4) = 3 batches
    # of 2 x 4. Slow: one stream of 22 tokens; windows end at 4, 5, ..., 21 (stride 4 // 4 = 1): 18 windows of 4;
    # a stateful model reads ceil(21 / 4) = 6 windows of 4.
    (None, None, 3 * 2 * 4, 18 * 4, 6 * 4),
    (2, 5, 2 * 2 * 4, 5 * 4, 5 * 4),
])
def test_planned_positions_by_hand_and_as_evaluated(data, max_batches, max_windows, fast, slow, slow_stateful):
    books = data.books("test")
    assert evaluation.fast_positions(books, 2, 4, max_batches) == fast
    assert evaluation.slow_positions(books, 4, max_windows, stateful=False) == slow
    assert evaluation.slow_positions(books, 4, max_windows, stateful=True) == slow_stateful
    # What the evaluator really feeds a model: the plan must count the same work.
    ev = Evaluator(torch.ones(VOCAB), VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=2,
                   max_batches=max_batches, slow_max_windows=max_windows)
    for model, run, expected in ((CountsPositions(False), lambda m: ev.fast(m, books), fast),
                                 (CountsPositions(False), lambda m: ev.slow(m, books, stateful=False), slow),
                                 (CountsPositions(True), lambda m: ev.slow(m, books, stateful=True), slow_stateful)):
        run(model)
        assert model.positions == expected


def test_planned_positions_of_longer_windows_match_the_evaluator(default_corpus_root):
    # Windows of 128 moved by 32 over a split of the default corpus: a stride that does not divide the split.
    books = BooksDataset(default_corpus_root, 2048).books("valid")
    ev = Evaluator(torch.ones(2048), 2048, seq_len=128, device=torch.device("cpu"), batch_size=16)
    model = CountsPositions(False, vocab=2048)
    ev.slow(model, books, stateful=False)
    assert model.positions == evaluation.slow_positions(books, 128, None, stateful=False)
