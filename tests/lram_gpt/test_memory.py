"""theta (paper 2.3), the memory sub-network (3.1) and the access statistics (Table 5), on the reference path."""
import math

import pytest
import torch

from projects.lram_gpt import lattice as L
from projects.lram_gpt.memory import LRAMBlock, theta
from projects.lram_gpt.ops.lookup import naive
from projects.lram_gpt.ops.lookup.naive import torus_query

SMALL = (4,) * 8


def theta_by_definition(z, values, K):
    """theta with phi summed over every memory location and the quotient metric of the torus (all K_i >= 8)."""
    complex_z = torch.complex(z[..., :8], z[..., 8:])
    scale = 1 / (1 / complex_z.abs()).sum(-1, keepdim=True)
    q = torch.angle(complex_z) * torch.tensor(K, dtype=z.dtype) / (2 * math.pi)
    # the torus points: x = 2y + p with y in D8 taken mod K/2
    y = torch.cartesian_prod(*[torch.arange(k // 2) for k in K])
    y = y[y.sum(-1) % 2 == 0]
    points = torch.cat([2 * y, 2 * y + 1]).to(z.dtype)
    periods = torch.tensor(K, dtype=z.dtype)
    diff = (q[..., None, :] - points).remainder(periods)
    diff = torch.minimum(diff, periods - diff)  # distance to the nearest image along each axis
    weight = torch.clamp(1 - (diff**2).sum(-1) / 8, min=0) ** 4
    rows = values[L.memory_index(points.long(), K)]
    return scale * (weight @ rows)


def test_theta_is_the_papers_formula():
    K = (8,) * 8
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 16, generator=g, dtype=torch.float64)
    values = torch.randn(L.memory_size(K), 3, generator=g, dtype=torch.float64)
    expected = theta_by_definition(z, values, K)
    torch.testing.assert_close(theta(z, values, K, topk=232), expected, atol=1e-12, rtol=1e-12)
    # keeping 32 points drops at most 10% of the weight (paper 2.6); here only a little
    assert (theta(z, values, K) - expected).abs().max() < 0.1 * expected.abs().max()


@pytest.mark.parametrize("scale", [0.0, 0.37, 1.0, 5.0])
def test_theta_is_positively_homogeneous(scale):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 3, 16, generator=g, dtype=torch.float64)
    values = torch.randn(L.memory_size(SMALL), 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(theta(scale * z, values, SMALL), scale * theta(z, values, SMALL),
                               atol=1e-12, rtol=1e-12)


def test_theta_is_finite_at_zero_entries():
    z = torch.randn(2, 16, dtype=torch.float64)
    z[0, 3] = z[0, 11] = 0.0  # z_4 = 0 in the first row
    values = torch.randn(L.memory_size(SMALL), 4, dtype=torch.float64)
    z.requires_grad_()
    out = theta(z, values, SMALL)
    out.sum().backward()
    assert torch.isfinite(z.grad).all()
    assert out[0].abs().max() < 1e-100  # the harmonic scale vanishes with |z_4|


def test_theta_gradcheck_float64():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(3, 2, 16, generator=g, dtype=torch.float64, requires_grad=True)
    values = torch.randn(L.memory_size(SMALL), 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, v: theta(z, v, SMALL, use_triton=False), (z, values))


def test_torus_query_coordinates():
    z = torch.zeros(16)
    z[:8] = torch.tensor([1.0, 0.0, -1.0, 0.0, 2.0, 3.0, 1.0, -1.0])
    z[8:] = torch.tensor([0.0, 1.0, 0.0, -1.0, 2.0, 0.0, -1.0, 1.0])
    K = (8, 8, 8, 8, 8, 8, 8, 12)
    scale, q = torus_query(z, K)
    moduli = torch.tensor([1, 1, 1, 1, math.sqrt(8), 3, math.sqrt(2), math.sqrt(2)])
    assert scale.item() == pytest.approx(1 / (1 / moduli).sum().item())
    expected = torch.tensor([0, 2, 4, -2, 1, 0, -1, 12 * 3 / 8])  # K_i / (2 pi) * arg z_i
    torch.testing.assert_close(q, expected.float())


# --- the memory sub-network --------------------------------------------------------------------------

def test_block_shapes_parameters_and_gradients():
    block = LRAMBlock(32, memory_size=256)
    assert block.K == SMALL and block.n_heads == 2 and block.memory_size == 256
    assert block.out.in_features == 4 * 32  # (n, m, h) = (8, 64, w/16) gives 4w
    assert block.value_parameters() == [block.values] and block.values.shape == (256, 64)
    assert any(p is block.values for p in block.parameters())
    x = torch.randn(2, 5, 32)
    y = block(x)
    assert y.shape == (2, 5, 32)
    y.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters())
    assert (block.values.grad != 0).any(dim=1).sum() <= 2 * 5 * 2 * 32  # only rows that were read


def test_layer_norm_queries_keep_the_block_causal_and_batch_norm_does_not():
    torch.manual_seed(3)
    x = torch.randn(2, 6, 32)
    later_changed = x.clone()
    later_changed[:, 4:] += 1.0
    causal = LRAMBlock(32, K=SMALL)
    assert torch.equal(causal(x)[:, :4], causal(later_changed)[:, :4])  # exact: same kernels, same numbers
    batch = LRAMBlock(32, K=SMALL, query_norm="batch").train()
    assert not torch.allclose(batch(x)[:, :4], batch(later_changed)[:, :4])


def test_block_triton_path_matches_reference(device):
    torch.manual_seed(4)
    block = LRAMBlock(16, memory_size=256, use_triton=False).to(device)
    x = torch.randn(1, 7, 16).to(device)
    expected = block(x)
    block.use_triton = True
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)
    index, weight = block.read_locations(x)
    block.use_triton = False
    index_ref, weight_ref = block.read_locations(x)
    assert index.shape == (1, 7, 1, 32)
    torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)


