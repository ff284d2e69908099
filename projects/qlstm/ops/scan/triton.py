"""The linear recurrence c_t = f_t * c_{t-1} + u_t as a chunked Triton scan (naive.py holds the references).

The forward loads CHUNK steps of f and u at once and scans them with tl.associative_scan, carrying the state
from chunk to chunk in fp32; the backward is the reverse scan dc_t = g_t + f_{t+1} * dc_{t+1}, with
df_t = dc_t * c_{t-1} and du_t = dc_t. The launches are torch.library custom ops, opaque to torch.compile.
"""

import torch
import triton
import triton.language as tl

CHUNK = 32  # steps loaded and scanned at once; one memory round trip per chunk instead of per step


@triton.jit
def _compose(decay_a, add_a, decay_b, add_b):
    # first x -> decay_a * x + add_a, then x -> decay_b * x + add_b
    return decay_b * decay_a, decay_b * add_a + add_b


@triton.jit
def _last_row(tile, steps, CHUNK: tl.constexpr):
    return tl.sum(tl.where(steps[:, None] == CHUNK - 1, tile, 0.0), axis=0)


@triton.jit
def qlstm_scan_fwd_kernel(f_ptr, u_ptr, c0_ptr, c_all_ptr, c_last_ptr, T, C,
                          CHUNK: tl.constexpr, BLOCK_C: tl.constexpr):
    batch = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    steps = tl.arange(0, CHUNK)
    seq_base = batch * T * C
    carry = tl.load(c0_ptr + batch * C + cols, mask=col_ok, other=0.0).to(tl.float32)
    for t0 in range(0, T, CHUNK):
        rows = t0 + steps
        offs = seq_base + rows[:, None].to(tl.int64) * C + cols[None, :]
        ok = (rows[:, None] < T) & col_ok[None, :]
        # steps past the end get f = 1, u = 0, so the carry passes through them unchanged
        f = tl.load(f_ptr + offs, mask=ok, other=1.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        decay, add = tl.associative_scan((f, u), axis=0, combine_fn=_compose)
        c = decay * carry[None, :] + add
        tl.store(c_all_ptr + offs, c.to(c_all_ptr.dtype.element_ty), mask=ok)
        carry = _last_row(c, steps, CHUNK)
    tl.store(c_last_ptr + batch * C + cols, carry, mask=col_ok)


@triton.jit
def qlstm_scan_bwd_kernel(f_ptr, c0_ptr, c_all_ptr, grad_all_ptr, grad_last_ptr, df_ptr, du_ptr, dc0_ptr, T, C,
                          CHUNK: tl.constexpr, BLOCK_C: tl.constexpr):
    batch = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    steps = tl.arange(0, CHUNK)
    seq_base = batch * T * C
    c0 = tl.load(c0_ptr + batch * C + cols, mask=col_ok, other=0.0).to(tl.float32)
    # the gradient reaching c_last enters as dc_T with f_T = 1
    carry = tl.load(grad_last_ptr + batch * C + cols, mask=col_ok, other=0.0).to(tl.float32)
    n_chunks = tl.cdiv(T, CHUNK)
    for k in range(0, n_chunks):
        # tile row j holds step t0 + CHUNK - 1 - j, so a forward scan over rows runs backwards in time
        rows = (n_chunks - 1 - k) * CHUNK + CHUNK - 1 - steps
        offs = seq_base + rows[:, None].to(tl.int64) * C + cols[None, :]
        ok = (rows[:, None] < T) & col_ok[None, :]
        grad = tl.load(grad_all_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        f_next = tl.load(f_ptr + offs + C, mask=(rows[:, None] + 1 < T) & col_ok[None, :], other=1.0).to(tl.float32)
        decay, add = tl.associative_scan((f_next, grad), axis=0, combine_fn=_compose)
        dc = decay * carry[None, :] + add
        c_prev = tl.load(c_all_ptr + offs - C, mask=ok & (rows[:, None] >= 1), other=0.0).to(tl.float32)
        c_prev = tl.where(rows[:, None] == 0, c0[None, :], c_prev)
        tl.store(du_ptr + offs, dc.to(du_ptr.dtype.element_ty), mask=ok)
        tl.store(df_ptr + offs, (dc * c_prev).to(df_ptr.dtype.element_ty), mask=ok)
        carry = _last_row(dc, steps, CHUNK)
    f_first = tl.load(f_ptr + seq_base + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(dc0_ptr + batch * C + cols, f_first * carry, mask=col_ok)


def _launch_grid(batch, channels):
    block_c = min(64, triton.next_power_of_2(channels))
    return block_c, (batch, triton.cdiv(channels, block_c))


@torch.library.custom_op("qlstm::scan_fwd", mutates_args=())
def scan_fwd(f: torch.Tensor, u: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """c_all [B, T, H, D] in u's dtype and c_last [B, H, D] fp32, from contiguous f, u and fp32 c0."""
    batch, seq_len, n_heads, d_head = f.shape
    channels = n_heads * d_head
    c_all = torch.empty_like(u)
    c_last = torch.empty_like(c0)
    block_c, grid = _launch_grid(batch, channels)
    qlstm_scan_fwd_kernel[grid](f, u, c0, c_all, c_last, seq_len, channels, CHUNK=CHUNK, BLOCK_C=block_c)
    return c_all, c_last


@scan_fwd.register_fake
def _(f, u, c0):
    return torch.empty_like(u), torch.empty_like(c0)


@torch.library.custom_op("qlstm::scan_bwd", mutates_args=())
def scan_bwd(f: torch.Tensor, c0: torch.Tensor, c_all: torch.Tensor, grad_all: torch.Tensor,
             grad_last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(df, du, dc0 fp32) from the forward's inputs and outputs and the contiguous output gradients."""
    batch, seq_len, n_heads, d_head = f.shape
    channels = n_heads * d_head
    df = torch.empty_like(f)
    du = torch.empty_like(c_all)
    dc0 = torch.empty_like(c0)
    block_c, grid = _launch_grid(batch, channels)
    qlstm_scan_bwd_kernel[grid](f, c0, c_all, grad_all, grad_last, df, du, dc0, seq_len, channels,
                                CHUNK=CHUNK, BLOCK_C=block_c)
    return df, du, dc0


@scan_bwd.register_fake
def _(f, c0, c_all, grad_all, grad_last):
    return torch.empty_like(f), torch.empty_like(c_all), torch.empty_like(c0)


class ScanFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, f, u, c0):
        f, u = f.contiguous(), u.contiguous()
        c0_acc = c0.to(torch.float32).contiguous()
        c_all, c_last = torch.ops.qlstm.scan_fwd(f, u, c0_acc)
        ctx.save_for_backward(f, c0_acc, c_all)
        ctx.c0_dtype = c0.dtype
        return c_all, c_last

    @staticmethod
    def backward(ctx, grad_all, grad_last):
        f, c0_acc, c_all = ctx.saved_tensors
        # autograd passes zeros, not None, for an output that received no gradient
        df, du, dc0 = torch.ops.qlstm.scan_bwd(f, c0_acc, c_all, grad_all.contiguous(), grad_last.contiguous())
        return df, du, dc0.to(ctx.c0_dtype)


def scan_triton(f: torch.Tensor, u: torch.Tensor, c0: torch.Tensor):
    """All states of c_t = f_t * c_{t-1} + u_t by the Triton kernels, differentiable in f, u and c0.

    Args:
        f, u: [B, T, H, D], fp32, bf16 or fp16, on CUDA (or on CPU under TRITON_INTERPRET=1).
        c0: [B, H, D], the state before step 1.
    Returns:
        (c_all [B, T, H, D] in u's dtype, c_last [B, H, D] in fp32); the scan accumulates in fp32.
    """
    return ScanFunction.apply(f, u, c0)
