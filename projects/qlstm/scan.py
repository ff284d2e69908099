"""The linear recurrence of the quasi-LSTM, c_t = f_t * c_{t-1} + u_t (eq. 25 of the Languini paper).

Three implementations of one function, selected with ``impl``:

- ``"loop"``: the minimal for-loop over time, the obviously-right reference.
- ``"block"``: the block-parallel form of eq. 34; all cell states of a block of ``block_len``
  steps come from the products of forget gates (the tensor F of eq. 33) in parallel, and only
  the carry from block to block is sequential.
- ``"triton"``: a chunked scan kernel with fp32 accumulation inside a ``torch.autograd.Function``;
  the backward pass is the reverse scan dc_t = g_t + f_{t+1} * dc_{t+1}.

Layout: f and u are [batch, time, heads, head_dim] (the layout a linear layer's output reshapes to
without a copy); the state c is [batch, heads, head_dim]. The recurrence runs in float32 (float64
for float64 inputs) whatever the input dtype; c_all comes back in u's dtype and c_last in the
accumulation dtype, so a bf16 model carries its state in fp32.
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

IMPLS = ("loop", "block", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def scan_flops(batch, seq_len, n_heads, d_head):
    """Forward FLOPs of the recurrence itself, which a FLOP profiler cannot see inside a kernel."""
    return 2 * batch * seq_len * n_heads * d_head  # one multiply and one add per element and step


def linear_scan(f, u, c0=None, impl=None, block_len=16):
    """All states of c_t = f_t * c_{t-1} + u_t.

    f, u: [B, T, H, D]; c0: [B, H, D] or None for zeros; impl: "loop", "block", "triton", or None
    for "triton" on CUDA tensors and "block" otherwise; block_len: steps per block of "block".
    Returns (c_all [B, T, H, D] in u's dtype, c_last [B, H, D] in the accumulation dtype).
    """
    impl = _checked_impl(f, u, c0, impl, block_len)
    acc_dtype = torch.promote_types(u.dtype, torch.float32)
    if c0 is None:
        c0 = f.new_zeros(f.shape[0], f.shape[2], f.shape[3], dtype=acc_dtype)
    if impl == "loop":
        return _loop_scan(f, u, c0, acc_dtype)
    if impl == "block":
        return _block_scan(f, u, c0, acc_dtype, block_len)
    return _triton_scan(f, u, c0)


def _checked_impl(f, u, c0, impl, block_len):
    """The implementation to run, after checking that the inputs suit it."""
    if impl is None:
        impl = "triton" if f.is_cuda else "block"
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, got {impl!r}")
    if f.ndim != 4 or f.shape != u.shape:
        raise ValueError(f"f and u must both be [batch, time, heads, head_dim], "
                         f"got {tuple(f.shape)} and {tuple(u.shape)}")
    if f.dtype != u.dtype or f.device != u.device:
        raise ValueError(f"f and u must share dtype and device, got {f.dtype}/{f.device} and {u.dtype}/{u.device}")
    if f.shape[1] == 0:
        raise ValueError("the sequence must have at least one step")
    state_shape = (f.shape[0], f.shape[2], f.shape[3])
    if c0 is not None and (tuple(c0.shape) != state_shape or c0.device != f.device):
        raise ValueError(f"c0 must be [batch, heads, head_dim] = {state_shape} on {f.device}, "
                         f"got {tuple(c0.shape)} on {c0.device}")
    if impl == "block" and (not isinstance(block_len, int) or block_len < 1):
        raise ValueError(f"block_len must be a positive int, got {block_len!r}")
    if impl == "triton":
        if f.dtype not in TRITON_DTYPES:
            raise ValueError(f"impl='triton' takes {TRITON_DTYPES}, got {f.dtype}; use impl='loop' or 'block'")
        if not f.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported; "
                             "use impl='block' or 'loop' on CPU")
    return impl


def _loop_scan(f, u, c0, acc_dtype):
    c = c0.to(acc_dtype)
    states = []
    for t in range(f.shape[1]):
        c = f[:, t].to(acc_dtype) * c + u[:, t].to(acc_dtype)
        states.append(c)
    return torch.stack(states, dim=1).to(u.dtype), c


def _block_scan(f, u, c0, acc_dtype, block_len):
    batch, seq_len, n_heads, d_head = f.shape
    n_blocks = -(-seq_len // block_len)
    pad = n_blocks * block_len - seq_len
    # padded steps with f = 1 and u = 0 leave the state unchanged, so c_last stays right
    f_blocks = F.pad(f.to(acc_dtype), (0, 0, 0, 0, 0, pad), value=1.0).view(batch, n_blocks, block_len, n_heads, d_head)
    u_blocks = F.pad(u.to(acc_dtype), (0, 0, 0, 0, 0, pad)).view(batch, n_blocks, block_len, n_heads, d_head)

    # gates[.., k, j, ..] = f_j for j <= k else 1; reverse cumprod over j gives prod_{j=i}^{k} f_j at [k, i]
    steps = torch.arange(block_len, device=f.device)
    j_le_k = (steps[None, :] <= steps[:, None])[:, :, None, None]
    gates = torch.where(j_le_k, f_blocks.unsqueeze(2), torch.ones((), dtype=acc_dtype, device=f.device))
    suffix_prod = gates.flip(3).cumprod(3).flip(3)
    # eq. 33: F[k, 0] multiplies c_{start-1}; F[k, 1 + i] = prod_{j=i+1}^{k} f_j multiplies u_i for i <= k, else 0
    decay = suffix_prod[:, :, :, 0]
    ones = torch.ones_like(suffix_prod[:, :, :, :1])
    u_weight = torch.cat([suffix_prod[:, :, :, 1:], ones], dim=3).masked_fill(~j_le_k, 0.0)
    # eq. 34 without the carry: the state each block reaches from c_{start-1} = 0
    local = (u_weight * u_blocks.unsqueeze(2)).sum(dim=3)

    c = c0.to(acc_dtype)
    blocks = []
    for n in range(n_blocks):
        block = decay[:, n] * c.unsqueeze(1) + local[:, n]
        blocks.append(block)
        c = block[:, -1]
    c_all = torch.cat(blocks, dim=1)[:, :seq_len]
    return c_all.to(u.dtype), c


# ----------------------------------------------------------------------------------------------
# Triton chunked scan
# ----------------------------------------------------------------------------------------------

CHUNK = 32  # steps loaded and scanned at once; one memory round trip per chunk instead of per step


@triton.jit
def _compose(decay_a, add_a, decay_b, add_b):
    # first x -> decay_a * x + add_a, then x -> decay_b * x + add_b
    return decay_b * decay_a, decay_b * add_a + add_b


@triton.jit
def _last_row(tile, steps, CHUNK: tl.constexpr):
    return tl.sum(tl.where(steps[:, None] == CHUNK - 1, tile, 0.0), axis=0)


@triton.jit
def _scan_fwd_kernel(f_ptr, u_ptr, c0_ptr, c_all_ptr, c_last_ptr, T, C,
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
def _scan_bwd_kernel(f_ptr, c0_ptr, c_all_ptr, grad_all_ptr, grad_last_ptr, df_ptr, du_ptr, dc0_ptr, T, C,
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


class _TritonLinearScan(torch.autograd.Function):

    @staticmethod
    def forward(ctx, f, u, c0):
        batch, seq_len, n_heads, d_head = f.shape
        channels = n_heads * d_head
        f, u = f.contiguous(), u.contiguous()
        c0_acc = c0.to(torch.float32).contiguous()
        c_all = torch.empty_like(u)
        c_last = torch.empty_like(c0_acc)
        block_c, grid = _launch_grid(batch, channels)
        _scan_fwd_kernel[grid](f, u, c0_acc, c_all, c_last, seq_len, channels, CHUNK=CHUNK, BLOCK_C=block_c)
        ctx.save_for_backward(f, c0_acc, c_all)
        ctx.c0_dtype = c0.dtype
        return c_all, c_last

    @staticmethod
    def backward(ctx, grad_all, grad_last):
        f, c0_acc, c_all = ctx.saved_tensors
        batch, seq_len, n_heads, d_head = f.shape
        channels = n_heads * d_head
        # autograd passes zeros, not None, for an output that received no gradient
        grad_all, grad_last = grad_all.contiguous(), grad_last.contiguous()
        df = torch.empty_like(f)
        du = torch.empty_like(c_all)
        dc0 = torch.empty_like(c0_acc)
        block_c, grid = _launch_grid(batch, channels)
        _scan_bwd_kernel[grid](f, c0_acc, c_all, grad_all, grad_last, df, du, dc0, seq_len, channels,
                               CHUNK=CHUNK, BLOCK_C=block_c)
        return df, du, dc0.to(ctx.c0_dtype)


@torch.compiler.disable
def _triton_scan(f, u, c0):
    # torch.compile runs this eagerly (a graph break) instead of tracing a Triton launch it cannot see into
    return _TritonLinearScan.apply(f, u, c0)
