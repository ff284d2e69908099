"""The linear recurrence of the quasi-LSTM, c_t = f_t * c_{t-1} + u_t (eq. 25 of the Languini paper).

Three implementations of one function, selected with ``impl``: ``"loop"`` and ``"block"`` (naive.py, plain
PyTorch: the reference and the block-parallel form of eq. 34) and ``"triton"`` (triton.py, a chunked scan
kernel with fp32 accumulation).

Layout: f and u are [batch, time, heads, head_dim] (the layout a linear layer's output reshapes to without a
copy); the state c is [batch, heads, head_dim]. The recurrence runs in float32 (float64 for float64 inputs)
whatever the input dtype; c_all comes back in u's dtype and c_last in the accumulation dtype, so a bf16 model
carries its state in fp32.
"""

import torch

from languini.triton_utils import interpreting
from projects.qlstm.ops.scan.naive import block_scan, loop_scan

IMPLS = ("loop", "block", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def scan_flops(batch, seq_len, n_heads, d_head):
    """Forward FLOPs of the recurrence itself, which a FLOP profiler cannot see inside a kernel."""
    return 2 * batch * seq_len * n_heads * d_head  # one multiply and one add per element and step


def linear_scan(f, u, c0=None, impl=None, block_len=16):
    """All states of c_t = f_t * c_{t-1} + u_t.

    Args:
        f, u: [B, T, H, D].
        c0: [B, H, D], or None for zeros.
        impl: "loop", "block", "triton", or None for "triton" on CUDA tensors and "block" otherwise.
        block_len: steps per block of "block".
    Returns:
        (c_all [B, T, H, D] in u's dtype, c_last [B, H, D] in the accumulation dtype).
    """
    impl = _checked_impl(f, u, c0, impl, block_len)
    acc_dtype = torch.promote_types(u.dtype, torch.float32)
    if c0 is None:
        c0 = f.new_zeros(f.shape[0], f.shape[2], f.shape[3], dtype=acc_dtype)
    if impl == "loop":
        return loop_scan(f, u, c0, acc_dtype)
    if impl == "block":
        return block_scan(f, u, c0, acc_dtype, block_len)
    from projects.qlstm.ops.scan.triton import scan_triton  # the PyTorch paths need no Triton

    return scan_triton(f, u, c0)


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
        if not f.is_cuda and not interpreting():
            raise ValueError("impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported; "
                             "use impl='block' or 'loop' on CPU")
    return impl
