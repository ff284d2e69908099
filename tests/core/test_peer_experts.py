"""PEER's expert computation: the reference and the Triton kernels (interpreter on CPU), dense and row-sparse table
gradients, against a float64 loop over every row and every chosen expert, with all gradients."""

import math

import pytest
import torch

from languini.ops.peer_experts import peer_experts
from languini.ops.peer_experts.naive import peer_experts_reference
from languini.ops.peer_experts.triton import peer_experts_triton

IMPLEMENTATIONS = {
    "reference-gathered": lambda *a: peer_experts_reference(*a, every_expert=False),
    "reference-every-expert": lambda *a: peer_experts_reference(*a, every_expert=True),
    "triton": lambda *a: peer_experts(*a, use_triton=True),
    "reference-sparse": lambda *a: peer_experts(*a, use_triton=False, sparse_experts=True),
    "triton-sparse": lambda *a: peer_experts(*a, use_triton=True, sparse_experts=True),
}

# (rows R, experts N, width d, experts read per row M): odd sizes; M and d above the kernels' blocks (32, 128); few
# experts so that rows repeat within and across rows; one expert read by every slot.
SHAPES = [pytest.param((5, 11, 19, 7), id="R5-N11-d19-M7"), pytest.param((3, 300, 130, 33), id="R3-N300-d130-M33"),
          pytest.param((4, 1, 5, 40), id="R4-N1-d5-M40"), pytest.param((1, 64, 1, 1), id="R1-N64-d1-M1")]

# (x, tables, weights): all fp32; bf16 tables (half the bytes per read); bf16 input and tables with fp32 router
# scores (the model under autocast, its softmax in fp32).
DTYPES = [pytest.param((torch.float32, torch.float32, torch.float32), id="fp32"),
          pytest.param((torch.float32, torch.bfloat16, torch.float32), id="bf16-tables"),
          pytest.param((torch.bfloat16, torch.bfloat16, torch.float32), id="bf16-x-tables")]


def random_inputs(rows, experts, d, m, dtypes, seed):
    x_dtype, table_dtype, weights_dtype = dtypes
    g = torch.Generator().manual_seed(seed)
    # unit-variance neuron inputs, so the GELU is exercised on both sides of its bend
    x = (torch.randn(rows, d, generator=g) / math.sqrt(d)).to(x_dtype)
    down = torch.randn(experts, d, generator=g).to(table_dtype)
    up = torch.randn(experts, d, generator=g).to(table_dtype)
    indices = torch.randint(0, experts, (rows, m), generator=g)
    indices[0, -1] = indices[0, 0]  # one expert twice in one row, whatever the draw
    weights = torch.rand(rows, m, generator=g).to(weights_dtype)
    grad_out = torch.randn(rows, d, generator=g)
    return x, down, up, indices, weights, grad_out


def gelu_tanh(z):
    """GPT-2's GELU, by its formula."""
    return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def loop_over_experts(x, down, up, indices, weights):
    """out[r] = sum_j w[r, j] * gelu(down[i] . x[r]) * up[i], one row and one expert at a time."""
    rows = []
    for r in range(x.shape[0]):
        out = torch.zeros(x.shape[1], dtype=x.dtype)
        for j in range(indices.shape[1]):
            i = indices[r, j]
            out = out + weights[r, j] * gelu_tanh(down[i] @ x[r]) * up[i]
        rows.append(out)
    return torch.stack(rows)


def output_and_grads(fn, x, down, up, indices, weights, grad_out):
    inputs = [t.detach().clone().requires_grad_() for t in (x, down, up, weights)]
    out = fn(inputs[0], inputs[1], inputs[2], indices, inputs[3])
    grads = torch.autograd.grad(out, inputs, grad_out.to(out.dtype))
    return out, *grads


def tolerance(want, dtype):
    """fp32 sums of up to 130 products, then up to 40: errors of a few ulps of the largest terms, so an absolute
    part scaled by the tensor's largest value (entries that cancel to near 0 keep it); a bf16 result is rounded
    once more (8 bits: 2^-9 relative)."""
    scale = want.abs().max().item()
    return dict(rtol=1e-5, atol=1e-6 * scale) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-5 * scale)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtypes", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_a_loop_over_the_chosen_experts(name, dtypes, shape, device):
    x, down, up, indices, weights, grad_out = random_inputs(*shape, dtypes, seed=sum(shape))
    on = [t.to(device) for t in (x, down, up, indices, weights, grad_out)]
    actual = output_and_grads(IMPLEMENTATIONS[name], *on)
    # the loop in float64 on the exact upcast of the same inputs
    expected = output_and_grads(loop_over_experts, x.double(), down.double(), up.double(), indices,
                                weights.double(), grad_out.double())

    x_dtype, table_dtype, weights_dtype = dtypes
    out, grad_x, grad_down, grad_up, grad_weights = actual
    assert out.dtype == torch.promote_types(torch.promote_types(x_dtype, table_dtype), weights_dtype)
    assert (grad_x.dtype, grad_down.dtype, grad_up.dtype, grad_weights.dtype) == (x_dtype, table_dtype,
                                                                                   table_dtype, weights_dtype)
    sparse = name.endswith("sparse")
    for grad in (grad_down, grad_up):
        assert grad.layout == (torch.sparse_coo if sparse else torch.strided)
        if sparse:  # coalesced: exactly the experts read, each once, rising
            assert grad.is_coalesced() and grad.indices()[0].tolist() == sorted(set(indices.flatten().tolist()))
    for got, want in zip(actual, expected):
        got = got.to_dense().cpu()
        torch.testing.assert_close(got, want.to(got.dtype), **tolerance(want, got.dtype))


