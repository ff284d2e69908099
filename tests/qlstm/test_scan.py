import pytest
import torch

from projects.qlstm.ops.scan import linear_scan, scan_flops

IMPLS = ["loop", "block", "triton"]


def closed_form_scan(f, u, c0):
    """c_t = (prod_{j<=t} f_j) c0 + sum_{s<=t} (prod_{s<j<=t} f_j) u_s summed term by term; returns (c_all, c_last)."""
    states = []
    for t in range(f.shape[1]):
        coef = torch.ones_like(c0)
        c = u[:, t].clone()
        for s in range(t - 1, -1, -1):
            coef = coef * f[:, s + 1]
            c = c + coef * u[:, s]
        states.append(c + coef * f[:, 0] * c0)
    return torch.stack(states, dim=1), states[-1]


def random_inputs(batch, seq_len, n_heads, d_head, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    # some f above 1: the recurrence is general, not only a decay
    f = (0.3 + 0.75 * torch.rand(batch, seq_len, n_heads, d_head, generator=gen)).to(dtype)
    u = torch.randn(batch, seq_len, n_heads, d_head, generator=gen).to(dtype)
    c0 = torch.randn(batch, n_heads, d_head, generator=gen)
    grad_all = torch.randn(batch, seq_len, n_heads, d_head, generator=gen).to(dtype)
    grad_last = torch.randn(batch, n_heads, d_head, generator=gen)
    return f, u, c0, grad_all, grad_last


def on(device, *tensors):
    return [t.to(device) for t in tensors]


def outputs_and_grads(scan, f, u, c0, grad_all, grad_last):
    f, u, c0 = (x.detach().clone().requires_grad_() for x in (f, u, c0))
    c_all, c_last = scan(f, u, c0)
    ((c_all.to(grad_all.dtype) * grad_all).sum() + (c_last.to(grad_last.dtype) * grad_last).sum()).backward()
    return [c_all, c_last, f.grad, u.grad, c0.grad]


def assert_matches_float64_reference(impl, shape, dtype, block_len, seed, device):
    """The scan on `device` against the closed form in float64 on CPU."""
    f, u, c0, grad_all, grad_last = random_inputs(*shape, dtype, seed)
    got = outputs_and_grads(lambda f, u, c0: linear_scan(f, u, c0, impl=impl, block_len=block_len),
                            *on(device, f, u, c0, grad_all, grad_last))
    want = outputs_and_grads(closed_form_scan, *(x.double() for x in (f, u, c0, grad_all, grad_last)))
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    assert [g.dtype for g in got[2:]] == [dtype, dtype, torch.float32]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, g, w in zip(["c_all", "c_last", "df", "du", "dc0"], got, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g.cpu().double(), w, rtol=tol, atol=tol * scale,
                                   msg=lambda m: f"{impl} {name}: {m}")


@pytest.mark.parametrize("impl", IMPLS)
def test_hand_computed_example(impl, device):
    # c1 = 0.5*4 + 1 = 3, c2 = 0.25*3 + 2 = 2.75, c3 = 2*2.75 + 3 = 8.5
    f = torch.tensor([0.5, 0.25, 2.0], device=device).view(1, 3, 1, 1)
    u = torch.tensor([1.0, 2.0, 3.0], device=device).view(1, 3, 1, 1)
    f.requires_grad_()
    c0 = torch.tensor([4.0], device=device).view(1, 1, 1).requires_grad_()
    c_all, c_last = linear_scan(f, u, c0, impl=impl, block_len=2)
    assert c_all.flatten().tolist() == [3.0, 2.75, 8.5] and c_last.item() == 8.5
    c_last.backward()
    # dc3/df = (c2, f3*c1, f3*f2*c0) and dc3/dc0 = f1*f2*f3
    assert f.grad.flatten().tolist() == [2.0, 6.0, 2.75] and c0.grad.item() == 0.25


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [
    pytest.param((2, 37, 3, 5), id="B2-T37-H3-D5"),
    pytest.param((1, 70, 2, 8), id="B1-T70-H2-D8"),
    pytest.param((3, 9, 1, 24), id="B3-T9-H1-D24"),
    pytest.param((1, 33, 2, 35), id="B1-T33-H2-D35"),
])
def test_matches_float64_reference_fp32(impl, shape, device):
    assert_matches_float64_reference(impl, shape, torch.float32, block_len=16, seed=sum(shape), device=device)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [pytest.param((2, 37, 3, 5), id="B2-T37-H3-D5"),
                                   pytest.param((1, 45, 1, 12), id="B1-T45-H1-D12")])
def test_matches_float64_reference_bf16(impl, shape, device):
    assert_matches_float64_reference(impl, shape, torch.bfloat16, block_len=8, seed=sum(shape), device=device)


@pytest.mark.parametrize("block_len", [1, 4, 5, 16, 64])
def test_block_lengths_not_dividing_seq_len(block_len, device):
    assert_matches_float64_reference("block", (2, 37, 2, 6), torch.float32, block_len, seed=block_len, device=device)


