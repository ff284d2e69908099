"""GPT sizes against the Languini paper's Table 4 and the position-table limit (the model
contract, causality included, is tests/core/test_contract.py's)."""
import pytest
import torch

from languini.flops import forward_flops
from projects.gpt import configs
from projects.gpt.model import Model

# Table 4 (medium with 24 layers, see configs.py): parameters in millions, forward GFLOPs at batch 1 x 512.
TABLE_4 = {"mini": (27.6, 20.4), "tiny": (53.9, 45.1), "small": (110.6, 109.6),
           "medium": (336.4, 352.4), "large": (731.1, 760.5), "XL": (1478.2, 1555.2)}


@pytest.mark.parametrize("size", TABLE_4)
def test_parameters_and_flops_match_table_4(size):
    params, gflops = TABLE_4[size]
    with torch.device("meta"):  # no memory for the big ones
        model = Model(configs.get(size))
    # all six within 0.2%: dropping the position table (0.4% of small) or the MLP biases would fail
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params, rel=0.002)
    assert forward_flops(model, 512, 16384, "meta") / 1e9 == pytest.approx(gflops, rel=0.002)


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_flops_on_meta_match_flops_on_cpu(attention):
    # Matmuls must not be counted twice through the meta device's decompositions (layer norm differs slightly).
    cfg = configs.get("cpu", attention=attention)
    with torch.device("meta"):  # built on meta, profiled as forward_flops always is: outside the device context
        meta_model = Model(cfg)
    meta = forward_flops(meta_model, cfg.seq_len, cfg.vocab_size, "meta")
    assert meta == pytest.approx(forward_flops(Model(cfg), cfg.seq_len, cfg.vocab_size), rel=1e-3)


def test_attention_width_differs_from_model_width_for_mini():
    model = Model(configs.get("mini"))
    assert model.blocks[0].attn.qkv.weight.shape == (3 * 8 * 32, 512)


def test_sequence_longer_than_position_table_is_explained():
    model = Model(configs.get("cpu", seq_len=8))
    with pytest.raises(ValueError, match="position table"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_unknown_config_lists_the_known_ones():
    with pytest.raises(ValueError, match="mini, tiny, small"):
        configs.get("huge")


def test_math_attention_is_the_default_and_agrees_with_sdpa():
    assert configs.ModelConfig().attention == "math"  # the official code's default (use_flash off)
    cfg = configs.get("cpu", seq_len=16, d_model=32, n_heads=2, d_head=16)
    torch.manual_seed(0)
    math_model = Model(cfg).eval()
    sdpa_model = Model(configs.get("cpu", seq_len=16, d_model=32, n_heads=2, d_head=16, attention="sdpa")).eval()
    sdpa_model.load_state_dict(math_model.state_dict())
    x = torch.randint(cfg.vocab_size, (2, 16))
    # Two fp32 computations (eps 1.2e-7) of scores over d_head = 16 products and sums over <= 16 weights, in
    # two layers: they differ by about 1e-7 (logits of order 0.5); 1e-5 leaves a wide margin.
    torch.testing.assert_close(math_model(x)[0], sdpa_model(x)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="math, sdpa"):
        Model(configs.get("cpu", attention="flash"))
