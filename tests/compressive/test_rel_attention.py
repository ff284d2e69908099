"""The Triton relative-attention kernel (and the FlexAttention path) against the plain PyTorch reference, which
tests/compressive/test_model.py checks against a brute-force sum: outputs and the gradients of q, k, v, r, u, w on
fresh random inputs, with empty memory, full memory, a single query, odd lengths and head widths that are not
powers of two. Under the Triton interpreter on CPU (tests/conftest.py); the kernel's tiles are 32 queries by 32
keys in fp32 (64 or 32 in bf16), so the larger cases cross tile edges (and end inside a tile), and the window of r
rows straddles distance 0 and S - 1."""
import pytest
import torch

from projects.compressive.ops.rel_attention.naive import relative_attention_naive
from projects.compressive.ops.rel_attention.triton import relative_attention_triton

CASES = [  # B, H, T, P, D
    pytest.param(2, 2, 5, 0, 8, id="empty-memory"),
    pytest.param(1, 2, 130, 0, 16, id="empty-memory-3-tiles"),
    pytest.param(2, 3, 17, 23, 24, id="odd-lengths"),
    pytest.param(1, 1, 67, 134, 32, id="full-memory-2x-segment"),
    pytest.param(2, 1, 1, 7, 16, id="single-query"),
    pytest.param(1, 2, 64, 64, 12, id="memory-equal-segment-on-tile-edges"),
    pytest.param(1, 1, 100, 37, 40, id="odd-everything"),
]


def inputs(B, H, T, P, D, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * T + 10 * P + D)
    S = P + T
    tensors = [torch.randn(B, H, T, D, generator=g), torch.randn(B, H, S, D, generator=g),
               torch.randn(B, H, S, D, generator=g), torch.randn(H, S, D, generator=g),
               torch.randn(H, D, generator=g) * 0.5, torch.randn(H, D, generator=g) * 0.5]
    return [t.to(device=device, dtype=dtype).requires_grad_() for t in tensors]


def outputs_and_grads(fn, tensors, upstream, scale):
    out = fn(*tensors, scale)
    return (out, *torch.autograd.grad(out, tensors, upstream))


NAMES = ("out", "q", "k", "v", "r", "u", "w")


@pytest.mark.parametrize("B,H,T,P,D", CASES)
def test_kernel_matches_the_reference(B, H, T, P, D, device):
    tensors = inputs(B, H, T, P, D, device)
    upstream = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(1)).to(device)
    scale = D ** -0.5
    # the reference in float64, so the comparison measures the kernel's fp32 error only
    ref = outputs_and_grads(relative_attention_naive, [t.detach().double().requires_grad_() for t in tensors],
                            upstream.double(), scale)
    got = outputs_and_grads(relative_attention_triton, tensors, upstream, scale)
    # fp32 sums over at most S = 201 keys and D = 40 features of O(1) terms (u and w summed over B x T queries)
    for expected, actual, name in zip(ref, got, NAMES):
        assert actual.dtype == torch.float32
        torch.testing.assert_close(actual.double(), expected, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_bf16_inputs_are_close_to_the_fp64_reference(device):
    B, H, T, P, D = 2, 2, 19, 13, 32
    tensors = inputs(B, H, T, P, D, device, torch.bfloat16)
    upstream = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(2)).to(device, torch.bfloat16)
    scale = D ** -0.5
    ref = outputs_and_grads(relative_attention_naive, [t.detach().double().requires_grad_() for t in tensors],
                            upstream.double(), scale)
    got = outputs_and_grads(relative_attention_triton, tensors, upstream, scale)
    # bf16 has 8 bits of mantissa: the probabilities and the stored outputs round to ~0.4%; gradients reduce
    # bf16 products over up to S = 32 keys (and u, w over all B x T queries)
    for expected, actual, name in zip(ref, got, NAMES):
        assert actual.dtype == torch.bfloat16
        scale_of = expected.abs().max().item()
        torch.testing.assert_close(actual.double(), expected, rtol=3e-2, atol=3e-2 * scale_of,
                                   msg=lambda m: f"{name}: {m}")


def test_rejects_fewer_keys_than_queries(device):
    q, k, v, r, u, w = inputs(1, 1, 8, 0, 16, device)
    with pytest.raises(ValueError, match="S >= T"):
        relative_attention_triton(q, k[:, :, :4], v[:, :, :4], r[:, :4], u, w, 0.25)


@pytest.mark.parametrize("B,H,T,P,D", [CASES[2], CASES[3]])
def test_flex_attention_matches_the_reference(B, H, T, P, D, device):
    """Outputs everywhere; gradients only on a GPU (FlexAttention has no backward on CPU)."""
    flex = pytest.importorskip("projects.compressive.ops.rel_attention.flex")
    tensors = inputs(B, H, T, P, D, device)
    upstream = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(3)).to(device)
    scale = D ** -0.5
    ref = outputs_and_grads(relative_attention_naive, [t.detach().double().requires_grad_() for t in tensors],
                            upstream.double(), scale)
    if device.type == "cuda":
        got = outputs_and_grads(flex.relative_attention_flex, tensors, upstream, scale)
    else:
        got = (flex.relative_attention_flex(*[t.detach() for t in tensors], scale),)
    for expected, actual, name in zip(ref, got, NAMES):  # fp32, as the kernel's test
        torch.testing.assert_close(actual.double(), expected, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_the_kernel_on_cpu_without_the_interpreter_says_what_to_use(device, monkeypatch):
    from projects.compressive.ops.rel_attention import triton as kernel

    monkeypatch.setattr(kernel, "interpreting", lambda: False)
    q, k, v, r, u, w = inputs(1, 1, 4, 0, 16, torch.device("cpu"))
    with pytest.raises(ValueError, match="attention_impl naive"):
        relative_attention_triton(q, k, v, r, u, w, 0.25)
