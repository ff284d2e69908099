"""Normalised perplexity against hand computations; fast/slow evaluation with known models."""
import math

import pytest
import torch

from languini.books import END_OF_DOC, BooksDataset
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