@pytest.mark.parametrize("impl", IMPLS)
def test_two_halves_with_carried_state_equal_whole(impl, device):
    f, u, c0 = on(device, *random_inputs(2, 41, 2, 7, torch.float32, seed=3)[:3])
    whole_all, whole_last = linear_scan(f, u, c0, impl=impl, block_len=8)
    first_all, first_last = linear_scan(f[:, :17], u[:, :17], c0, impl=impl, block_len=8)
    second_all, second_last = linear_scan(f[:, 17:], u[:, 17:], first_last, impl=impl, block_len=8)
    torch.testing.assert_close(torch.cat([first_all, second_all], dim=1), whole_all)
    torch.testing.assert_close(second_last, whole_last)


@pytest.mark.parametrize("impl", IMPLS)
def test_no_initial_state_means_zeros(impl, device):
    f, u, _, _, _ = random_inputs(2, 11, 2, 3, torch.float32, seed=4)
    c_all, c_last = linear_scan(*on(device, f, u), impl=impl)
    want_all, want_last = closed_form_scan(f.double(), u.double(), torch.zeros(2, 2, 3, dtype=torch.float64))
    torch.testing.assert_close(c_all.cpu().double(), want_all, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_last.cpu().double(), want_last, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl, device):
    f, u, c0, _, _ = random_inputs(2, 15, 3, 4, torch.float32, seed=7)
    f_dev, u_dev, c0_dev = on(device, f, u, c0)
    # time-major storage seen through a transpose, and every other head dim of a wider tensor
    f_strided = f_dev.transpose(0, 1).contiguous().transpose(0, 1)
    u_strided = torch.stack([u_dev, torch.zeros_like(u_dev)], dim=-1).flatten(-2)[..., ::2]
    assert not f_strided.is_contiguous() and not u_strided.is_contiguous()
    c_all, c_last = linear_scan(f_strided, u_strided, c0_dev, impl=impl)
    want_all, want_last = closed_form_scan(f.double(), u.double(), c0.double())
    torch.testing.assert_close(c_all.cpu().double(), want_all, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_last.cpu().double(), want_last, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("used", ["c_all", "c_last"])
def test_triton_backward_when_one_output_unused(used, device):
    f, u, c0 = on(device, *random_inputs(1, 19, 1, 4, torch.float32, seed=5)[:3])
    grads = {}
    for impl in ["loop", "triton"]:
        f_, u_, c0_ = (x.clone().requires_grad_() for x in (f, u, c0))
        c_all, c_last = linear_scan(f_, u_, c0_, impl=impl)
        (c_all if used == "c_all" else c_last).sum().backward()
        grads[impl] = [f_.grad, u_.grad, c0_.grad]
    for got, want in zip(grads["triton"], grads["loop"]):
        torch.testing.assert_close(got, want)


def test_triton_under_torch_compile(device):
    f, u, c0, grad_all, grad_last = on(device, *random_inputs(2, 13, 1, 3, torch.float32, seed=6))

    def scan(f, u, c0):
        c_all, c_last = linear_scan(f, u, c0, impl="triton")
        return torch.sin(c_all), c_last * 2

    compiled = torch.compile(scan, backend="aot_eager")
    got = outputs_and_grads(compiled, f, u, c0, grad_all, grad_last)
    want = outputs_and_grads(scan, f, u, c0, grad_all, grad_last)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("call, message", [
    pytest.param(lambda: linear_scan(torch.rand(2, 5, 3), torch.rand(2, 5, 3)), "batch, time, heads, head_dim",
                 id="3d-inputs"),
    pytest.param(lambda: linear_scan(torch.rand(2, 5, 1, 3), torch.rand(2, 5, 1, 3), torch.zeros(2, 3)), "c0 must be",
                 id="c0-shape"),
    pytest.param(lambda: linear_scan(torch.rand(1, 5, 1, 3), torch.rand(1, 5, 1, 3), impl="cuda"), "impl must be",
                 id="unknown-impl"),
    pytest.param(lambda: linear_scan(torch.rand(1, 5, 1, 3), torch.rand(1, 5, 1, 3), impl="block", block_len=0),
                 "block_len", id="block-len-0"),
    pytest.param(lambda: linear_scan(torch.rand(1, 5, 1, 3).double(), torch.rand(1, 5, 1, 3).double(), impl="triton"),
                 "impl='loop' or 'block'", id="triton-float64"),
])
def test_bad_input_raises_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_scan_flops_counts_one_multiply_and_one_add_per_element():
    # qLSTM small at batch 1: 12 heads * 64 dims * 512 steps * 2
    assert scan_flops(batch=1, seq_len=512, n_heads=12, d_head=64) == 786_432
    assert scan_flops(batch=3, seq_len=5, n_heads=2, d_head=7) == 420
