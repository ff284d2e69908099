"""SAM as a language model: its carried state survives a checkpoint, and the memory it carries is what the
stream wrote."""
import io

import torch

from projects.sam import configs, usage
from projects.sam.model import Model


def small_model(**overrides):
    torch.manual_seed(0)
    return Model(configs.get("cpu", words=64, hidden=32, d_model=32, **overrides))


def test_a_checkpointed_state_continues_exactly():
    model = small_model()
    x1, x2 = torch.randint(2048, (2, 20)), torch.randint(2048, (2, 20))
    logits, state = model(x1)
    logits.float().square().mean().backward()  # training: the backward rolls the memory back and redoes it
    state = {k: v.detach() for k, v in state.items()}
    buffer = io.BytesIO()
    torch.save(state, buffer)  # as languini/checkpoint.py stores the trainer's states
    buffer.seek(0)
    restored = torch.load(buffer)
    assert restored["memory"].abs().sum() > 0 and restored["last_access"].dtype == torch.int64
    with torch.no_grad():
        continued, _ = model(x2, state)
        resumed, _ = model(x2, restored)
    torch.testing.assert_close(resumed, continued, rtol=1e-5, atol=1e-5)  # fp32 logits of the same computation


def test_the_memory_fills_with_the_writes_of_the_stream():
    """Every step each head writes its least recently used word: after t steps of a fresh stream, words that
    were written are no longer zero, up to 2 heads x t of them (the memory is 64 words)."""
    model = small_model()
    with torch.no_grad():
        _, state = model(torch.randint(2048, (2, 10)))
        written = (state["memory"].abs().sum(-1) > 0).sum(-1)
        assert (written >= 2).all() and (written <= 2 * 10 + 2 * 4).all()
        _, state = model(torch.randint(2048, (2, 40)), state)
        assert ((state["memory"].abs().sum(-1) > 0).sum(-1) == 64).all()  # full after 50 steps of 2 heads


def test_read_statistics_bucket_the_age_of_the_words_read():
    """A memory of 64 words written by 2 heads at every step is overwritten every 32 steps, so with segments of
    8 steps no read can reach a word 64 or more steps old, and the shares add up to 1."""
    model = small_model(seq_len=8).eval()
    model.reset_memory_stats()
    state = None
    with torch.no_grad():
        for _ in range(12):
            _, state = model(torch.randint(2048, (2, 8)), state)
    stats = model.memory_stats()
    shares = stats["read_weight_by_age"]
    assert list(shares) == ["0-7 steps", "8-63 steps", ">= 64 steps", "never written"]
    assert abs(sum(shares.values()) - 1) < 1e-9 and shares[">= 64 steps"] == 0.0 and shares["0-7 steps"] > 0
    assert abs(stats["reads"] - 12 * 8 * 2 * 2) < 1e-6  # steps x streams x heads, each head's weights sum to 1


def test_a_state_with_the_ring_continues_as_with_the_stamps():
    """A state saved before the exact path kept its usage on the device holds the ring: the core converts it once
    and continues exactly as from the stamps it would hold now."""
    model = small_model()
    with torch.no_grad():
        _, state = model(torch.randint(2048, (2, 30)))
        old = {k: v.clone() for k, v in state.items() if k != "last_access"}
        old["ring"] = usage.ring_from_last_access(state["last_access"])
        x = torch.randint(2048, (2, 20))
        continued, state = model(x, state)
        converted, old = model(x, old)
    assert "ring" not in old and torch.equal(old["last_access"].argsort(), state["last_access"].argsort())
    assert torch.equal(converted, continued)
