"""The window attention (projects/feedback/ops/window_attention) against a brute-force loop over batch rows, heads
and window places written from its definition, score_j = scale * q . (k_{(start+j) mod S} + pos_j): the reference
(naive) in float64 and the Triton kernel (under the interpreter on CPU, tests/conftest.py) in fp32, outputs and the
gradients of q, the key and value buffers and pos, on fresh random inputs: odd sizes, a window crossing the
kernel's blocks of 32 slots and ending inside one, a window of one slot, a ring that wraps, head widths that are not
powers of two. The backward adds into the gradient buffers; a test checks that what they held is kept."""
import math

import pytest
import torch

from projects.feedback.ops.window_attention import naive, window_attention

CASES = [  # B, H, S, D, tau, start
    pytest.param(2, 3, 11, 5, 7, 4, id="odd-sizes"),
    pytest.param(1, 2, 80, 33, 70, 9, id="three-blocks-odd-width"),
    pytest.param(3, 1, 9, 8, 9, 5, id="ring-wraps"),
    pytest.param(2, 2, 13, 8, 6, 10, id="longer-buffer-wraps"),
    pytest.param(2, 2, 6, 16, 1, 3, id="one-slot"),
    pytest.param(1, 1, 40, 12, 32, 8, id="one-full-block"),
]


def brute_force(q, k_buf, v_buf, pos, start, scale):
    B, H, S, D = k_buf.shape
    tau = pos.shape[0]
    rows = []
    for b in range(B):
        heads = []
        for h in range(H):
            slots = [(start + j) % S for j in range(tau)]
            scores = torch.stack([scale * (q[b, h] * (k_buf[b, h, s] + pos[j])).sum() for j, s in enumerate(slots)])
            p = torch.softmax(scores, dim=0)
            heads.append(sum(p[j] * v_buf[b, h, s] for j, s in enumerate(slots)))
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def inputs(B, H, S, D, tau, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 100 * S + D)
    tensors = [torch.randn(B, H, D, generator=g), torch.randn(B, H, S, D, generator=g),
               torch.randn(B, H, S, D, generator=g), torch.randn(tau, D, generator=g)]
    return [t.to(device=device, dtype=dtype).requires_grad_() for t in tensors]


def outputs_and_grads(fn, tensors, upstream):
    out = fn(*tensors)
    return (out, *torch.autograd.grad(out, tensors, upstream))


