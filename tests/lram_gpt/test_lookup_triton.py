"""The Triton lattice read against the PyTorch reference (lattice.interpolate), both on the test device
(under the interpreter on CPU)."""
import pytest
import torch

from projects.lram_gpt import lattice as L
from projects.lram_gpt.lookup_triton import interpolate_triton, lookup_triton
from projects.lram_gpt.memory import theta

SMALL = (4,) * 8  # 256 locations; K_i = 4 also makes one location appear twice in some queries' support
ODD = (12, 8, 4, 8, 16, 4, 8, 4)  # 3 * 2^10 locations, not a power of two


def random_queries(n, K, seed):
    """Queries over a few periods of the torus, so wrapping and negative coordinates are exercised."""
    periods = torch.tensor(K, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 8, generator=g) * 3 - 1.5) * periods


def weight_per_location(index, weight, n_locations):
    """Total weight per memory location for each row: comparable whatever order equal weights came in."""
    dense = torch.zeros(index.shape[0], n_locations, dtype=torch.float64, device=index.device)
    return dense.scatter_add_(1, index, weight.double())


def reference_and_triton(q, values, K, value_grad, device, topk=32):
    """Outputs and gradients of both paths on `device` for the same random upstream gradient."""
    q, values = q.to(device), values.to(device)
    q_ref = q.clone().requires_grad_()
    v_ref = values.float().clone().requires_grad_()  # fp32 copy of the (maybe bf16) values: the exact target
    out_ref = L.interpolate(q_ref, v_ref, K, topk)
    grad_out = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(0)).to(device)
    out_ref.backward(grad_out)

    q_tri = q.clone().requires_grad_()
    v_tri = values.clone().requires_grad_()
    out_tri = interpolate_triton(q_tri, v_tri, K, topk, value_grad)
    out_tri.backward(grad_out)
    assert out_tri.dtype == torch.float32 and v_tri.grad.dtype == values.dtype
    return (out_ref, q_ref.grad, v_ref.grad), (out_tri, q_tri.grad, v_tri.grad)


