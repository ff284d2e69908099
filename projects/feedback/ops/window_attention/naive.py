"""Attention of one query per head over a window of tau key/value slots, in plain PyTorch: the reference and the
CPU path of ops/window_attention.

Layouts: q (B, H, D); the key and value buffers (B, H, S, D), of which the window is the tau slots
(start + j) mod S, j = 0 .. tau-1, oldest first; pos (tau, D), the key position embedding of window place j (shared
by heads); score_j = scale * q . (k_j + pos_j). The window wraps only in the ring of token-by-token decoding.
The forward keeps the attention weights p (B, H, tau) for the backward (the kernel keeps only their log-sum-exp and
recomputes them; on a CPU the few extra bytes are cheaper than the recomputation's small products).
"""
import torch
import torch.nn.functional as F

# from this many queries over one window on (the layers of a step) the segment adds their key and value gradients in
# one pass (add_window_gradients, one batched product per buffer) instead of one addcmul_ per query: on the 2-core
# CPU (cpu config, batch 16, 1 thread) the backward took 0.84x the time at 6 layers, 1.04x at 2 (batch 64: 1.07x)
ONE_PASS_MIN_LAYERS = 3
KEEPS_WEIGHTS = True  # attend keeps the weights themselves: add_window_gradients reads them there


def saved_shape(B: int, H: int, tau: int) -> tuple:
    """The shape of what attend keeps for attend_backward: the attention weights."""
    return B, H, tau


def accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision inputs, else theirs (fp64 stays fp64)."""
    return torch.promote_types(t.dtype, torch.float32)


def window_slots(buffer: torch.Tensor, start: int, tau: int) -> torch.Tensor:
    """The window of a (B, H, S, D) buffer as (B * H, tau, D): a view when it does not wrap, else a copy."""
    B, H, S, D = buffer.shape
    if start + tau <= S:
        return buffer[:, :, start:start + tau].reshape(B * H, tau, D)
    return torch.cat([buffer[:, :, start:], buffer[:, :, :start + tau - S]], dim=2).reshape(B * H, tau, D)


def aligned(k_buf, v_buf, pos, start: int):
    """(keys, values, pos, shift): keys and values as (B * H, tau, D) with row i of pos belonging to row i of the
    keys. The window in place order (shift 0), or, for a ring of exactly tau slots (decoding), the whole buffer in
    slot order with pos rotated by shift = start (slot s is window place (s - start) mod tau): a rotation of tau
    rows of pos instead of copies of the wrapped keys and values."""
    B, H, S, D = k_buf.shape
    tau = pos.shape[0]
    if start and S == tau:
        return k_buf.reshape(B * H, S, D), v_buf.reshape(B * H, S, D), torch.roll(pos, start, dims=0), start
    return window_slots(k_buf, start, tau), window_slots(v_buf, start, tau), pos, 0


def attend(q, k_buf, v_buf, pos, start: int, scale: float, y_out: torch.Tensor, p_out: torch.Tensor | None) -> None:
    """y_out (B, H, D) <- softmax(scores) @ values of the window; p_out (B, H, tau) <- the softmax (the attention
    weights in window order, in the accumulation dtype). p_out None (no backward to come: evaluation, decoding):
    PyTorch's fused attention with the position term as an additive bias."""
    B, H, _, D = k_buf.shape
    tau = pos.shape[0]
    acc = accumulation_dtype(q)
    keys, values, pos, shift = aligned(k_buf, v_buf, pos, start)
    qf = q.reshape(B * H, 1, D).to(acc)
    position = torch.mm(qf.view(B * H, D), pos.to(acc).t()).view(B * H, 1, tau)
    if p_out is None:
        y = F.scaled_dot_product_attention(qf.view(B, H, 1, D), keys.to(acc).view(B, H, tau, D),
                                           values.to(acc).view(B, H, tau, D),
                                           attn_mask=position.view(B, H, 1, tau).mul_(scale), scale=scale)
        y_out.copy_(y.view(B, H, D))
        return
    s = torch.baddbmm(position, qf, keys.to(acc).transpose(1, 2), beta=scale, alpha=scale)
    if p_out.dtype == acc and not shift:
        p = torch.softmax(s, dim=-1, out=p_out.view(B * H, 1, tau))
    else:
        p = torch.softmax(s, dim=-1)
        p_out.copy_(torch.roll(p, -shift, dims=-1).view(B, H, tau))
    if y_out.dtype == acc:
        torch.bmm(p, values.to(acc), out=y_out.view(B * H, 1, D))
    else:
        y_out.copy_(torch.bmm(p, values.to(acc)).view(B, H, D))


