"""languini/transformer.py pinned: the attention against a loop over positions, the MLP and the block against their
formulas written out, GPT-2's initialisation by its statistics, the parameter names checkpoints rely on, and a
fixed-seed checksum of a tiny GPT, so that a project built on these blocks can tell if they moved."""
import math

import pytest
import torch

from languini import transformer as tf

TINY = tf.GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=2, d_head=16)


def attention_by_loop(q, k, v, window=None):
    """Causal softmax attention one query at a time, in float64: query i (of the last T of S positions) reads keys
    max(0, i + S - T - window + 1) .. i + S - T."""
    T, S = q.shape[-2], k.shape[-2]
    out = torch.empty_like(q)
    for i in range(T):
        last = i + S - T
        first = 0 if window is None else max(0, last - window + 1)
        scores = (k[..., first:last + 1, :] @ q[..., i, :, None]).squeeze(-1) / math.sqrt(q.shape[-1])
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
        out[..., i, :] = (weights[..., None] * v[..., first:last + 1, :]).sum(-2)
    return out


def test_causal_mask_by_hand():
    assert tf.causal_mask(3).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert tf.causal_mask(2, 4).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]  # a cache of 2 before the segment
    assert tf.causal_mask(4, window=2).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]


@pytest.mark.parametrize("window", [None, 1, 3], ids=["causal", "window1", "window3"])
@pytest.mark.parametrize("impl", tf.ATTENTION)
def test_causal_attention_matches_a_loop_over_positions(impl, window):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 7, 5, dtype=torch.float64)  # batch 2, 3 heads, 7 positions, d_head 5 (odd)
    # float64, sums of at most 7 terms: agreement to ~1e-15; 1e-12 leaves a wide margin
    torch.testing.assert_close(tf.causal_attention(q, k, v, impl, window), attention_by_loop(q, k, v, window),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", tf.ATTENTION)
def test_masked_attention_over_a_cache_matches_a_loop(impl):
    torch.manual_seed(1)
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    k, v = torch.randn(2, 2, 3, 9, 4, dtype=torch.float64)  # 4 cached positions before the 5 queries
    torch.testing.assert_close(tf.masked_attention(q, k, v, tf.causal_mask(5, 9), impl), attention_by_loop(q, k, v),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", tf.ATTENTION)
def test_attention_with_zero_keys_is_the_running_mean_of_the_values(impl):
    # With zero keys every score is 0: position t attends equally to positions 0..t, so before the output
    # projection the attention returns the running mean of the values.
    torch.manual_seed(0)
    attn = tf.Attention(8, 2, 4, impl).double()
    q, k, v = (slice(i * 8, (i + 1) * 8) for i in range(3))  # rows of qkv: queries, keys, values (heads inside)
    with torch.no_grad():
        attn.qkv.weight[k] = 0
        attn.qkv.bias[k] = 0
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    values = x @ attn.qkv.weight[v].T + attn.qkv.bias[v]
    running_mean = values.cumsum(dim=1) / torch.arange(1, 8, dtype=torch.float64)[:, None]
    torch.testing.assert_close(attn(x), attn.proj(running_mean), rtol=1e-12, atol=1e-12)


def test_unknown_attention_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="math, sdpa"):
        tf.Attention(8, 2, 4, "flash")


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, ln):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def test_mlp_is_gpt2s_with_the_tanh_gelu():
    torch.manual_seed(0)
    mlp = tf.MLP(6, 3).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    expected = gelu_tanh(x @ mlp.fc.weight.T + mlp.fc.bias) @ mlp.proj.weight.T + mlp.proj.bias
    assert mlp.fc.weight.shape == (18, 6)
    torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ff_name", ["mlp", "ff"])
