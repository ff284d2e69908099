"""The neural cache (languini/neural_cache.py) against a brute-force cache written from the equations, alone and
in the slow evaluation, where it is reported beside the plain slow row."""
import math

import pytest
import torch

from languini import neural_cache
from languini.books import BooksDataset, sliding_windows
from languini.evaluation import Evaluator, evaluate_splits
from languini.neural_cache import CacheSettings, NeuralCache
from projects.gpt import configs
from projects.gpt.model import Model


def brute_force(hidden, logits, targets, size, theta, mix):
    """p(w | h_t) = mix * sum_i exp(theta h_t.h_i) [y_i = w] / sum_i exp(theta h_t.h_i) + (1 - mix) p_model(w | h_t)
    over the last `size` positions before t (p_model alone at t = 0), in float64, position by position."""
    hidden, logits = hidden.double(), logits.double()
    out = []
    for t in range(len(targets)):
        p_model = torch.softmax(logits[t], dim=-1)
        entries = range(max(t - size, 0), t)
        if not entries:
            out.append(p_model)
            continue
        weights = [math.exp(theta * float(hidden[t] @ hidden[i])) for i in entries]
        p_cache = torch.zeros_like(p_model)
        for i, w in zip(entries, weights):
            p_cache[targets[i]] += w / sum(weights)
        out.append(mix * p_cache + (1 - mix) * p_model)
    return torch.stack(out)


def test_cache_against_the_brute_force_over_calls_and_chunks(monkeypatch):
    monkeypatch.setattr(neural_cache, "QUERY_CHUNK", 4)  # queries in several chunks, entries from earlier calls
    generator = torch.Generator().manual_seed(0)
    positions, vocab = 37, 7
    hidden = torch.randn(positions, 5, generator=generator)
    logits = torch.randn(positions, vocab, generator=generator)
    targets = torch.randint(vocab, (positions,), generator=generator)
    cache = NeuralCache(CacheSettings(size=6, theta=0.7, mix=0.2))
    pieces = [cache.mix(hidden[a:b], logits[a:b], targets[a:b]) for a, b in ((0, 10), (10, 11), (11, 37))]
    expected = brute_force(hidden, logits, targets, 6, 0.7, 0.2)
    torch.testing.assert_close(torch.cat(pieces).exp().double(), expected, rtol=1e-5, atol=1e-7)  # fp32 vs fp64


@pytest.mark.parametrize("protocol", ["last_n", "every_target"])
def test_slow_eval_with_cache_against_the_brute_force(default_corpus_root, protocol):
    torch.manual_seed(0)
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=16)
    model = Model(cfg).eval()
    books = BooksDataset(default_corpus_root, 2048).books("test")
    settings = CacheSettings(size=40, theta=0.3, mix=0.25)

    def evaluator(cache):
        return Evaluator(torch.ones(2048), 2048, 16, torch.device("cpu"), batch_size=3, slow_max_windows=10,
                         slow_protocol=protocol, slow_last_n=4, cache=cache)

    plain, cached = evaluator(settings).slow_and_cached(model, books, stateful=False)
    assert plain == evaluator(None).slow(model, books, stateful=False)  # the plain row is the same with a cache
    # by hand: the windows' scored positions in stream order, their output-layer inputs and the brute force
    inputs = []
    model.head.register_forward_hook(lambda head, args, output: inputs.append(args[0]))
    hidden, logits, targets = [], [], []
    with torch.no_grad():
        for x, y, mask in sliding_windows(books, 2048, 16, 4, 1, max_windows=10, protocol=protocol):
            out, _ = model(x)
            hidden.append(inputs.pop()[mask])
            logits.append(out[mask])
            targets.append(y[mask])
    hidden, logits, targets = torch.cat(hidden), torch.cat(logits), torch.cat(targets)
    probs = brute_force(hidden, logits, targets, 40, 0.3, 0.25)
    loss = -torch.log(probs[torch.arange(len(targets)), targets]).sum().item()
    assert cached.tokens == plain.tokens == len(targets) and cached.bytes == plain.bytes
    assert cached.loss_sum == pytest.approx(loss, rel=1e-5) and cached.loss_sum != pytest.approx(plain.loss_sum)
    top1 = (probs.argmax(dim=-1) == targets).sum().item()
    assert cached.top1 == top1


def test_slow_cache_is_reported_beside_the_plain_slow_eval(default_corpus_root):
    torch.manual_seed(0)
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=16)
    dataset = BooksDataset(default_corpus_root, 2048)
    ev = Evaluator(torch.ones(2048), 2048, 16, torch.device("cpu"), batch_size=4, max_batches=1, slow_max_windows=4,
                   cache=CacheSettings(100, 0.3, 0.1))
    results = evaluate_splits(ev, Model(cfg), dataset, ["test"], stateful=False, say=lambda *a: None)["eval"]
    assert set(results) == {"fast", "slow", "slow_cache"}
    row = results["slow_cache"]["test"]
    assert (row["cache_size"], row["cache_theta"], row["cache_lambda"]) == (100, 0.3, 0.1)
    assert row["scored_tokens"] == results["slow"]["test"]["scored_tokens"] and "by_frequency" not in row
    with pytest.raises(ValueError, match="--eval_cache_lambda"):
        CacheSettings(100, 0.3, 1.0)