def test_cpu_tensors_take_the_reference_path_unless_forced(monkeypatch):
    from projects.lram_gpt.ops.lookup import triton as lookup_triton

    calls = []
    monkeypatch.setattr(lookup_triton, "theta_triton",
                        lambda *args: calls.append(args) or theta(*args[:4], use_triton=False))
    z, values = torch.randn(3, 16), torch.randn(256, 4)
    theta(z, values, SMALL)
    assert not calls
    theta(z, values, SMALL, use_triton=True)
    assert len(calls) == 1


def test_block_with_triton_path_under_torch_compile(device):
    torch.manual_seed(5)
    block = LRAMBlock(16, memory_size=256, use_triton=True).to(device)
    x = torch.randn(1, 5, 16).to(device)
    expected = block(x)
    compiled = torch.compile(block, backend="eager")
    out = compiled(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert block.values.grad is not None and block.query.weight.grad is not None


def test_block_rejects_bad_configuration():
    with pytest.raises(ValueError):
        LRAMBlock(40, memory_size=256)
    with pytest.raises(ValueError):
        LRAMBlock(32)
    with pytest.raises(ValueError):
        LRAMBlock(32, memory_size=256, K=SMALL)
    with pytest.raises(ValueError):
        LRAMBlock(32, memory_size=256, query_norm="rms")


# --- row-sparse value gradients ----------------------------------------------------------------------

@pytest.mark.parametrize("K, dtype", [pytest.param(SMALL, torch.float64, id="K4-fp64"),
                                      pytest.param((8,) * 8, torch.float32, id="K8-fp32"),
                                      pytest.param(SMALL, torch.bfloat16, id="K4-bf16")])
def test_sparse_value_gradient_is_the_dense_one_on_the_rows_read(K, dtype):
    g = torch.Generator().manual_seed(6)
    z = torch.randn(3, 5, 2, 16, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    values = torch.randn(L.memory_size(K), 6, generator=g).to(dtype)
    upstream = torch.randn(3, 5, 2, 6, generator=g, dtype=z.dtype)
    results = []
    for sparse in (False, True):
        z_, v_ = z.clone().requires_grad_(), values.clone().requires_grad_()
        out = theta(z_, v_, K, use_triton=False, sparse_values=sparse)
        out.backward(upstream)
        results.append((out, z_.grad, v_.grad))
    (out, grad_z, grad_v), (out_s, grad_z_s, grad_v_s) = results
    assert grad_v_s.layout == torch.sparse_coo and grad_v_s.dtype == dtype
    # Two autograd graphs, so the sums may be ordered differently: the dtype's default tolerances, not equality.
    torch.testing.assert_close(out_s, out)
    torch.testing.assert_close(grad_z_s, grad_z)
    atol = 1e-2 if dtype == torch.bfloat16 else 1e-12  # both sum in fp32, the sparse one in another order
    torch.testing.assert_close(grad_v_s.to_dense().double(), grad_v.double(), rtol=atol, atol=atol)
    # coalesced: one row per memory location read, each location once
    rows = grad_v_s._indices()[0]
    _, q = torus_query(z, K)
    read = naive.lookup(q, K)[0].unique()
    assert torch.equal(rows.sort().values, read) and rows.unique().numel() == rows.numel()


@pytest.mark.parametrize("use_triton", [False, True])
def test_sparse_adam_step_changes_only_rows_read(use_triton, device):
    torch.manual_seed(7)
    block = LRAMBlock(32, memory_size=2 ** 12, sparse_values=True, use_triton=use_triton).to(device)
    x = torch.randn(1, 3, 32).to(device)
    index, _ = block.read_locations(x)
    before = block.values.detach().clone()
    block(x).square().sum().backward()
    assert block.values.grad.layout == torch.sparse_coo
    torch.optim.SparseAdam(block.value_parameters(), lr=1e-2).step()
    changed = (block.values.detach() != before).any(dim=1).nonzero().flatten()
    assert torch.equal(changed, index.unique())
    assert changed.numel() < 3 * 2 * 32 < block.memory_size  # a few rows of many


@pytest.mark.parametrize("use_triton", [False, True])
def test_sparse_values_under_torch_compile(use_triton, device):
    torch.manual_seed(8)
    block = LRAMBlock(16, memory_size=256, use_triton=use_triton, sparse_values=True).to(device)
    x = torch.randn(1, 5, 16).to(device)
    expected = block(x)
    expected.sum().backward()
    eager_grad = block.values.grad.to_dense()
    block.values.grad = None
    out = torch.compile(block, backend="eager")(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert block.values.grad.layout == torch.sparse_coo
    torch.testing.assert_close(block.values.grad.to_dense(), eager_grad)


@pytest.mark.parametrize("use_triton", [False, True])
def test_bf16_value_table_reads_and_learns_like_its_fp32_copy(use_triton, device):
    torch.manual_seed(9)
    block = LRAMBlock(32, memory_size=256, value_dtype=torch.bfloat16, use_triton=use_triton).to(device)
    assert block.values.dtype == torch.bfloat16
    copy = LRAMBlock(32, memory_size=256, use_triton=use_triton).to(device)
    copy.load_state_dict({k: v.float() for k, v in block.state_dict().items()})  # the same (bf16-exact) values
    x = torch.randn(1, 5, 32).to(device)
    out, out_copy = block(x), copy(x)
    torch.testing.assert_close(out, out_copy, atol=1e-5, rtol=1e-5)  # both sum in fp32
    out.square().sum().backward()
    out_copy.square().sum().backward()
    assert block.values.grad.dtype == torch.bfloat16
    torch.testing.assert_close(block.values.grad.float(), copy.values.grad, atol=1e-2, rtol=1e-2)  # rounded once
    with pytest.raises(ValueError, match="value_dtype"):
        LRAMBlock(32, memory_size=256, value_dtype=torch.float16)