def test_block_is_pre_layernorm_attention_then_feed_forward(ff_name):
    cfg = tf.GPTConfig(d_model=12, n_heads=3, d_head=5)
    torch.manual_seed(0)
    block = tf.Block(cfg, None if ff_name == "mlp" else tf.MLP(12, 2), ff_name=ff_name).double()
    with torch.no_grad():  # LayerNorm weights other than ones and zeros, so that a missing one shows
        for ln in (block.ln1, block.ln2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.normal_()
    ff = getattr(block, ff_name)
    assert block.feed_forward is ff and {name.split(".")[0] for name, _ in block.named_parameters()} == {
        "ln1", "attn", "ln2", ff_name}
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    h = x + block.attn(layer_norm(x, block.ln1))
    expected = h + ff.proj(gelu_tanh(ff.fc(layer_norm(h, block.ln2))))
    torch.testing.assert_close(block(x), expected, rtol=1e-12, atol=1e-12)


def test_gpt2_initialisation_statistics():
    cfg = tf.GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layers=4, n_heads=4, d_head=32)
    torch.manual_seed(0)
    model = tf.GPT(cfg)
    residual = 0.02 / math.sqrt(2 * 4)
    assert tf.residual_std(4) == residual
    for name, p in model.named_parameters():
        if name.endswith("mlp.proj.weight"):  # 65,536 draws: the std within 2% (its standard error is 0.3%)
            assert p.std().item() == pytest.approx(residual, rel=0.02), name
        elif name.startswith("ln") or ".ln" in name:
            assert torch.all(p == (1 if name.endswith("weight") else 0)), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:  # at least 8,192 draws: within 4% (standard error under 0.8%)
            assert p.std().item() == pytest.approx(0.02, rel=0.04), name
            assert abs(p.mean().item()) < 0.02 * 4 / math.sqrt(p.numel()), name


def test_parameter_names_checkpoints_rely_on():
    names = list(tf.GPT(TINY).state_dict())
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"] and names[-3:] == ["ln_f.weight", "ln_f.bias",
                                                                              "head.weight"]
    assert [n for n in names if n.startswith("blocks.1.")] == [
        f"blocks.1.{n}" for n in ("ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                                  "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
                                  "mlp.proj.weight", "mlp.proj.bias")]


def test_sequence_longer_than_the_position_table_is_explained():
    with pytest.raises(ValueError, match="position table"):
        tf.GPT(TINY)(torch.zeros(1, 17, dtype=torch.long))


def test_a_model_without_positions_embeds_tokens_only_at_any_length():
    torch.manual_seed(0)
    model = tf.GPT(TINY, positions=False)
    assert model.pos_emb is None and "pos_emb.weight" not in model.state_dict()
    x = torch.randint(64, (2, 40))  # longer than seq_len: nothing limits it
    # one fp32 product per element: within an ulp
    torch.testing.assert_close(model.embed(x), model.tok_emb.weight[x] * math.sqrt(32), rtol=2e-7, atol=1e-9)


def test_sizes_and_compute_classes_are_the_papers():
    small = tf.sizes(tf.GPTConfig)["small"]
    assert (small.d_model, small.n_layers, small.n_heads, small.d_head) == (768, 12, 12, 64)
    assert tf.sizes(tf.GPTConfig)["medium"].n_layers == 24  # see GPT_SIZES: Table 4's parameter count needs 24
    assert tf.compute_classes(("small",), grad_clip=0.1) == {
        "6h": {"config": "small", "batch_size": 128, "grad_clip": 0.1},
        "12h": {"config": "small", "batch_size": 128, "grad_clip": 0.1},
        "24h": {"config": "small", "batch_size": 256, "grad_clip": 0.1}}


# The tiny GPT's parameters and its logits for tokens 0..15 after torch.manual_seed(0), measured when the blocks
# moved into the core (the same to the last bit as projects/gpt's Model before). fp32 through two blocks of width
# 32: a reordered reduction moves them by ~1e-6 relative; rtol 1e-4 (and the 6 digits kept) catches a change to
# the init, the order of its random draws, the scaling or the order of the layers, which moves them by 1e-2 or more.
PINNED = {"sum": 9.79328, "abs_sum": 91.2641, "first": [-0.151358, 0.0126932, 0.0207778, -0.0165545],
          "parameter_square_sum": 169.194}


def test_fixed_seed_checksum_of_a_tiny_gpt():
    torch.manual_seed(0)
    model = tf.GPT(TINY).eval()
    with torch.no_grad():
        logits = model(torch.arange(16)[None])[0][0]
    assert sum(p.double().square().sum().item() for p in model.parameters()) == pytest.approx(
        PINNED["parameter_square_sum"], rel=1e-5)
    measured = {"sum": logits.double().sum().item(), "abs_sum": logits.double().abs().sum().item(),
                "first": logits[0, :4].tolist()}
    assert measured["abs_sum"] == pytest.approx(PINNED["abs_sum"], rel=1e-4)
    assert measured["sum"] == pytest.approx(PINNED["sum"], rel=1e-4, abs=1e-3)
    assert measured["first"] == pytest.approx(PINNED["first"], rel=1e-4, abs=1e-5)
