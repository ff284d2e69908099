"""The Triton lattice read against the PyTorch reference (ops/lookup/naive.py), both on the test device
(under the interpreter on CPU)."""
import pytest
import torch

from projects.lram_gpt import lattice as L
from projects.lram_gpt.memory import theta
from projects.lram_gpt.ops.lookup import naive
from projects.lram_gpt.ops.lookup.triton import interpolate_triton, lookup_triton, theta_triton, threshold_probes

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
    out_ref = naive.interpolate(q_ref, v_ref, K, topk)
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
        pytest.param(SMALL, 37, torch.float32, "atomic", id="K4-n37-fp32-atomic"),
        pytest.param(SMALL, 19, torch.bfloat16, "atomic", id="K4-n19-bf16-atomic"),
        pytest.param(SMALL, 21, torch.float32, "segment", id="K4-n21-fp32-segment"),
        pytest.param(SMALL, 13, torch.bfloat16, "segment", id="K4-n13-bf16-segment"),
        pytest.param(ODD, 23, torch.float32, "atomic", id="odd-n23-fp32-atomic"),
        pytest.param((8,) * 8, 17, torch.bfloat16, "atomic", id="K8-n17-bf16-atomic"),
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


@pytest.mark.parametrize("width, dtype", [(24, torch.float32), (21, torch.bfloat16)], ids=["m24-fp32", "m21-bf16"])
def test_value_dim_that_is_not_a_power_of_two_and_small_topk(width, dtype, device):
    """topk 7: an odd count of slots for the backward's loops; m = 21: a bf16 row not read as words of two."""
    K = SMALL
    q = random_queries(11, K, seed=3).view(11, 1, 8)  # extra leading dims are kept
    values = torch.randn(L.memory_size(K), width, generator=torch.Generator().manual_seed(2)).to(dtype)
    (out_ref, gq_ref, gv_ref), (out_tri, gq_tri, gv_tri) = reference_and_triton(q, values, K, "atomic", device,
                                                                                 topk=7)
    assert out_tri.shape == (11, 1, width)
    torch.testing.assert_close(out_tri, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gq_tri, gq_ref, atol=1e-4, rtol=1e-4)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # fp32 sums rounded once to bf16
    torch.testing.assert_close(gv_tri.float(), gv_ref, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("K", [pytest.param(SMALL, id="K4"), pytest.param(ODD, id="odd")])
def test_lookup_matches_reference(K, device):
    q = random_queries(29, K, seed=4).to(device)
    index, weight = lookup_triton(q, K)
    index_ref, weight_ref = naive.lookup(q, K)
    assert index.dtype == torch.int64 and index.shape == (29, 32)
    assert (weight[:, 1:] <= weight[:, :-1]).all()
    torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)
    n = L.memory_size(K)
    torch.testing.assert_close(weight_per_location(index, weight, n), weight_per_location(index_ref, weight_ref, n),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("topk", [16, 64])
def test_lookup_with_other_candidate_counts(topk, device):
    """topk 16 and 64 search 42 and 173 candidates: 2 and 8 a lane, where 32 search 4 a lane."""
    K = (8,) * 8
    q = random_queries(21, K, seed=topk).to(device)
    index, weight = lookup_triton(q, K, topk)
    index_ref, weight_ref = naive.lookup(q, K, topk)
    torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)
    n = L.memory_size(K)
    torch.testing.assert_close(weight_per_location(index, weight, n), weight_per_location(index_ref, weight_ref, n),
                               atol=1e-6, rtol=1e-6)


def test_lookup_on_a_torus_with_a_period_above_2_to_21(device):
    """K_1 = 2^22: every period a power of two, but too long for the fp32 memory index of the kernel's step 5,
    so the int32 one runs (2^28 locations: no table needed to look up)."""
    K = (2**22,) + (4,) * 7
    g = torch.Generator().manual_seed(6)
    q = (torch.rand(23, 8, generator=g) - 0.5) * torch.tensor([2.0**21] + [8.0] * 7)
    index, weight = lookup_triton(q.to(device), K)
    index_ref, weight_ref = naive.lookup(q.to(device), K)
    assert int(index.max()) < L.memory_size(K) and int(index.max()) > 2**26  # far into the table
    assert torch.equal(index.sort(-1).values, index_ref.sort(-1).values)
    torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)


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
    expected = naive.interpolate(q.detach(), values.detach(), K) * 2
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


@pytest.mark.parametrize("K, n_rows, dtype", [pytest.param(SMALL, 13, torch.float32, id="K4-n13-fp32"),
                                               pytest.param(ODD, 15, torch.bfloat16, id="odd-n15-bf16")])
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
    assert torch.equal(rows, naive.lookup(q, K)[0].unique())  # unique and rising: one summed row per location read