NAMES = ("out", "q", "k", "v", "pos")


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("B,H,S,D,tau,start", CASES)
def test_matches_brute_force(impl, B, H, S, D, tau, start, device):
    scale = 1 / math.sqrt(D)
    dtype = torch.float64 if impl == "naive" else torch.float32
    tensors = inputs(B, H, S, D, tau, device if impl == "triton" else "cpu", dtype)
    upstream = torch.randn(B, H, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = outputs_and_grads(lambda *t: brute_force(*t, start, scale),
                             [t.detach().cpu().double().requires_grad_() for t in tensors], upstream)
    got = outputs_and_grads(lambda *t: window_attention(*t, start, scale, impl=impl), tensors,
                            upstream.to(tensors[0]))
    # float64: only rounding of sums over <= 70 terms; fp32 kernel: sums of O(1) terms over 70 slots x 33 features
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    for expected, actual, name in zip(want, got, NAMES):
        assert actual.dtype == dtype
        torch.testing.assert_close(actual.cpu().double(), expected, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


def test_bf16_buffers_are_close_to_the_fp64_reference(device):
    B, H, S, D, tau, start = 2, 2, 50, 32, 37, 11
    tensors = inputs(B, H, S, D, tau, device, torch.bfloat16)
    upstream = torch.randn(B, H, D, generator=torch.Generator().manual_seed(2))
    want = outputs_and_grads(lambda *t: brute_force(*t, start, D ** -0.5),
                             [t.detach().cpu().double().requires_grad_() for t in tensors], upstream.double())
    got = outputs_and_grads(lambda *t: window_attention(*t, start, D ** -0.5, impl="triton"), tensors,
                            upstream.to(device, torch.bfloat16))
    for expected, actual, name in zip(want, got, NAMES):
        assert actual.dtype == torch.bfloat16
        # inputs rounded to bf16 (8 bits of mantissa), fp32 inside, output rounded to bf16 again
        scale = expected.abs().max().item()
        torch.testing.assert_close(actual.cpu().double(), expected, rtol=0.05, atol=0.02 * scale,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("impl", ["naive", "triton"])
def test_backward_adds_into_the_gradient_buffers(impl, device):
    """The segment keeps one gradient buffer for all steps and layers: each call must add, never overwrite."""
    from projects.feedback.ops.window_attention import implementation

    B, H, S, D, tau, start = 2, 2, 12, 8, 5, 9  # slots 9, 10, 11, 0, 1: the ring wraps
    device = device if impl == "triton" else torch.device("cpu")
    ops = implementation(impl, device)
    q, k_buf, v_buf, pos = (t.detach() for t in inputs(B, H, S, D, tau, device))
    y, saved = torch.empty(B, H, D, device=device), torch.empty(ops.saved_shape(B, H, tau), device=device)
    ops.attend(q, k_buf, v_buf, pos, start, D ** -0.5, y, saved)
    dy = torch.randn(B, H, D, generator=torch.Generator().manual_seed(3)).to(device)
    zeros = [torch.zeros(B, H, S, D, device=device) for _ in range(2)]
    held = [torch.randn(B, H, S, D, generator=torch.Generator().manual_seed(4 + i)).to(device) for i in range(2)]
    added = [h.clone() for h in held]
    dq = torch.empty_like(q)
    ops.attend_backward(q, k_buf, v_buf, pos, start, D ** -0.5, y, saved, dy, *zeros, dq)
    ops.attend_backward(q, k_buf, v_buf, pos, start, D ** -0.5, y, saved, dy, *added, dq)
    outside = torch.tensor([s not in (9, 10, 11, 0, 1) for s in range(S)], device=device)
    for grad, before, after in zip(zeros, held, added):
        torch.testing.assert_close(after, before + grad, rtol=1e-6, atol=1e-6)
        assert grad[:, :, outside].abs().max() == 0 and grad[:, :, ~outside].abs().min() > 0


def test_bad_shapes_are_refused():
    q, k_buf, v_buf, pos = (t.detach() for t in inputs(1, 2, 6, 4, 3, "cpu"))
    with pytest.raises(ValueError, match="window of tau = 7 slots"):
        window_attention(q, k_buf, v_buf, torch.zeros(7, 4), 0, 0.5)
    with pytest.raises(ValueError, match="need q"):
        window_attention(q[:, :1], k_buf, v_buf, pos, 0, 0.5)
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        window_attention(q, k_buf, v_buf, pos, 0, 0.5, impl="flash")


def test_reference_window_is_a_view_unless_it_wraps():
    buffer = torch.arange(2 * 1 * 5 * 1.0).view(2, 1, 5, 1)
    assert naive.window_slots(buffer, 1, 3)._base is not None
    wrapped = naive.window_slots(buffer, 3, 4)  # slots 3, 4, 0, 1
    assert wrapped.flatten().tolist() == [3, 4, 0, 1, 8, 9, 5, 6]


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("start", [0, 4], ids=["in-order", "ring-wraps"])
def test_forward_without_a_backward_keeps_nothing_and_gives_the_same_output(impl, start, device):
    """Evaluation and decoding pass no store (the reference then runs PyTorch's fused attention with a bias)."""
    from projects.feedback.ops.window_attention import implementation

    device = device if impl == "triton" else torch.device("cpu")
    ops = implementation(impl, device)
    B, H, S, D = 2, 3, 7, 8
    q, k_buf, v_buf, pos = (t.detach() for t in inputs(B, H, S, D, S, device))
    kept, alone = torch.empty(B, H, D, device=device), torch.empty(B, H, D, device=device)
    ops.attend(q, k_buf, v_buf, pos, start, D ** -0.5, kept, torch.empty(ops.saved_shape(B, H, S), device=device))
    ops.attend(q, k_buf, v_buf, pos, start, D ** -0.5, alone, None)
    torch.testing.assert_close(alone, kept, rtol=1e-5, atol=1e-6)
    want = brute_force(q.cpu().double(), k_buf.cpu().double(), v_buf.cpu().double(), pos.cpu().double(), start,
                       D ** -0.5)
    torch.testing.assert_close(alone.cpu().double(), want, rtol=1e-5, atol=1e-5)


ONE_PASS_CASES = [  # N queries over one window (the layers of a step), B, H, S, D, tau, start
    pytest.param(1, 3, 2, 12, 5, 7, 4, id="one-query-odd-sizes"),
    pytest.param(2, 1, 3, 45, 8, 37, 6, id="two-queries-odd-tau-two-blocks"),
    pytest.param(3, 5, 1, 9, 6, 3, 5, id="three-queries-odd-batch-window-at-the-end"),
]


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("N,B,H,S,D,tau,start", ONE_PASS_CASES)
def test_one_pass_over_the_window_equals_one_pass_per_query(impl, N, B, H, S, D, tau, start, device):
    """The segment's backward from ONE_PASS_MIN_LAYERS layers on: each query's attend_backward leaves the window to
    add_window_gradients, which adds all N queries' key and value gradients at once, against the reference's
    backward of each query alone adding into the buffers (float64): dq, the score gradients (pos's), the weights
    and the buffers, which held random values before."""
    from projects.feedback.ops.window_attention import implementation

    device = device if impl == "triton" else torch.device("cpu")
    ops = implementation(impl, device)
    dtype = torch.float64 if impl == "naive" else torch.float32
    g = torch.Generator().manual_seed(7 * N + S)
    q, dy = torch.randn(2, N, B, H, D, generator=g, dtype=torch.float64)
    k_buf, v_buf, held_k, held_v = torch.randn(4, B, H, S, D, generator=g, dtype=torch.float64)
    pos = torch.randn(tau, D, generator=g, dtype=torch.float64)
    scale = D ** -0.5

    want_k, want_v = held_k.clone(), held_v.clone()
    want_dq, want_dscore, want_p = [], [], []
    for n in range(N):
        y, p = torch.empty(B, H, D, dtype=torch.float64), torch.empty(B, H, tau, dtype=torch.float64)
        naive.attend(q[n], k_buf, v_buf, pos, start, scale, y, p)
        dq = torch.empty_like(y)
        want_dscore.append(naive.attend_backward(q[n], k_buf, v_buf, pos, start, scale, y, p, dy[n], want_k, want_v,
                                                 dq))
        want_dq.append(dq)
        want_p.append(p)

    on = [t.to(device, dtype) for t in (q, dy, k_buf, v_buf, pos)]
    qd, dyd, kd, vd, posd = on
    acc = naive.accumulation_dtype(qd)
    got_k, got_v = held_k.to(device, acc, copy=True), held_v.to(device, acc, copy=True)
    dscore, weights = (torch.empty(N, B, H, tau, device=device, dtype=acc) for _ in range(2))
    dqs = torch.empty(N, B, H, D, device=device, dtype=dtype)
    saved = torch.empty(N, *ops.saved_shape(B, H, tau), device=device, dtype=acc)
    for n in range(N):
        y = torch.empty(B, H, D, device=device, dtype=dtype)
        ops.attend(qd[n], kd, vd, posd, start, scale, y, saved[n])
        ops.attend_backward(qd[n], kd, vd, posd, start, scale, y, saved[n], dyd[n], None, None, dqs[n], dscore[n],
                            weights[n])
    ops.add_window_gradients(qd, dscore, weights, dyd, got_k, got_v, start)
    # float64: sums in another order; fp32: sums of O(1) terms over <= 37 slots x 8 features and 3 queries
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    for name, got, want in (("dq", dqs, torch.stack(want_dq)), ("dscore", dscore, torch.stack(want_dscore)),
                            ("weights", weights, torch.stack(want_p)), ("dk", got_k, want_k), ("dv", got_v, want_v)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
    for got, held in ((got_k, held_k), (got_v, held_v)):  # every slot of the window got something
        assert (got.cpu().double() - held)[:, :, start:start + tau].abs().amin(dim=-1).min() > 0


def test_one_pass_refuses_a_window_that_wraps(device):
    from projects.feedback.ops.window_attention import implementation

    for impl in ("naive", "triton"):
        dev = device if impl == "triton" else torch.device("cpu")
        buffers = torch.zeros(2, 1, 1, 5, 4, device=dev)
        with pytest.raises(ValueError, match="wraps a buffer of 5 slots"):
            implementation(impl, dev).add_window_gradients(
                torch.zeros(2, 1, 1, 4, device=dev), torch.zeros(2, 1, 1, 3, device=dev),
                torch.zeros(2, 1, 1, 3, device=dev), torch.zeros(2, 1, 1, 4, device=dev), *buffers, 3)