@pytest.mark.parametrize(
    "K, n_rows, dtype, value_grad",
    [
        (SMALL, 37, torch.float32, "atomic"),
        (SMALL, 19, torch.bfloat16, "atomic"),
        (SMALL, 21, torch.float32, "segment"),
        (SMALL, 13, torch.bfloat16, "segment"),
        (ODD, 23, torch.float32, "atomic"),
        ((8,) * 8, 17, torch.bfloat16, "atomic"),
    ],
)
def test_interpolate_matches_reference(K, n_rows, dtype, value_grad, device):
    q = random_queries(n_rows, K, seed=n_rows)
    values = torch.randn(L.memory_size(K), 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    (out_ref, gq_ref, gv_ref), (out_tri, gq_tri, gv_tri) = reference_and_triton(q, values, K, value_grad, device)
    torch.testing.assert_close(out_tri, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gq_tri, gq_ref, atol=1e-4, rtol=1e-4)
    if dtype == torch.float32:
        torch.testing.assert_close(gv_tri, gv_ref, atol=1e-5, rtol=1e-5)
    else:  # the kernel sums in fp32 and rounds once to bf16
        torch.testing.assert_close(gv_tri.float(), gv_ref, atol=1e-2, rtol=1e-2)


def test_value_dim_that_is_not_a_power_of_two_and_small_topk(device):
    K = SMALL
    q = random_queries(11, K, seed=3).view(11, 1, 8)  # extra leading dims are kept
    values = torch.randn(L.memory_size(K), 24, generator=torch.Generator().manual_seed(2))
    (out_ref, gq_ref, gv_ref), (out_tri, gq_tri, gv_tri) = reference_and_triton(q, values, K, "atomic", device,
                                                                                 topk=7)
    assert out_tri.shape == (11, 1, 24)
    torch.testing.assert_close(out_tri, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gq_tri, gq_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gv_tri, gv_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("K", [SMALL, ODD])
def test_lookup_matches_reference(K, device):
    q = random_queries(29, K, seed=4).to(device)
    index, weight = lookup_triton(q, K)
    index_ref, weight_ref = L.lookup(q, K)
    assert index.dtype == torch.int64 and index.shape == (29, 32)
    assert (weight[:, 1:] <= weight[:, :-1]).all()
    torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)
    n = L.memory_size(K)
    torch.testing.assert_close(weight_per_location(index, weight, n), weight_per_location(index_ref, weight_ref, n),
                               atol=1e-6, rtol=1e-6)


def test_theta_end_to_end_gradient_matches_reference(device):
    K = SMALL
    g = torch.Generator().manual_seed(5)
    z = torch.randn(3, 5, 2, 16, generator=g).to(device)  # [B, T, heads, 16], an odd token count
    values = torch.randn(L.memory_size(K), 64, generator=g).to(device)
    grads = []
    for use_triton in (False, True):
        z_, v_ = z.clone().requires_grad_(), values.clone().requires_grad_()
        out = theta(z_, v_, K, use_triton=use_triton)
        out.backward(torch.ones_like(out))
        grads.append((out, z_.grad, v_.grad))
    for ref, tri in zip(*grads):
        torch.testing.assert_close(tri, ref, atol=1e-4, rtol=1e-4)


def test_triton_path_under_torch_compile(device):
    K = SMALL
    q = random_queries(9, K, seed=6).to(device).requires_grad_()
    values = torch.randn(L.memory_size(K), 64, generator=torch.Generator().manual_seed(7)).to(device).requires_grad_()
    compiled = torch.compile(lambda q, v: (interpolate_triton(q, v, K) * 2).sum(), backend="eager", fullgraph=False)
    compiled(q, values).backward()
    expected = L.interpolate(q.detach(), values.detach(), K) * 2
    assert torch.allclose(compiled(q, values), expected.sum(), atol=1e-4)
    assert q.grad is not None and values.grad is not None


def test_bad_input_raises():
    values = torch.zeros(L.memory_size(SMALL), 8)
    with pytest.raises(ValueError):
        interpolate_triton(torch.zeros(3, 8), values[:-1], SMALL)
    with pytest.raises(ValueError):
        interpolate_triton(torch.zeros(3, 8), values, SMALL, value_grad="scatter")
    with pytest.raises(ValueError):
        lookup_triton(torch.zeros(3, 6), SMALL)


@pytest.mark.parametrize("K, n_rows, dtype", [(SMALL, 13, torch.float32), (ODD, 15, torch.bfloat16)])
def test_sparse_value_gradient_matches_dense_and_reference(K, n_rows, dtype, device):
    q = random_queries(n_rows, K, seed=8).to(device)
    values = torch.randn(L.memory_size(K), 40, generator=torch.Generator().manual_seed(9)).to(device, dtype)
    (_, _, gv_ref), (_, gq_dense, gv_dense) = reference_and_triton(q, values, K, "atomic", device)
    q_s, v_s = q.clone().requires_grad_(), values.clone().requires_grad_()
    grad_out = torch.randn(n_rows, 40, generator=torch.Generator().manual_seed(0)).to(device)  # as reference_and_triton
    interpolate_triton(q_s, v_s, K, value_grad="atomic", sparse=True).backward(grad_out)
    assert v_s.grad.layout == torch.sparse_coo and v_s.grad.dtype == dtype
    # The same formula, but compiled in another specialisation of the backward kernel (other constexpr flags),
    # where a compiler may contract or order its fp32 sums of topk x M = 1280 products (of order 1) otherwise:
    # about sqrt(1280) x 6e-8 = 2e-6 relative; the reference and the kernel differ by 3e-7 relative here.
    torch.testing.assert_close(q_s.grad, gq_dense, rtol=1e-5, atol=1e-5)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(v_s.grad.to_dense().float(), gv_ref, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(v_s.grad.to_dense(), gv_dense, atol=tolerance, rtol=tolerance)
    rows = v_s.grad._indices()[0]
    assert torch.equal(rows, L.lookup(q, K)[0].unique())  # unique and rising: one summed row per location read
