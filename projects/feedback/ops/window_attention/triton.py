"""Attention of one query per head over a window of tau key/value slots as Triton kernels (decode-style: one
program per batch row and head streams the window's keys and values once, with an online softmax in fp32).

naive.py holds the reference and the layouts: q (B, H, D), key/value buffers (B, H, S, D) whose window is the slots
(start + j) mod S, pos (tau, D), score_j = scale * q . (k_j + pos_j). The backward recomputes the scores from the
forward's log-sum-exp and adds the window's key and value gradients into fp32 buffers in place: each program owns
its (batch row, head) rows, so no atomics, and a caller that runs many steps over one buffer (the Feedback
Transformer's segment) keeps one gradient buffer instead of a copy of the window per step.

With several queries over one window (the L layers of a step), the backward can instead write each query's
attention weights beside its score gradients and leave the window to one launch of add_window_gradients, which reads
the fp32 gradient buffers once for all of them: at `small`, batch 64 the per-layer additions read and write the
window's fp32 gradients (403 MB) L = 12 times a step, the one pass once (README, "The kernel").
"""
import torch
import triton
import triton.language as tl

BLOCK_N = 32  # window slots per iteration
# from this many queries over one window on (the layers of a step) the segment adds their key and value gradients
# in one pass (add_window_gradients): per layer it writes and reads the weights and score gradients, B x H x tau
# fp32 each, and saves a read and write of the window's fp32 key and value gradients, 2 x B x H x tau x D each
ONE_PASS_MIN_LAYERS = 2
KEEPS_WEIGHTS = False  # attend keeps the log-sum-exp; a one-pass backward writes the weights itself (p_out)