def run_layouts(n_rows, topk, n_locations, kind):
    """Memory indices [n_rows, topk] whose sorted runs fall awkwardly for the segment sums' blocks of entries."""
    g = torch.Generator().manual_seed(n_rows)
    n = n_rows * topk
    if kind == "one_run":  # every entry reads one location: a run across every block and stretch
        return torch.full((n_rows, topk), n_locations // 2, dtype=torch.int32)
    if kind == "long_runs":  # runs of 5 to 40 entries: many cross a block's or a stretch's edge
        lengths = torch.randint(5, 41, (n,), generator=g)
        return torch.repeat_interleave(torch.arange(n) * 3 % n_locations, lengths)[:n].view(n_rows, topk).int()
    return torch.randint(0, n_locations, (n_rows, topk), generator=g, dtype=torch.int32)  # mostly runs of 1


@pytest.mark.parametrize("parts_first", [True, False], ids=["parts-first", "stretches-first"])
@pytest.mark.parametrize("kind", ["one_run", "long_runs", "random"])
@pytest.mark.parametrize("n_rows, topk, width, grad_dtype", [
    pytest.param(5, 32, 64, torch.bfloat16, id="160-entries-bf16"),  # 2 whole blocks of 64 entries and a half
    pytest.param(7, 9, 40, torch.float32, id="63-entries-fp32"),  # a block but its last entry; m not a power of 2
    pytest.param(3, 11, 3, torch.bfloat16, id="33-entries-m3-bf16"),  # half a block, m below a vector
])
def test_segment_sums_match_index_add(parts_first, kind, n_rows, topk, width, grad_dtype, device, monkeypatch):
    """The segment sums (dense and compact) against index_add_ of each entry's weighted gradient row, in both
    orders of the kernel's dimensions (the launch picks one by Triton version)."""
    from projects.lram_gpt.ops.lookup import triton as kernels
    from projects.lram_gpt.ops.lookup.triton import _segment_sum

    monkeypatch.setattr(kernels, "PARTS_FIRST", parts_first)

    n_locations = 50
    g = torch.Generator().manual_seed(3)
    index = run_layouts(n_rows, topk, n_locations, kind)
    slot_weight = torch.rand(n_rows, topk, generator=g)
    grad_rows = torch.randn(n_rows, width, generator=g).to(grad_dtype)
    contributions = (slot_weight.double()[:, :, None] * grad_rows.double()[:, None, :]).view(-1, width)
    expected = torch.zeros(n_locations, width, dtype=torch.float64).index_add_(0, index.view(-1).long(), contributions)
    index, slot_weight, grad_rows = index.to(device), slot_weight.to(device), grad_rows.to(device)
    dense = torch.zeros(n_locations, width, device=device)
    dense = _segment_sum(grad_rows, index, slot_weight, dense, topk, (n_locations, width))
    # fp32 sums of up to 160 products of order 1: a few 1e-6 relative at most
    torch.testing.assert_close(dense.cpu().double(), expected, rtol=1e-5, atol=1e-5)
    rows_read, sums = _segment_sum(grad_rows, index, slot_weight, None, topk, (n_locations, width))
    read = index.view(-1).unique().cpu()
    assert torch.equal(rows_read.cpu().long(), read)
    torch.testing.assert_close(sums.cpu().double(), expected[read], rtol=1e-5, atol=1e-5)


# --- the fused read theta (torus query, lookup, scale and cast in one kernel) -----------------------------

def theta_reference_and_triton(z, values, K, value_grad, device, out_dtype=None):
    """theta's output and gradients on the reference path (fp32 copies) and the kernel, for one upstream gradient."""
    z, values = z.to(device), values.to(device)
    z_ref = z.float().clone().requires_grad_()
    v_ref = values.float().clone().requires_grad_()
    out_ref = theta(z_ref, v_ref, K, use_triton=False)
    grad_out = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(0)).to(device)
    out_ref.backward(grad_out)
    z_tri, v_tri = z.clone().requires_grad_(), values.clone().requires_grad_()
    out_tri = theta_triton(z_tri, v_tri, K, value_grad=value_grad, out_dtype=out_dtype)
    out_tri.backward(grad_out.to(out_tri.dtype))
    assert z_tri.grad.dtype == z.dtype and v_tri.grad.dtype == values.dtype
    return (out_ref, z_ref.grad, v_ref.grad), (out_tri, z_tri.grad, v_tri.grad)


