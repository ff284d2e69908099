"""Attention of one query per head over a window of tau key/value slots, in plain PyTorch: the reference and the
CPU path of ops/window_attention.

Layouts: q (B, H, D); the key and value buffers (B, H, S, D), of which the window is the tau slots
(start + j) mod S, j = 0 .. tau-1, oldest first; pos (tau, D), the key position embedding of window place j (shared
by heads); score_j = scale * q . (k_j + pos_j). The window wraps only in the ring of token-by-token decoding.
"""
import torch


def window_slots(buffer: torch.Tensor, start: int, tau: int) -> torch.Tensor:
    """The window of a (B, H, S, D) buffer as (B * H, tau, D): a view when it does not wrap, else a copy."""
    B, H, S, D = buffer.shape
    if start + tau <= S:
        return buffer[:, :, start:start + tau].reshape(B * H, tau, D)
    return torch.cat([buffer[:, :, start:], buffer[:, :, :start + tau - S]], dim=2).reshape(B * H, tau, D)


def accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision inputs, else theirs (fp64 stays fp64)."""
    return torch.promote_types(t.dtype, torch.float32)


def scores(q, k_buf, pos, start, scale):
    """(B * H, 1, tau) scores and the query as (B * H, 1, D), in the accumulation dtype."""
    B, H, _, D = k_buf.shape
    acc = accumulation_dtype(q)
    qf = q.reshape(B * H, 1, D).to(acc)
    position = torch.mm(qf.view(B * H, D), pos.to(acc).t()).view(B * H, 1, -1)
    return torch.baddbmm(position, qf, window_slots(k_buf, start, pos.shape[0]).to(acc).transpose(1, 2),
                         beta=scale, alpha=scale), qf


def attend(q, k_buf, v_buf, pos, start: int, scale: float, y_out: torch.Tensor, lse_out: torch.Tensor) -> None:
    """y_out (B, H, D) <- softmax(scores) @ values of the window; lse_out (B, H) <- log-sum-exp of the scores."""
    B, H, _, D = k_buf.shape
    s, _ = scores(q, k_buf, pos, start, scale)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    y = torch.bmm(torch.exp(s - lse), window_slots(v_buf, start, pos.shape[0]).to(s.dtype))
    y_out.copy_(y.view(B, H, D))
    lse_out.copy_(lse.view(B, H))


def attend_backward(q, k_buf, v_buf, pos, start: int, scale: float, y, lse, dy, dk_buf, dv_buf,
                    dq_out: torch.Tensor) -> torch.Tensor:
    """The gradients of attend for the output gradient dy (B, H, D): dq_out (B, H, D) <- dL/dq; the window slots of
    the buffers dk_buf, dv_buf (B, H, S, D; fp32 or fp64) += dL/dk, dL/dv. Returns dscore (B, H, tau), the gradient of
    the scores times scale, from which dL/dpos = dscore^T q summed over batch and heads."""
    B, H, S, D = k_buf.shape
    tau = pos.shape[0]
    s, qf = scores(q, k_buf, pos, start, scale)
    p = torch.exp(s - lse.reshape(B * H, 1, 1))
    dyf = dy.reshape(B * H, 1, D).to(s.dtype)
    values = window_slots(v_buf, start, tau).to(s.dtype)
    dp = torch.bmm(dyf, values.transpose(1, 2))
    delta = (dyf * y.reshape(B * H, 1, D).to(s.dtype)).sum(-1, keepdim=True)  # sum_j p_j dp_j = dy . y
    dscore = p * (dp - delta) * scale
    position = torch.mm(dscore.view(B * H, tau), pos.to(s.dtype)).view(B * H, 1, D)
    dq = torch.baddbmm(position, dscore, window_slots(k_buf, start, tau).to(s.dtype))
    dq_out.copy_(dq.view(B, H, D))
    # dk_j = dscore_j q and dv_j = p_j dy: outer products, added into the window's slots in place
    if start + tau <= S:
        dk_buf[:, :, start:start + tau].view(B * H, tau, D).addcmul_(dscore.transpose(1, 2), qf)
        dv_buf[:, :, start:start + tau].view(B * H, tau, D).addcmul_(p.transpose(1, 2), dyf)
    else:
        slots = (start + torch.arange(tau, device=dk_buf.device)) % S
        dk_buf.index_add_(2, slots, (dscore.transpose(1, 2) * qf).view(B, H, tau, D))
        dv_buf.index_add_(2, slots, (p.transpose(1, 2) * dyf).view(B, H, tau, D))
    return dscore.view(B, H, tau)
