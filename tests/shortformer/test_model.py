"""Shortformer against independent references: a literal PIA forward (x + P before the projections, an explicit
mask over one long sequence), values without positions, the cache across chunks, the model contract."""
import math

import pytest
import torch

from projects.shortformer import configs
from projects.shortformer.model import Attention, Model


def tiny(**overrides):
    return configs.get("cpu", **{"seq_len": 8, "cache_len": 8, "d_model": 32, "n_heads": 2, "d_head": 16,
                                 "n_layers": 2, "vocab_size": 50, **overrides})


def literal_sinusoid(p: int, d: int) -> torch.Tensor:
    """Vaswani et al.'s table, one position at a time: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos."""
    return torch.tensor([math.sin(p / 10000 ** (2 * (i // 2) / d)) if i % 2 == 0 else
                         math.cos(p / 10000 ** (2 * (i // 2) / d)) for i in range(d)])


def literal_attention(attn: Attention, h: torch.Tensor, positions: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """PIA as the slides draw it: Query = Key = X + P, Value = X, for every token of h (B, S, d) with its own
    position; allowed (S, S) says which keys each query reads."""
    d = h.shape[-1]
    P = torch.stack([literal_sinusoid(p, d) for p in positions])
    inner = attn.n_heads * attn.d_head
    Wq, Wk, Wv = attn.qkv.weight.split(inner)
    bq, bk, bv = attn.qkv.bias.split(inner)
    q, k, v = (h + P) @ Wq.T + bq, (h + P) @ Wk.T + bk, h @ Wv.T + bv
    B, S, _ = h.shape
    out = torch.zeros(B, S, inner)
    for head in range(attn.n_heads):
        cols = slice(head * attn.d_head, (head + 1) * attn.d_head)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(attn.d_head)
        out[..., cols] = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[..., cols]
    return out @ attn.proj.weight.T + attn.proj.bias


def literal_forward(model: Model, x: torch.Tensor, positions: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """The whole model over one sequence, no cache: embeddings without positions, pre-LN blocks of literal PIA."""
    h = model.tok_emb(x) * math.sqrt(model.cfg.d_model)
    for block in model.blocks:
        h = h + literal_attention(block.attn, block.ln1(h), positions, allowed)
        h = h + block.mlp(block.ln2(h))
    return model.head(model.ln_f(h))


@pytest.mark.parametrize("attention", ["math", "sdpa"])
@pytest.mark.parametrize("T", [pytest.param(8, id="T8"), pytest.param(5, id="T5-odd")])
def test_segment_without_cache_matches_literal_pia(attention, T):
    torch.manual_seed(0)
    model = Model(tiny(attention=attention)).eval()
    x = torch.randint(50, (2, T))
    with torch.no_grad():
        logits, _ = model(x)
        expected = literal_forward(model, x, list(range(1, T + 1)), torch.ones(T, T, dtype=torch.bool).tril())
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", ["math", "sdpa"])
@pytest.mark.parametrize("T", [pytest.param(8, id="T8"), pytest.param(7, id="T7-odd")])
def test_two_chunks_with_cache_equal_one_forward_over_both(attention, T):
    # The second chunk reads the first as its cache at positions 1..T and sits at T+1..2T; the first chunk's
    # layer inputs do not depend on the second. So one forward over both chunks with positions 1..2T and the
    # mask "all of chunk 1, causal in chunk 2" (here: causal over 2T) gives the same second-chunk outputs.
    torch.manual_seed(1)
    model = Model(tiny(attention=attention, seq_len=T, cache_len=T)).eval()
    x = torch.randint(50, (3, 2 * T))
    with torch.no_grad():
        first, cache = model(x[:, :T])
        second, _ = model(x[:, T:], cache)
        whole = literal_forward(model, x, list(range(1, 2 * T + 1)), torch.ones(2 * T, 2 * T, dtype=torch.bool).tril())
    torch.testing.assert_close(second, whole[:, T:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(first, whole[:, :T], rtol=1e-4, atol=1e-4)


def test_cache_reads_every_cached_token_and_is_causal_in_the_segment():
    # A query at segment index i reads cache keys 1..L and segment keys up to i (lower-right causal), which the
    # literal forward over [cache tokens | segment] with that explicit mask reproduces (the cache's layer inputs
    # come from a first call, as the model caches them).
    torch.manual_seed(2)
    L, T = 6, 4
    model = Model(tiny(seq_len=6, cache_len=L)).eval()
    x = torch.randint(50, (2, L + T))
    with torch.no_grad():
        _, cache = model(x[:, :L])
        second, _ = model(x[:, L:], cache)
        allowed = torch.ones(L + T, L + T, dtype=torch.bool).tril()
        whole = literal_forward(model, x, list(range(1, L + T + 1)), allowed)
    torch.testing.assert_close(second, whole[:, L:], rtol=1e-4, atol=1e-4)
    # changing a later segment token leaves earlier outputs unchanged; changing a cached token changes all
    y = x[:, L:].clone()
    y[:, 2] = (y[:, 2] + 1) % 50
    with torch.no_grad():
        changed, _ = model(y, cache)
    torch.testing.assert_close(changed[:, :2], second[:, :2])
    assert not torch.allclose(changed[:, 2:], second[:, 2:])


def test_cache_keeps_the_last_cache_len_layer_inputs_detached():
    model = Model(tiny(cache_len=3))
    _, cache = model(torch.randint(50, (2, 8)))
    assert len(cache) == 2 and all(c.shape == (2, 3, 32) and not c.requires_grad for c in cache)
    emb = model.tok_emb(torch.zeros(1, 1, dtype=torch.long))  # layer 0's input is the scaled embedding
    _, cache = model(torch.zeros(1, 4, dtype=torch.long))
    torch.testing.assert_close(cache[0][0, -1], emb[0, 0].detach() * math.sqrt(32))


def test_positions_never_reach_the_values():
    # With W_q = W_k = 0 every query weighs its allowed keys equally, whatever the positions: the output is a
    # mean of values. If positions were added to the value inputs, other positions would change it.
    torch.manual_seed(3)
    attn = Attention(tiny())
    with torch.no_grad():
        attn.qkv.weight[:2 * attn.inner] = 0
        attn.qkv.bias[:2 * attn.inner] = 0
        h, cache = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
        sinus = torch.stack([literal_sinusoid(p, 32) for p in range(1, 9)])
        y1 = attn(h, cache, sinus)
        y2 = attn(h, cache, 100 * torch.randn(8, 32))
    torch.testing.assert_close(y1, y2)
    # and with positions the values do not see, gradients of the positions reach only W_q and W_k
    pos = sinus.clone().requires_grad_()
    attn2 = Attention(tiny())
    attn2(h, cache, pos).sum().backward()
    assert pos.grad.abs().sum() > 0


def test_sinusoids_match_the_literal_table():
    from projects.shortformer.model import sinusoids
    expected = torch.stack([literal_sinusoid(p, 32) for p in range(1, 20)])
    torch.testing.assert_close(sinusoids(torch.arange(1, 20), 32), expected, rtol=1e-5, atol=1e-5)


def test_without_cache_the_model_is_stateless_and_causal():
    torch.manual_seed(4)
    model = Model(tiny(cache_len=0)).eval()
    assert Model.stateful and not model.stateful
    x = torch.randint(50, (2, 8))
    logits, state = model(x)
    assert logits.shape == (2, 8, 50) and state is None
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 50
    torch.testing.assert_close(model(x2)[0][:, :5], logits[:, :5])


def test_no_input_position_embedding():
    model = Model(tiny())
    assert not any("pos" in name for name, _ in model.named_parameters())
    # positions only weigh the values: a segment of one repeated token has equal values everywhere, so every
    # position outputs the same (input position embeddings, or positions in the values, would tell them apart)
    logits, cache = model(torch.full((1, 4), 7))
    torch.testing.assert_close(logits[0], logits[0, :1].expand(4, -1))
    logits, _ = model(torch.full((1, 4), 7), cache)
    torch.testing.assert_close(logits[0], logits[0, :1].expand(4, -1))


def test_parameters_are_the_gpts_minus_its_position_table():
    # Languini Table 4's small GPT has 110.6M parameters with a 512 x 768 position table; the Shortformer drops it
    with torch.device("meta"):
        model = Model(configs.get("small"))
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(110.6 - 512 * 768 / 1e6, rel=0.002)


def test_bad_settings_are_explained():
    with pytest.raises(ValueError, match="cache_len"):
        Model(tiny(cache_len=-1))
    with pytest.raises(ValueError, match="attention"):
        Model(tiny(attention="flash"))
    with pytest.raises(ValueError, match="mini, tiny, small"):
        configs.get("huge")
