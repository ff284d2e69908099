
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from languini import flops, hardware


class CausalAttentionLM(nn.Module):
    """Embedding, one nn.MultiheadAttention and an output layer; no biases so the count is plain matmuls."""

    def __init__(self, vocab_size=64, d_model=32, n_heads=2, extra=0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.attention = nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.extra = extra

    def forward(self, x, state=None):
        h = self.embed(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        a, _ = self.attention(h, h, h, attn_mask=mask, need_weights=False)
        return self.head(h + a), None

    def extra_flops(self, seq_len):
        return self.extra * seq_len


def hand_count(seq_len, vocab_size, d_model):
    # q, k, v and output projections; QK^T and AV over the full T x T square (as DeepSpeed
    # counts them); output layer. Each multiply-add is 2 FLOPs; embedding lookups are free.
    projections = 4 * 2 * seq_len * d_model * d_model
    attention = 2 * 2 * seq_len * seq_len * d_model
    output = 2 * seq_len * d_model * vocab_size
    return projections + attention + output


def test_forward_flops_counts_attention_even_when_called_under_no_grad():
    model = CausalAttentionLM(extra=7).eval()  # eval + no_grad is when PyTorch takes MHA's fused fast path
    with torch.no_grad():
        counted = flops.forward_flops(model, seq_len=16, vocab_size=64)
    assert counted == hand_count(16, 64, 32) + 7 * 16


class DropsInTraining(nn.Module):
    """A linear map of the tokens whose embedding's first entry is positive; in training the others are dropped
    (as a Switch layer drops the choices over an expert's capacity), so the work done depends on the tokens."""

    def __init__(self, vocab_size=64, d_model=8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.linear = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, state=None):
        h = self.embed(x)[0]
        kept = h[h[:, 0] > 0] if self.training else h
        return self.linear(kept), None


def test_forward_flops_are_the_nominal_count_and_leave_the_mode_as_it_was():
    # Counted in eval mode: all 16 tokens through the 8 x 8 map whatever the weights, and the model stays in
    # training; the same count from any initialisation (in training mode about half the tokens would be kept).
    for seed in range(3):
        torch.manual_seed(seed)
        model = DropsInTraining().train()
        assert flops.forward_flops(model, seq_len=16, vocab_size=64) == 16 * 2 * 8 * 8
        assert model.training


def test_profiler_patches_are_undone_when_the_forward_fails():
    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    linear_before = F.linear
    with pytest.raises(RuntimeError, match="boom"):
        flops.forward_flops(Broken(), seq_len=4, vocab_size=8)
    assert F.linear is linear_before


@pytest.mark.parametrize(
    "name, peak_name",
    [("NVIDIA GeForce RTX 3090", "RTX 3090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
     ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA A100 80GB PCIe", "A100 80GB"),
     ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("NVIDIA A100", "A100"),
     ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
     ("Tesla V100-SXM2-32GB", "V100"), ("Tesla V100-PCIE-32GB", "V100 PCIe"), ("Tesla P100-PCIE-16GB", "P100 PCIe")],
)
def test_device_peak_lookup(name, peak_name):
    assert flops.device_peak(name).name == peak_name


def test_device_peak_values_and_unknown_devices():
    assert flops.device_peak("NVIDIA GeForce RTX 3090").flops_per_second == 71e12
    assert flops.device_peak("NVIDIA H100 PCIe").flops_per_second == 756e12
    assert flops.device_peak("NVIDIA H100 80GB HBM3").flops_per_second == 989.4e12
    assert flops.device_peak("cpu") is None
    assert flops.device_peak("NVIDIA GeForce RTX 3090 Ti") is None  # a different card, not an RTX 3090
    assert flops.device_peak("NVIDIA H100 NVL") is None  # neither the SXM card nor the PCIe one
    assert all(spec.source.startswith("spec:") for spec in hardware.DEVICES)


def test_mfu_is_three_forward_passes_per_token():
    # GPT small on the RTX 3090: 109.6e9 / 512 FLOPs per token forward, 55,416 tokens/s, 71 TFLOP/s peak.
    assert flops.mfu(109.6e9, 512, 55416, 71e12) == pytest.approx(3 * 214.0625e6 * 55416 / 71e12)
    assert flops.mfu(109.6e9, 512, 55416, 71e12) == pytest.approx(0.5012, abs=1e-4)