@triton.jit
def feedback_window_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, y_ptr, lse_ptr, start, S, TAU, H, scale,
                                         sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                                         D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    b = (row // H).to(tl.int64)
    h = (row % H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + b * sq_b + h * sq_h + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for j0 in range(0, TAU, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        j_ok = j < TAU
        slot = ((start + j) % S).to(tl.int64)
        ok = j_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + b * sk_b + h * sk_h + slot[:, None] * sk_s + d[None, :], mask=ok, other=0.0)
        p_emb = tl.load(pos_ptr + j[:, None] * D + d[None, :], mask=ok, other=0.0)
        s = tl.sum((k.to(tl.float32) + p_emb.to(tl.float32)) * q[None, :], axis=1) * scale
        s = tl.where(j_ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + slot[:, None] * sv_s + d[None, :], mask=ok, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    tl.store(y_ptr + row.to(tl.int64) * D + d, (acc / l_i).to(y_ptr.dtype.element_ty), mask=d_ok)
    tl.store(lse_ptr + row, m_i + tl.log(l_i))


@triton.jit
def feedback_window_attention_bwd_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, y_ptr, lse_ptr, dy_ptr, dk_ptr, dv_ptr,
                                         dq_ptr, dscore_ptr, p_ptr, start, S, TAU, H, scale,
                                         sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sdk_b, sdk_h, sdk_s,
                                         D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                                         ADD_WINDOW_GRADIENTS: tl.constexpr):
    row = tl.program_id(0)
    b = (row // H).to(tl.int64)
    h = (row % H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + b * sq_b + h * sq_h + d, mask=d_ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row.to(tl.int64) * D + d, mask=d_ok, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row.to(tl.int64) * D + d, mask=d_ok, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    delta = tl.sum(dy * y, axis=0)  # sum_j p_j (dy . v_j)
    dq = tl.zeros([BLOCK_D], tl.float32)
    for j0 in range(0, TAU, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        j_ok = j < TAU
        slot = ((start + j) % S).to(tl.int64)
        ok = j_ok[:, None] & d_ok[None, :]
        key = (tl.load(k_ptr + b * sk_b + h * sk_h + slot[:, None] * sk_s + d[None, :], mask=ok, other=0.0)
               .to(tl.float32)
               + tl.load(pos_ptr + j[:, None] * D + d[None, :], mask=ok, other=0.0).to(tl.float32))
        v = tl.load(v_ptr + b * sv_b + h * sv_h + slot[:, None] * sv_s + d[None, :], mask=ok, other=0.0)
        p = tl.exp(tl.sum(key * q[None, :], axis=1) * scale - lse)
        p = tl.where(j_ok, p, 0.0)
        dscore = p * (tl.sum(v.to(tl.float32) * dy[None, :], axis=1) - delta) * scale
        dq += tl.sum(dscore[:, None] * key, axis=0)
        if ADD_WINDOW_GRADIENTS:
            grad_offsets = b * sdk_b + h * sdk_h + slot[:, None] * sdk_s + d[None, :]
            dk = tl.load(dk_ptr + grad_offsets, mask=ok, other=0.0)
            tl.store(dk_ptr + grad_offsets, dk + dscore[:, None] * q[None, :], mask=ok)
            dv = tl.load(dv_ptr + grad_offsets, mask=ok, other=0.0)
            tl.store(dv_ptr + grad_offsets, dv + p[:, None] * dy[None, :], mask=ok)
        else:  # the weights, for one pass of add_window_gradients over all queries of the window
            tl.store(p_ptr + row.to(tl.int64) * TAU + j, p, mask=j_ok)
        tl.store(dscore_ptr + row.to(tl.int64) * TAU + j, dscore, mask=j_ok)
    tl.store(dq_ptr + row.to(tl.int64) * D + d, dq.to(dq_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def feedback_window_gradients_kernel(q_ptr, dy_ptr, dscore_ptr, p_ptr, dk_ptr, dv_ptr, start, TAU, N, rows, H,
                                     sdk_b, sdk_h, sdk_s,
                                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """dk[window] += sum_n dscore_n^T q_n and dv[window] += sum_n p_n^T dy_n for one (batch row, head) and a block
    of BLOCK_N window slots: the N queries' outer products summed in registers, the fp32 buffers read and written
    once."""
    row = tl.program_id(0)
    b = (row // H).to(tl.int64)
    h = (row % H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    j = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j_ok = j < TAU
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for n in range(N):
        query = n * rows + row.to(tl.int64)  # row of (N, B, H, ...)
        q = tl.load(q_ptr + query * D + d, mask=d_ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + query * D + d, mask=d_ok, other=0.0).to(tl.float32)
        dscore = tl.load(dscore_ptr + query * TAU + j, mask=j_ok, other=0.0)
        p = tl.load(p_ptr + query * TAU + j, mask=j_ok, other=0.0)
        dk += dscore[:, None] * q[None, :]
        dv += p[:, None] * dy[None, :]
    ok = j_ok[:, None] & d_ok[None, :]
    offsets = b * sdk_b + h * sdk_h + (start + j).to(tl.int64)[:, None] * sdk_s + d[None, :]
    tl.store(dk_ptr + offsets, tl.load(dk_ptr + offsets, mask=ok, other=0.0) + dk, mask=ok)
    tl.store(dv_ptr + offsets, tl.load(dv_ptr + offsets, mask=ok, other=0.0) + dv, mask=ok)


def saved_shape(B: int, H: int, tau: int) -> tuple:
    """The shape of what attend keeps for attend_backward: the log-sum-exp of each row's scores."""
    return B, H


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def attend(q, k_buf, v_buf, pos, start: int, scale: float, y_out: torch.Tensor, lse_out: torch.Tensor) -> None:
    """As naive.attend, by one launch, keeping the log-sum-exp of the scores instead of the weights: y_out (B, H, D)
    and lse_out (B, H) fp32, both contiguous (lse_out None: not kept)."""
    B, H, S, D = k_buf.shape
    if lse_out is None:
        lse_out = torch.empty(B, H, device=q.device, dtype=torch.float32)
    q, pos = _unit_stride(q), pos.contiguous()
    feedback_window_attention_fwd_kernel[(B * H,)](
        q, k_buf, v_buf, pos, y_out, lse_out, start, S, pos.shape[0], H, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2),
        v_buf.stride(0), v_buf.stride(1), v_buf.stride(2),
        D=D, BLOCK_D=triton.next_power_of_2(D), BLOCK_N=BLOCK_N)


def attend_backward(q, k_buf, v_buf, pos, start: int, scale: float, y, lse, dy, dk_buf, dv_buf,
                    dq_out: torch.Tensor, dscore_out: torch.Tensor | None = None,
                    p_out: torch.Tensor | None = None) -> torch.Tensor:
    """As naive.attend_backward, by one launch that recomputes the weights from the forward's log-sum-exp `lse`:
    dk_buf and dv_buf (fp32, one layout for both) are updated in place; or, both None, the weights are written into
    p_out (B, H, tau) fp32 instead, for add_window_gradients. dscore_out (B, H, tau) fp32, contiguous: where the
    score gradients go (else a new tensor)."""
    B, H, S, D = k_buf.shape
    tau = pos.shape[0]
    add = dk_buf is not None
    if add and (dk_buf.stride() != dv_buf.stride() or dk_buf.dtype != torch.float32 or dv_buf.dtype != torch.float32):
        raise ValueError("the key and value gradient buffers must be fp32 with one layout")
    if not add and p_out is None:
        raise ValueError("without gradient buffers the weights must be written: pass p_out")
    for name, t in (("dscore_out", dscore_out), ("p_out", None if add else p_out)):
        if t is not None and (t.shape != (B, H, tau) or t.dtype != torch.float32 or not t.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous fp32 tensor of {(B, H, tau)}, got {t.dtype} "
                             f"{tuple(t.shape)}")
    dscore = torch.empty(B, H, tau, device=q.device, dtype=torch.float32) if dscore_out is None else dscore_out
    q, pos = _unit_stride(q), pos.contiguous()
    dy, y, lse = dy.contiguous(), y.contiguous(), lse.contiguous()
    grads = (dk_buf, dv_buf) if add else (dscore, dscore)  # unused pointers when the weights are written instead
    feedback_window_attention_bwd_kernel[(B * H,)](
        q, k_buf, v_buf, pos, y, lse, dy, *grads, dq_out, dscore, dscore if add else p_out, start, S, tau, H, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2),
        v_buf.stride(0), v_buf.stride(1), v_buf.stride(2), *(grads[0].stride()[:3] if add else (0, 0, 0)),
        D=D, BLOCK_D=triton.next_power_of_2(D), BLOCK_N=BLOCK_N, ADD_WINDOW_GRADIENTS=add)
    return dscore


def add_window_gradients(q, dscore, p, dy, dk_buf, dv_buf, start: int) -> None:
    """As naive.add_window_gradients, by one launch: the window slots start .. start + tau - 1 of dk_buf, dv_buf
    (B, H, S, D; fp32, one layout; not wrapping) += sum_n dscore_n^T q_n and p_n^T dy_n over the N queries, each
    slot's buffers read and written once. q, dy (N, B, H, D); dscore, p (N, B, H, tau) fp32."""
    N, B, H, tau = p.shape
    D = q.shape[-1]
    if start + tau > dk_buf.shape[2]:
        raise ValueError(f"the window of {tau} slots from slot {start} wraps a buffer of {dk_buf.shape[2]} slots")
    if dk_buf.stride() != dv_buf.stride() or dk_buf.dtype != torch.float32 or dv_buf.dtype != torch.float32:
        raise ValueError("the key and value gradient buffers must be fp32 with one layout")
    if dscore.shape != p.shape or dscore.dtype != torch.float32 or p.dtype != torch.float32 or q.shape != dy.shape:
        raise ValueError("need dscore and p fp32 (N, B, H, tau), q and dy (N, B, H, D)")
    q, dy, dscore, p = (t.contiguous() for t in (q, dy, dscore, p))
    feedback_window_gradients_kernel[(B * H, triton.cdiv(tau, BLOCK_N))](
        q, dy, dscore, p, dk_buf, dv_buf, start, tau, N, B * H, H, dk_buf.stride(0), dk_buf.stride(1),
        dk_buf.stride(2), D=D, BLOCK_D=triton.next_power_of_2(D), BLOCK_N=BLOCK_N)
