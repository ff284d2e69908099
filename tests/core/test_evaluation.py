"""Normalised perplexity against hand computations; fast/slow evaluation with known models."""
import math

import numpy as np
import pytest
import torch

from languini.books import END_OF_DOC, BooksDataset
from languini import evaluation
from languini.evaluation import Evaluator, count_chars, normalised_perplexity, score_batch
from tests.core.test_books import VOCAB, book, write_official


def test_normalised_perplexity_by_hand():
    # Two predictions with probabilities 1/2 and 1/4 over 3 + 1 bytes: exp((ln 2 + ln 4) / 4) = 8 ** (1/4).
    assert normalised_perplexity(math.log(2) + math.log(4), 4) == pytest.approx(8 ** 0.25)


def test_score_batch_by_hand():
    # Vocab of 12; position 0 predicts token 1 with p = 1/2 (its most likely), position 1 is masked out,
    # position 2 gives its target 3 the 11th largest probability, position 3 the 2nd largest.
    p0 = [0.05] * 12
    p0[1] = 0.45
    p2 = [0.1] * 10 + [0.0, 0.0]
    p2[3], p2[10] = 0.0, 0.1  # probability 0 for token 3: only one other token is also 0
    p3 = [0.05] * 12
    p3[0], p3[3] = 0.3, 0.2
    probs = torch.tensor([[p0, [1.0] + [0.0] * 11, [q + 1e-9 for q in p2], p3]])
    targets = torch.tensor([[1, 2, 3, 3]])
    mask = torch.tensor([[True, False, True, True]])
    bytes_per_token = torch.tensor([0, 3, 5, 1] + [2] * 8)
    loss, tokens, n_bytes, top1, top10 = score_batch(torch.log(probs), targets, mask, bytes_per_token).tolist()
    assert loss == pytest.approx(-math.log(0.45 / sum(p0)) - math.log(1e-9 / (1 + 12e-9)) - math.log(0.2 / 1.0),
                                 rel=1e-5)
    assert (tokens, n_bytes, top1, top10) == (3, 3 + 1 + 1, 1, 2)


def test_chars_are_counted_row_by_row_over_the_scored_targets():
    seen = []

    def decode(rows):
        seen.extend(rows)
        return ["é" * len(row) for row in rows]

    targets = torch.tensor([[5, 6, 7], [8, 9, 10]])
    mask = torch.tensor([[False, True, True], [True, False, False]])
    assert count_chars(targets, mask, decode) == 3
    assert seen == [[6, 7], [8]]


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


def one_char_per_token(rows):  # "é": 1 character, 2 bytes (the byte table below), for every token
    return ["é" * len(row) for row in rows]


def test_uniform_model_scores_log_vocab_per_token_in_both_conventions(data):
    bytes_per_token = torch.full((VOCAB,), 2)
    bytes_per_token[END_OF_DOC] = 0  # control tokens decode to no text

    def decode(rows):  # 1 character per token but none for END_OF_DOC, as the byte table says
        return ["é" * sum(t != END_OF_DOC for t in row) for row in rows]

    ev = Evaluator(bytes_per_token, VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=2, decode=decode,
                   slow_protocol="every_target")
    # Fast: streams [book 9 tokens] and [book 4, book 6] -> 10 and 12 tokens with separators, 9 + 11 targets,
    # 3 of them end-of-document. Slow: one stream of 22 tokens, 21 targets.
    for result, targets in ((ev.fast(Uniform(), data.books("test")), 20),
                            (ev.slow(Uniform(), data.books("test"), stateful=False), 21)):
        assert result.tokens == targets
        assert result.loss_sum == pytest.approx(targets * math.log(VOCAB))
        assert result.bytes == 2 * (targets - 3) and result.chars == targets - 3
        row = result.as_dict()
        assert row["normalised_perplexity"] == pytest.approx(math.exp(targets * math.log(VOCAB) / (2 * (targets - 3))))
        assert row["normalised_perplexity_chars"] == pytest.approx(math.exp(targets * math.log(VOCAB) / (targets - 3)))


@pytest.mark.parametrize("protocol,last_n,scored", [("last_n", None, 21 - 3), ("last_n", 2, 21 - 2),
                                                     ("every_target", None, 21)])
def test_slow_protocols_score_the_targets_they_promise(data, protocol, last_n, scored):
    # One stream of 22 tokens (targets 1..21) in windows of 4. last_n (default 4 // 4 = 1): targets 4..21;
    # last_n 2: targets 3..21; every_target: all 21.
    ev = Evaluator(torch.ones(VOCAB, dtype=torch.long), VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=3,
                   decode=one_char_per_token, slow_protocol=protocol, slow_last_n=last_n)
    result = ev.slow(Uniform(), data.books("test"), stateful=False)
    assert (result.tokens, result.bytes, result.chars) == (scored, scored, scored)
    assert ev.slow_protocol_for(stateful=False) == {"protocol": protocol, "window": 4, "last_n": last_n or 1,
                                                    "max_windows": None}


class NextTokens(torch.nn.Module):
    """Ranks tokens x+1 .. x+10 above all others after token x: x+1 first at window positions 1 and 2, tenth
    (below x+2 .. x+10) at positions 0 and 3."""

    def forward(self, x, state=None):
        logits = torch.full((*x.shape, VOCAB), -30.0)
        following = (x.unsqueeze(-1) + torch.arange(1, 11)) % VOCAB
        ranks = torch.tensor([30.0] + [20.0] * 9).expand(*x.shape, 10).clone()
        ranks[:, ::3, 1:] = 40.0
        return logits.scatter_(2, following, ranks), None