@pytest.mark.parametrize(
    "K, n_tokens, z_dtype, values_dtype, value_grad",
    [
        pytest.param(SMALL, 9, torch.float32, torch.float32, "atomic", id="K4-n9-fp32-atomic"),
        pytest.param(ODD, 7, torch.float32, torch.float32, "segment", id="odd-n7-fp32-segment"),
        pytest.param(ODD, 5, torch.bfloat16, torch.bfloat16, "atomic", id="odd-n5-bf16-atomic"),
        pytest.param((8,) * 8, 3, torch.float32, torch.bfloat16, "segment", id="K8-n3-fp32z-bf16values-segment"),
    ],
)
@pytest.mark.parametrize("parts_first", [True, False], ids=["parts-first", "rows-first"])
def test_theta_kernel_matches_reference(K, n_tokens, z_dtype, values_dtype, value_grad, parts_first, device,
                                        monkeypatch):
    """In both orders of the backward's row dimensions (the launch picks one by Triton version)."""
    from projects.lram_gpt.ops.lookup import triton as kernels

    monkeypatch.setattr(kernels, "PARTS_FIRST", parts_first)
    g = torch.Generator().manual_seed(n_tokens)
    z = torch.randn(n_tokens, 2, 16, generator=g)  # two heads per token: an odd number of rows
    z[0, 0, 3] = z[0, 0, 11] = 0.0  # z_4 = 0: arg 0, the harmonic scale 0, finite gradients
    z = z.to(z_dtype)
    values = torch.randn(L.memory_size(K), 40, generator=g).to(values_dtype)  # m = 40: not a power of two
    (out_ref, gz_ref, gv_ref), (out_tri, gz_tri, gv_tri) = theta_reference_and_triton(z, values, K, value_grad,
                                                                                       device)
    assert out_tri.dtype == torch.float32 and out_tri.shape == (n_tokens, 2, 40)
    torch.testing.assert_close(out_tri, out_ref, atol=1e-5, rtol=1e-5)
    # arg z by a polynomial (1e-7 rad) and sums in another order; a bf16 z gets its gradient rounded to bf16
    z_tolerance = 1e-4 if z_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(gz_tri.float(), gz_ref, atol=z_tolerance, rtol=z_tolerance)
    tolerance = 1e-5 if values_dtype == torch.float32 else 1e-2  # fp32 sums rounded once to bf16
    torch.testing.assert_close(gv_tri.float(), gv_ref, atol=tolerance, rtol=tolerance)


def test_theta_kernel_writes_the_requested_dtype(device):
    g = torch.Generator().manual_seed(11)
    z = torch.randn(5, 16, generator=g)
    values = torch.randn(L.memory_size(SMALL), 64, generator=g)
    (out_ref, gz_ref, gv_ref), (out_tri, gz_tri, gv_tri) = theta_reference_and_triton(
        z, values, SMALL, "atomic", device, out_dtype=torch.bfloat16)
    assert out_tri.dtype == torch.bfloat16
    torch.testing.assert_close(out_tri.float(), out_ref, atol=1e-2, rtol=1e-2)  # one bf16 rounding
    torch.testing.assert_close(gz_tri, gz_ref, atol=1e-2, rtol=1e-2)  # from a bf16 upstream gradient
    torch.testing.assert_close(gv_tri, gv_ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("values_dtype, value_grad", [(torch.float32, "atomic"), (torch.bfloat16, "segment")],
                         ids=["fp32values-atomic", "bf16values-segment"])
def test_theta_backward_from_a_bf16_upstream_gradient(values_dtype, value_grad, device):
    """A bf16 output gets a bf16 upstream gradient (the kernel converts it to fp32 as it loads): with the same
    bf16-valued gradient in the reference, the gradients agree to fp32 precision."""
    g = torch.Generator().manual_seed(12)
    z = torch.randn(7, 16, generator=g).to(device)  # a CPU generator draws on the CPU
    values = torch.randn(L.memory_size(SMALL), 40, generator=g).to(device, values_dtype)  # m = 40: masked columns
    grad_out = torch.randn(7, 40, generator=g).to(device, torch.bfloat16)
    z_ref, v_ref = z.clone().requires_grad_(), values.float().clone().requires_grad_()
    theta(z_ref, v_ref, SMALL, use_triton=False).backward(grad_out.float())
    z_tri, v_tri = z.clone().requires_grad_(), values.clone().requires_grad_()
    theta_triton(z_tri, v_tri, SMALL, value_grad=value_grad, out_dtype=torch.bfloat16).backward(grad_out)
    torch.testing.assert_close(z_tri.grad, z_ref.grad, atol=1e-4, rtol=1e-4)  # as test_theta_kernel_matches_reference
    tolerance = 1e-5 if values_dtype == torch.float32 else 1e-2  # fp32 sums rounded once to bf16
    torch.testing.assert_close(v_tri.grad.float(), v_ref.grad, atol=tolerance, rtol=tolerance)


def test_selection_breaks_exact_ties_as_the_reference(device):
    """Queries whose candidates tie exactly at the k-th distance: on lattice points and halfway between two."""
    K = (8,) * 8
    ties = torch.tensor([[0.0] * 8, [2.0, 2.0, 0, 0, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0, 0, 0],
                         [1.0, 1.0, 1.0, 1.0, 0, 0, 0, 0], [1.0] * 8, [0.5, -0.5, 0.5, 0, 0, 0, 0, 0]])
    for topk in (32, 5):
        index, weight = lookup_triton(ties.to(device), K, topk)
        index_ref, weight_ref = naive.lookup(ties.to(device), K, topk)
        # the same locations, each chosen with the same weight (ties at zero weight included)
        assert torch.equal(index.sort(-1).values, index_ref.sort(-1).values)
        torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)
        positive = weight_ref > 0
        assert torch.equal(index[positive], index_ref[positive])  # and in the same order where they count


