"""The value read (copied from peer_gpt's expert computation): the reference, the Triton kernels (interpreter on CPU)
and the row-sparse path against a float64 loop over every row and chosen value, with all gradients. Fewer cases than
tests/peer_gpt/test_peer_experts.py (the same code there): the kernels' blocks crossed and odd sizes, fp32 and bf16
tables."""

import math

import pytest
import torch

from projects.ultramem_gpt.ops.memory_values import memory_values
from projects.ultramem_gpt.ops.memory_values.naive import memory_values_reference

IMPLEMENTATIONS = {
    "reference": lambda *a: memory_values_reference(*a, every_expert=False),
    "reference-every-value": lambda *a: memory_values_reference(*a, every_expert=True),
    "triton": lambda *a: memory_values(*a, use_triton=True),
    "triton-sparse": lambda *a: memory_values(*a, use_triton=True, sparse_experts=True),
}

# (rows R, values N, width d, values read per row M): odd sizes; M and d above the kernels' blocks (32, 128) in the
# second; few values, so that reads repeat within and across rows
# (x, tables): fp32, and bf16 tables (half the bytes a read) on the small shape
FP32, BF16_TABLES = (torch.float32, torch.float32), (torch.float32, torch.bfloat16)
CASES = [pytest.param((5, 11, 19, 7), FP32, id="R5-N11-d19-M7-fp32"),
         pytest.param((5, 11, 19, 7), BF16_TABLES, id="R5-N11-d19-M7-bf16-tables"),
         pytest.param((1, 300, 130, 33), FP32, id="R1-N300-d130-M33-fp32")]


def random_inputs(rows, n_values, d, m, dtypes, seed):
    x_dtype, table_dtype = dtypes
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, d, generator=g) / math.sqrt(d)).to(x_dtype)  # unit-variance pre-activations
    down = torch.randn(n_values, d, generator=g).to(table_dtype)
    up = torch.randn(n_values, d, generator=g).to(table_dtype)
    indices = torch.randint(0, n_values, (rows, m), generator=g)
    indices[0, -1] = indices[0, 0]  # one value twice in one row, whatever the draw
    scores = torch.randn(rows, m, generator=g).to(x_dtype)  # TDQKR scores: no softmax, either sign
    grad_out = torch.randn(rows, d, generator=g)
    return x, down, up, indices, scores, grad_out


def gelu_tanh(z):
    return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def loop_over_values(x, down, up, indices, scores):
    """out[r] = sum_j s[r, j] * gelu(down[i] . x[r]) * up[i], one row and one value at a time."""
    rows = []
    for r in range(x.shape[0]):
        out = torch.zeros(x.shape[1], dtype=x.dtype)
        for j in range(indices.shape[1]):
            i = indices[r, j]
            out = out + scores[r, j] * gelu_tanh(down[i] @ x[r]) * up[i]
        rows.append(out)
    return torch.stack(rows)


def output_and_grads(fn, x, down, up, indices, scores, grad_out):
    inputs = [t.detach().clone().requires_grad_() for t in (x, down, up, scores)]
    out = fn(inputs[0], inputs[1], inputs[2], indices, inputs[3])
    return out, *torch.autograd.grad(out, inputs, grad_out.to(out.dtype))


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("shape, dtypes", CASES)
def test_matches_a_loop_over_the_chosen_values(name, shape, dtypes, device):
    x, down, up, indices, scores, grad_out = random_inputs(*shape, dtypes, seed=sum(shape))
    actual = output_and_grads(IMPLEMENTATIONS[name], *[t.to(device) for t in (x, down, up, indices, scores,
                                                                               grad_out)])
    expected = output_and_grads(loop_over_values, x.double(), down.double(), up.double(), indices,
                                scores.double(), grad_out.double())
    sparse = name.endswith("sparse")
    for grad in actual[2:4]:
        assert grad.layout == (torch.sparse_coo if sparse else torch.strided)
    for got, want in zip(actual, expected):
        got = got.to_dense().cpu()
        # fp32 sums of up to 130 products, then 33: a few ulps of the largest terms; bf16 rounds once more (2^-9)
        scale = want.abs().max().item()
        tol = dict(rtol=1e-5, atol=1e-6 * scale) if got.dtype == torch.float32 else dict(rtol=1.6e-2,
                                                                                           atol=1e-5 * scale)
        torch.testing.assert_close(got, want.to(got.dtype), **tol)


def test_reference_gradients_by_gradcheck_in_float64():
    x, down, up, indices, scores, _ = random_inputs(3, 5, 4, 6, (torch.float64, torch.float64), seed=7)
    inputs = [t.requires_grad_() for t in (x, down, up, scores)]
    assert torch.autograd.gradcheck(lambda x, d, u, s: memory_values_reference(x, d, u, indices, s), inputs)