def test_top_k_accuracy_by_hand(data):
    # Fast eval, batch 1: the stream 100..108 EOD 200..203 EOD 300..305 EOD in windows of 4, so target t
    # (1..21) sits at window position (t - 1) % 4. Targets that are not their input + 1 are t = 9, 10, 14, 15,
    # 21 (book ends and starts): top-10 hits 21 - 5 = 16. Top-1 hits: t at positions 1 or 2 (t = 2, 3, 6, 7,
    # 10, 11, 14, 15, 18, 19) but not 10, 14, 15: 7.
    ev = Evaluator(torch.ones(VOCAB, dtype=torch.long), VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=1)
    result = ev.fast(NextTokens(), data.books("test")).as_dict()
    assert result["scored_tokens"] == 21
    assert result["top1_accuracy"] == pytest.approx(7 / 21) and result["top10_accuracy"] == pytest.approx(16 / 21)


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


@pytest.mark.parametrize("protocol, last_n, seq_len, windows", [
    # One stream of 22 tokens (targets 1..21). Windows of 8 moved by 2: last_n starts them at 0, 2, ..., 14
    # (its first scored target is 7); every_target ends them at 8, 10, ..., 20, 21. Both: 8 windows.
    ("last_n", 2, 8, 8), ("every_target", 2, 8, 8),
    # Windows of 32, longer than the split: last_n has no target with 32 - 8 tokens of context (none scored,
    # no window); every_target scores the one window.
    ("last_n", 8, 32, 0), ("every_target", 8, 32, 1),
])
def test_planned_slow_positions_follow_the_protocol(data, protocol, last_n, seq_len, windows):
    books = data.books("test")
    planned = evaluation.slow_positions(books, seq_len, None, stateful=False, protocol=protocol, last_n=last_n)
    assert planned == windows * seq_len
    ev = Evaluator(torch.ones(VOCAB), VOCAB, seq_len=seq_len, device=torch.device("cpu"), batch_size=3,
                   slow_protocol=protocol, slow_last_n=last_n)
    model = CountsPositions(False)
    ev.slow(model, books, stateful=False)
    assert model.positions == planned


@pytest.mark.filterwarnings("ignore::languini.books.ListLengthWarning")
def test_planned_positions_read_the_files_when_the_lists_lengths_differ(tmp_path):
    # The official lists serve every vocabulary: here they say 1 token a book. Streams are balanced by the lists
    # ([book 9, book 6] and [book 4]: 17 and 5 tokens with separators) but read to the files' ends:
    # fast ceil(16 / 4) = 4 batches of 2 x 4; slow (stateful) ceil(21 / 4) = 6 windows of 4.
    write_official(tmp_path, {"train": [book(10, 5)], "test": [book(100, 9), book(200, 4), book(300, 6)]})
    np.save(tmp_path / "file_list_test_iid.npy", np.array([(f"files/test{i}.npy", "1") for i in range(3)]))
    books = BooksDataset(tmp_path, VOCAB).books("test")
    assert evaluation.fast_positions(books, 2, 4, None) == 4 * 2 * 4
    assert evaluation.slow_positions(books, 4, None, stateful=True) == 6 * 4
    ev = Evaluator(torch.ones(VOCAB), VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=2, max_batches=None)
    model = CountsPositions(False)
    ev.fast(model, books)
    assert model.positions == 4 * 2 * 4


class ContextFree(torch.nn.Module):
    """A loss that depends on the input and target tokens only (no context, no position): the same targets give
    the same sums whichever windows read them."""

    def __init__(self, stateful: bool):
        super().__init__()
        self.stateful, self.positions = stateful, 0

    def forward(self, x, state=None):
        self.positions += x.numel()
        logits = torch.zeros(*x.shape, VOCAB).scatter_(2, ((x + 1) % VOCAB).unsqueeze(-1),
                                                       (x % 7).float().unsqueeze(-1))
        return logits, torch.ones(1) if self.stateful else None


@pytest.mark.parametrize("protocol", ["last_n", "every_target"])
def test_the_first_targets_sample_scores_the_same_targets_for_stateless_and_stateful_models(data, protocol):
    # The stream 100..108 EOD 200..203 EOD 300..305 EOD, windows of 4, a cap of 2 windows: the first 8 targets
    # (101..108) for both. Stateless: windows (0, 1..4), then moved by 1 ending at 5, 6, 7, 8: 5 windows, 20
    # positions, whatever --slow_eval (the sample reads every target); stateful: 2 windows, 8 positions.
    books = data.books("test")
    ev = Evaluator(torch.ones(VOCAB, dtype=torch.long), VOCAB, seq_len=4, device=torch.device("cpu"), batch_size=2,
                   slow_max_windows=2, slow_protocol=protocol, slow_sample="first")
    stateless, stateful = ContextFree(False), ContextFree(True)
    a, b = ev.slow(stateless, books, stateful=False), ev.slow(stateful, books, stateful=True)
    expected = sum(math.log(VOCAB - 1 + math.exp(x % 7)) - x % 7 for x in range(100, 108))  # one logit x % 7
    assert a.tokens == b.tokens == 8
    assert a.loss_sum == pytest.approx(expected, rel=1e-5) and b.loss_sum == pytest.approx(expected, rel=1e-5)
    assert (stateless.positions, stateful.positions) == (20, 8)
    assert evaluation.slow_positions(books, 4, 2, False, protocol, None, "first") == 20
    assert evaluation.slow_positions(books, 4, 2, True, protocol, None, "first") == 8
    assert ev.slow_protocol_for(stateful=False)["protocol"] == "every_target"
    assert ev.slow_protocol_for(stateful=False)["sample"] == ev.slow_protocol_for(stateful=True)["sample"] == "first"
    with pytest.raises(ValueError, match="slow_eval_sample"):
        Evaluator(torch.ones(VOCAB), VOCAB, seq_len=4, device=torch.device("cpu"), slow_sample="middle")