@pytest.mark.parametrize("topk", [1, 2, 3])
def test_selection_where_the_first_probe_counts_no_point(topk, device):
    """A small topk probes first below d2 = 4, where a deep hole of the lattice, (2, 0, ..., 0), has no point: the
    search must move up from a count of 0 (and then break the ties at d2 = 4 as the reference)."""
    K = (8,) * 8
    holes = torch.tensor([[2.0] + [0.0] * 7, [0.0, -2.0, 0, 0, 0, 0, 0, 0], [1.9, 0.1, 0, 0, 0, 0, 0, 0.05],
                          [2.1, 0.0, 0.2, 0, 0, 0, 0, -0.1]])
    index, weight = lookup_triton(holes.to(device), K, topk)
    index_ref, weight_ref = naive.lookup(holes.to(device), K, topk)
    assert torch.equal(index.sort(-1).values, index_ref.sort(-1).values)
    torch.testing.assert_close(weight, weight_ref, atol=1e-6, rtol=1e-6)


def test_threshold_search_takes_few_probes():
    probes, tie = threshold_probes(random_queries(512, (16,) * 8, seed=12))
    assert 1 <= probes.float().mean() < 4.5 and probes.max() < 60 and not tie.any()  # what the cost model charges
    on_lattice_points = torch.tensor([[0.0] * 8, [1.0] * 8])  # 31 of 32 slots tie at d2 = 8
    assert threshold_probes(on_lattice_points)[1].all()


def test_theta_kernel_bad_input_raises():
    values = torch.zeros(L.memory_size(SMALL), 8)
    with pytest.raises(ValueError, match="16 inputs"):
        theta_triton(torch.zeros(3, 8), values, SMALL)
    with pytest.raises(ValueError, match="value_grad"):
        theta_triton(torch.zeros(3, 16), values, SMALL, value_grad="scatter")


# --- edges: inputs of any finite size, and non-finite ones ------------------------------------------------

def theta_in_float64(z, values, K):
    """theta by its definition in float64, without the fp32 paths' rescaling: the independent answer for
    heads whose |z_i| lie within 1e-100..1e100."""
    z, values = z.double(), values.double()
    real, imag = z[..., :8], z[..., 8:]
    scale = 1 / (1 / torch.sqrt(real * real + imag * imag)).sum(-1, keepdim=True)
    q = torch.atan2(imag, real) * (torch.tensor(K, dtype=torch.float64) / (2 * torch.pi))
    return scale * naive.interpolate(q, values, K)


# |z_i| from 1e-30 to 1e30 (the old kernels: an inf gradient below ~1e-15, a wrong one above ~7e12), a head
# whose coordinates span 12 orders of magnitude, and one whose first pair lies 1e-30 below the others (its |w_1|^2
# underflows to 0: the kernels once read it at angle 0, a relative error of ~1 in theta)
MAGNITUDES = [1e-30, 1e-17, 1.0, 1e13, 1e30, "mixed", "tiny pair"]