def test_experts_not_read_get_zero_gradient(device):
    x, down, up, _, weights, grad_out = random_inputs(9, 50, 17, 5, (torch.float32,) * 3, seed=3)
    indices = torch.randint(10, 20, (9, 5))  # experts outside [10, 20) are never read
    on = [t.to(device) for t in (x, down, up, indices, weights, grad_out)]
    _, _, grad_down, grad_up, _ = output_and_grads(peer_experts_triton, *on)
    read = torch.zeros(50, dtype=torch.bool, device=device)
    read[indices.flatten()] = True
    for grad in (grad_down, grad_up):
        assert torch.all(grad[~read] == 0) and torch.all(grad[read].abs().sum(1) > 0)


@pytest.mark.parametrize("every_expert", [False, True], ids=["gathered", "every-expert"])
def test_reference_gradients_by_gradcheck_in_float64(every_expert):
    x, down, up, indices, weights, _ = random_inputs(3, 5, 4, 6, (torch.float64,) * 3, seed=7)
    inputs = [t.requires_grad_() for t in (x, down, up, weights)]
    assert torch.autograd.gradcheck(
        lambda x, d, u, w: peer_experts_reference(x, d, u, indices, w, every_expert=every_expert), inputs)


def test_cpu_path_computes_every_experts_input_only_for_small_tables():
    from languini.ops.peer_experts.naive import EVERY_EXPERT_UP_TO

    calls = []
    original = torch.Tensor.gather
    x, down, up, indices, weights, _ = random_inputs(2, 8 * EVERY_EXPERT_UP_TO + 1, 3, 8, (torch.float32,) * 3, 1)
    try:
        torch.Tensor.gather = lambda *a, **k: calls.append(1) or original(*a, **k)
        peer_experts(x, down, up, indices, weights)
        assert not calls  # N > 32 M: the gathered products
        peer_experts(x, down[:-1], up[:-1], indices, weights)
        assert calls  # N = 32 M: every expert's input, then the chosen ones
    finally:
        torch.Tensor.gather = original


def test_empty_batch(device):
    x, down, up = torch.zeros(0, 3, device=device), torch.randn(5, 3, device=device), torch.randn(5, 3, device=device)
    down.requires_grad_()
    out = peer_experts_triton(x, down, up, torch.zeros(0, 4, dtype=torch.int64, device=device),
                              torch.zeros(0, 4, device=device))
    assert out.shape == (0, 3)
    out.sum().backward()
    assert torch.all(down.grad == 0)


def test_dispatch_uses_reference_on_cpu_by_default():
    x, down, up, indices, weights, _ = random_inputs(6, 9, 5, 3, (torch.float32,) * 3, seed=2)
    torch.testing.assert_close(peer_experts(x, down, up, indices, weights),
                               loop_over_experts(x, down, up, indices, weights), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", ["int32 indices", "weights shape", "table width", "tables differ"])
def test_bad_input_raises_value_error(bad):
    x, down, up = torch.randn(2, 3), torch.randn(5, 3), torch.randn(5, 3)
    indices, weights = torch.zeros(2, 4, dtype=torch.int64), torch.rand(2, 4)
    if bad == "int32 indices":
        indices = indices.int()
    elif bad == "weights shape":
        weights = weights[:, :3]
    elif bad == "table width":
        down, up = torch.randn(5, 4), torch.randn(5, 4)
    else:
        up = torch.randn(6, 3)
    for use_triton in (False, True):
        with pytest.raises(ValueError):
            peer_experts(x, down, up, indices, weights, use_triton=use_triton)


def test_compiles_without_graph_break(device):
    x, down, up, indices, weights, grad_out = [t.to(device) for t in random_inputs(6, 13, 7, 5, (torch.float32,) * 3,
                                                                                  seed=4)]

    def experts_times_two(x, down, up, indices, weights):
        return peer_experts_triton(x, down, up, indices, weights) * 2

    torch._dynamo.reset()
    compiled = torch.compile(experts_times_two, backend="aot_eager", fullgraph=True)
    actual = output_and_grads(compiled, x, down, up, indices, weights, grad_out)
    expected = output_and_grads(experts_times_two, x, down, up, indices, weights, grad_out)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