def attend_backward(q, k_buf, v_buf, pos, start: int, scale: float, y, p, dy, dk_buf, dv_buf,
                    dq_out: torch.Tensor, dscore_out: torch.Tensor | None = None,
                    p_out: torch.Tensor | None = None) -> torch.Tensor:
    """The gradients of attend for the output gradient dy (B, H, D), from its output y and weights p: dq_out
    (B, H, D) <- dL/dq; the window slots of the buffers dk_buf, dv_buf (B, H, S, D; fp32 or fp64) += dL/dk, dL/dv
    (dk_buf and dv_buf None: left to the caller, as add_window_gradients of several queries at once; the weights
    it needs are p itself, KEEPS_WEIGHTS, or a copy in p_out (B, H, tau) if given).
    Returns dscore (B, H, tau) in window order, the gradient of the scores times scale, from which
    dL/dpos = dscore^T q summed over batch and heads; written into dscore_out if given."""
    B, H, S, D = k_buf.shape
    tau = pos.shape[0]
    keys, values, pos, shift = aligned(k_buf, v_buf, pos, start)
    p = torch.roll(p, shift, dims=-1) if shift else p
    p = p.reshape(B * H, 1, tau)
    qf, dyf = q.reshape(B * H, 1, D).to(p.dtype), dy.reshape(B * H, 1, D).to(p.dtype)
    dp = torch.bmm(dyf, values.to(p.dtype).transpose(1, 2))
    delta = torch.bmm(dyf, y.reshape(B * H, D, 1).to(p.dtype))  # sum_j p_j dp_j = dy . y
    dscore = (dp - delta).mul_(p).mul_(scale)
    position = torch.mm(dscore.view(B * H, tau), pos.to(p.dtype)).view(B * H, 1, D)
    if dq_out.dtype == p.dtype:
        torch.baddbmm(position, dscore, keys.to(p.dtype), out=dq_out.view(B * H, 1, D))
    else:
        dq_out.copy_(torch.baddbmm(position, dscore, keys.to(p.dtype)).view(B, H, D))
    # dk_j = dscore_j q and dv_j = p_j dy: outer products, added into the window's slots in place
    if dk_buf is None:
        pass
    elif shift or start + tau <= S:
        first = 0 if shift else start
        dk_buf[:, :, first:first + tau].view(B * H, tau, D).addcmul_(dscore.transpose(1, 2), qf)
        dv_buf[:, :, first:first + tau].view(B * H, tau, D).addcmul_(p.transpose(1, 2), dyf)
    else:
        slots = (start + torch.arange(tau, device=dk_buf.device)) % S
        dk_buf.index_add_(2, slots, (dscore.transpose(1, 2) * qf).view(B, H, tau, D))
        dv_buf.index_add_(2, slots, (p.transpose(1, 2) * dyf).view(B, H, tau, D))
    if dk_buf is None and p_out is not None:
        p_out.copy_(p.view(B, H, tau) if not shift else torch.roll(p, -shift, dims=-1).view(B, H, tau))
    dscore = torch.roll(dscore, -shift, dims=-1) if shift else dscore
    if dscore_out is not None:
        return dscore_out.copy_(dscore.view(B, H, tau))
    return dscore.view(B, H, tau)


def add_window_gradients(q, dscore, p, dy, dk_buf, dv_buf, start: int) -> None:
    """The window slots start .. start + tau - 1 of dk_buf, dv_buf (B, H, S, D; not wrapping) += the key and value
    gradients of N queries over that one window (the layers of a step): sum_n dscore_n^T q_n and p_n^T dy_n, as one
    batched product per buffer (inner size N) instead of N passes over the window. q, dy (N, B, H, D); dscore, p
    (N, B, H, tau)."""
    N, B, H, tau = p.shape
    D = q.shape[-1]
    if start + tau > dk_buf.shape[2]:
        raise ValueError(f"the window of {tau} slots from slot {start} wraps a buffer of {dk_buf.shape[2]} slots")
    acc = dk_buf.dtype
    for grads, weights, vectors in ((dk_buf, dscore, q), (dv_buf, p, dy)):
        per_row = torch.bmm(weights.to(acc).view(N, B * H, tau).permute(1, 2, 0),
                            vectors.to(acc).view(N, B * H, D).transpose(0, 1))  # (B * H, tau, D)
        grads[:, :, start:start + tau].add_(per_row.view(B, H, tau, D))