@pytest.mark.parametrize("z_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["triton", "reference"])
def test_theta_is_right_for_tiny_and_huge_heads(path, z_dtype, device):
    K = (8,) * 8
    g = torch.Generator().manual_seed(13)
    values = torch.randn(L.memory_size(K), 24, generator=g)
    for magnitude in MAGNITUDES:
        z = torch.randn(2, 3, 16, generator=g)
        if magnitude == "mixed":
            z[..., :4] *= 1e-12  # z_1..z_4: re 1e-12, im 1
            z[..., 8:12] *= 1e-12
        elif magnitude == "tiny pair":
            z[..., [0, 8]] *= 1e-30
        else:
            z = z * magnitude
        z = z.to(z_dtype)  # the float64 answer is for these (rounded) inputs
        size = magnitude if isinstance(magnitude, float) else 1.0
        z_expected = z.double().requires_grad_()
        v_expected = values.double().requires_grad_()
        expected = theta_in_float64(z_expected, v_expected, K)
        grad_out = torch.randn(expected.shape, generator=g, dtype=torch.float64)
        expected.backward(grad_out)
        z_, v_ = z.to(device).clone().requires_grad_(), values.to(device).clone().requires_grad_()
        out = theta(z_, v_, K, use_triton=path == "triton")
        out.backward(grad_out.to(device, out.dtype))
        # theta scales with z and its gradient to z does not: compare outputs and value gradients relative to it
        torch.testing.assert_close(out.double().cpu() / size, expected.detach() / size, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v_.grad.double().cpu() / size, v_expected.grad / size, atol=1e-5, rtol=1e-5)
        assert z_expected.grad.abs().max() < 10  # of order 1 at every size
        tolerance = 1e-4 if z_dtype == torch.float32 else 1e-2  # a bf16 z gets its gradient in bf16
        torch.testing.assert_close(z_.grad.double().cpu(), z_expected.grad, atol=tolerance, rtol=tolerance,
                                   msg=lambda text: f"|z| ~ {magnitude}: {text}")


@pytest.mark.parametrize("path", ["triton", "reference"])
def test_non_finite_heads_give_nan_and_read_in_range(path, device):
    """A NaN or infinite input makes its head read at q = 0 with a NaN scale: NaN output, NaN in the value
    gradient's rows it read, a zero gradient to its z; the other heads are untouched."""
    K = SMALL
    g = torch.Generator().manual_seed(14)
    z = torch.randn(5, 16, generator=g)
    z[1, 3], z[3, 12] = float("nan"), float("inf")
    values = torch.randn(L.memory_size(K), 8, generator=g)
    z_, v_ = z.to(device).clone().requires_grad_(), values.to(device).clone().requires_grad_()
    out = theta(z_, v_, K, use_triton=path == "triton")
    out.backward(torch.ones_like(out))
    bad = torch.tensor([False, True, False, True, False])
    assert out[bad.to(device)].isnan().all() and out[~bad.to(device)].isfinite().all()
    assert torch.equal(z_.grad[bad.to(device)].cpu(), torch.zeros(2, 16))
    good = ~bad
    z_good, v_good = z[good].clone().requires_grad_(), values.clone().requires_grad_()
    out_good = theta(z_good, v_good, K, use_triton=False)
    out_good.backward(torch.ones_like(out_good))
    torch.testing.assert_close(out[good.to(device)].cpu(), out_good, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z_.grad[good.to(device)].cpu(), z_good.grad, atol=1e-4, rtol=1e-4)
    # the bad heads' rows: those read at q = 0
    rows_at_zero = naive.lookup(torch.zeros(1, 8), K)[0].unique()
    nan_rows = v_.grad.isnan().any(-1).nonzero().flatten().cpu()
    assert torch.equal(nan_rows, rows_at_zero)
    finite_rows = ~v_.grad.isnan().any(-1).cpu()
    torch.testing.assert_close(v_.grad.cpu()[finite_rows], v_good.grad[finite_rows], atol=1e-5, rtol=1e-5)


def test_non_finite_and_far_queries_in_lattice_coordinates(device):
    """interpolate_triton / lookup_triton: q NaN, inf or beyond 2^22 give NaN weights and outputs, in-range rows."""
    K = ODD
    q = random_queries(6, K, seed=15)
    q[1, 0], q[2, 5], q[4, 7] = float("nan"), -float("inf"), 3e7
    index, weight = lookup_triton(q.to(device), K)
    assert ((index >= 0) & (index < L.memory_size(K))).all()
    bad = torch.tensor([False, True, True, False, True, False]).to(device)
    assert weight[bad].isnan().all() and weight[~bad].isfinite().all()
    values = torch.randn(L.memory_size(K), 16, generator=torch.Generator().manual_seed(16)).to(device)
    out = interpolate_triton(q.to(device), values, K)
    assert out[bad].isnan().all()
    torch.testing.assert_close(out[~bad], naive.interpolate(q.to(device)[~bad], values, K), atol=1e-5, rtol=1e-5)
