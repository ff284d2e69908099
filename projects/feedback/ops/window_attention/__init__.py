"""Attention of one query per head over a window of tau key/value slots, score_j = scale * q . (k_j + pos_j): the
Feedback Transformer's attention over its memory (one query per layer and step against the shared keys and values).

Two implementations of one pair of functions, `attend` (forward, writing y and what the backward needs into given
tensors: the attention weights in the reference, their log-sum-exp in the kernel, of shape `saved_shape(B, H, tau)`)
and `attend_backward` (writing dq, adding the window's key and value gradients into fp32 buffers in place, returning
the scores' gradient for pos): naive.py (plain PyTorch, the reference and the CPU path) and triton.py (one program
per batch row and head). `implementation(impl, device)` picks one; `window_attention` wraps either in a
torch.autograd.Function for use (and tests) outside the model's segment, which calls the pair directly.
"""
import torch

from languini.triton_utils import interpreting
from projects.feedback.ops.window_attention import naive

IMPLS = ("auto", "naive", "triton")


def implementation(impl: str, device: torch.device):
    """The module (naive or triton) holding attend and attend_backward; auto: the kernel on CUDA, else the reference."""
    if impl not in IMPLS:
        raise ValueError(f"attention_impl must be one of {', '.join(IMPLS)}, not {impl!r}")
    if impl == "auto":
        impl = "triton" if device.type == "cuda" else "naive"
    if impl == "naive":
        return naive
    if device.type != "cuda" and not interpreting():
        raise ValueError("attention_impl='triton' on CPU needs TRITON_INTERPRET=1 set before triton is imported; "
                         "use 'naive' (or 'auto') on CPU")
    from projects.feedback.ops.window_attention import triton as kernels  # the reference needs no Triton

    return kernels


def attention_flops(batch: int, n_heads: int, d_head: int, tau: int) -> int:
    """Forward FLOPs of one call: the scores (q.k and q.pos) and the weighted values, 2 FLOPs per multiply-add."""
    return 3 * 2 * batch * n_heads * tau * d_head


class WindowAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, ops, q, k_buf, v_buf, pos, start, scale):
        B, H, _, D = k_buf.shape
        y = torch.empty(B, H, D, device=q.device, dtype=q.dtype)
        saved = torch.empty(ops.saved_shape(B, H, pos.shape[0]), device=q.device, dtype=naive.accumulation_dtype(q))
        ops.attend(q, k_buf, v_buf, pos, start, scale, y, saved)
        ctx.save_for_backward(q, k_buf, v_buf, pos, y, saved)
        ctx.ops, ctx.start, ctx.scale = ops, start, scale
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k_buf, v_buf, pos, y, saved = ctx.saved_tensors
        dk = torch.zeros(k_buf.shape, device=k_buf.device, dtype=saved.dtype)
        dv = torch.zeros_like(dk)
        dq = torch.empty_like(q)
        dscore = ctx.ops.attend_backward(q, k_buf, v_buf, pos, ctx.start, ctx.scale, y, saved, dy, dk, dv, dq)
        B, H, D = q.shape
        dpos = torch.mm(dscore.reshape(B * H, -1).t(), q.reshape(B * H, D).to(dscore.dtype))
        return None, dq, dk.to(k_buf.dtype), dv.to(v_buf.dtype), dpos.to(pos.dtype), None, None


@torch.compiler.disable
def window_attention(q, k_buf, v_buf, pos, start: int, scale: float, impl: str = "auto") -> torch.Tensor:
    """softmax_j(scale * q . (k_j + pos_j)) @ v_j over the window slots (start + j) mod S, differentiable in all four.

    Args:
        q: (B, H, D) one query per batch row and head.
        k_buf, v_buf: (B, H, S, D) key and value buffers (unit stride over D); the window is tau of their S slots.
        pos: (tau, D) key position embedding of window place j (j = tau - 1 is the newest slot), shared by heads.
        start: the window's first (oldest) slot; slots wrap modulo S (a ring), so any 0 <= start < S works.
        scale: multiplies the scores (1 / sqrt(D) usually).
        impl: "naive", "triton" or "auto" (the kernel on CUDA, the reference on CPU).
    Returns:
        (B, H, D) in q's dtype; the kernel accumulates in fp32.
    """
    B, H, S, D = k_buf.shape
    if q.shape != (B, H, D) or v_buf.shape != k_buf.shape or pos.ndim != 2 or pos.shape[1] != D:
        raise ValueError(f"need q (B, H, D), k_buf = v_buf (B, H, S, D), pos (tau, D); got {tuple(q.shape)}, "
                         f"{tuple(k_buf.shape)}, {tuple(v_buf.shape)}, {tuple(pos.shape)}")
    if not 1 <= pos.shape[0] <= S or not 0 <= start < S:
        raise ValueError(f"the window of tau = {pos.shape[0]} slots from slot {start} must fit a buffer of {S} slots")
    return WindowAttention.apply(implementation(impl, q.device), q, k_buf, v_buf, pos, start, scale)
