"""PEER's expert computation by Triton kernels (naive.peer_experts_reference is the reference):
out[r] = sum_j w[r, j] * gelu(down[i_rj] . x[r]) * up[i_rj], with i_rj = indices[r, j].

Forward, two kernels:
1. peer_experts_scores_kernel, one program per (row, block of BLOCK_M slots): each chosen expert's input
   pre[r, j] = down[i_rj] . x[r] (a loop over d in blocks of BLOCK_D), and coef[r, j] = w[r, j] * gelu(pre[r, j]);
2. peer_experts_bag_kernel, one program per (row, block of BLOCK_D columns): out[r] = sum_j coef[r, j] up[i_rj].
Only pre (fp32 [R, M]) is kept for the backward.

Backward, with g = dL/dout:
1. peer_experts_bwd_kernel, one program per (row, block of slots): dcoef[r, j] = g[r] . up[i_rj], hence
   dL/dw = dcoef * gelu(pre) and dL/dpre = dcoef * w * gelu'(pre); then a second loop over d adds coef * g[r] into
   the up table's gradient row i_rj and dL/dpre * x[r] into the down table's (relaxed atomic adds into fp32 tables,
   cast to the tables' dtype after);
2. dL/dx[r] = sum_j dL/dpre[r, j] down[i_rj]: peer_experts_bag_kernel again, over the down table.

Inputs of any floating dtype are loaded and converted to fp32; the output is accumulated in fp32 and returned in
the promoted dtype of x, down, up and weights, each gradient in its input's dtype. Row-sparse gradients are made
around these kernels (ops/peer_experts/__init__.py: the rows read gathered into small tables first).
"""

import torch
import triton
import triton.language as tl

from languini.triton_utils import interpreting
from languini.ops.peer_experts.naive import check_inputs

# Untuned block sizes (triton.autotune does not run in the interpreter); tune on a GPU.
_MAX_BLOCK_M = 32
_MAX_BLOCK_D = 128
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_CUBIC = tl.constexpr(0.044715)


# ---------------------------------------------------------------- Triton kernels


@triton.jit
def _gelu_and_slope(z):
    """GPT-2's GELU (tanh approximation) of z and its derivative; tanh(u) as 2 sigmoid(2u) - 1."""
    u = SQRT_2_OVER_PI * (z + GELU_CUBIC * z * z * z)
    t = 2.0 * tl.sigmoid(2.0 * u) - 1.0
    value = 0.5 * z * (1.0 + t)
    slope = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * z * z)
    return value, slope


@triton.jit
def _gathered_dots(vec_ptr, table_ptr, idx, slot_ok, d, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """(BLOCK_M,) fp32: table[idx[j]] . vec for each slot j, vec the d numbers at vec_ptr."""
    # A 2-D accumulator: multiply-adds in the loop, one reduction over d after it.
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, d, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        col_ok = cols < d
        vec = tl.load(vec_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        rows = tl.load(table_ptr + idx[:, None] * d + cols[None, :], mask=slot_ok[:, None] & col_ok[None, :],
                       other=0.0).to(tl.float32)
        acc += rows * vec[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def peer_experts_scores_kernel(pre_ptr, coef_ptr, x_ptr, down_ptr, indices_ptr, weights_ptr, d, m,
                               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    slots = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    slot_ok = slots < m
    idx = tl.load(indices_ptr + row * m + slots, mask=slot_ok, other=0)
    pre = _gathered_dots(x_ptr + row * d, down_ptr, idx, slot_ok, d, BLOCK_M, BLOCK_D)
    w = tl.load(weights_ptr + row * m + slots, mask=slot_ok, other=0.0).to(tl.float32)
    activation, _ = _gelu_and_slope(pre)
    tl.store(pre_ptr + row * m + slots, pre, mask=slot_ok)
    tl.store(coef_ptr + row * m + slots, w * activation, mask=slot_ok)


@triton.jit
def peer_experts_bag_kernel(out_ptr, table_ptr, indices_ptr, coef_ptr, d, m,
                            BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    # out[r, cols] = sum_j coef[r, j] * table[indices[r, j], cols]
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < d
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, m, BLOCK_M):
        slots = start + tl.arange(0, BLOCK_M)
        slot_ok = slots < m
        idx = tl.load(indices_ptr + row * m + slots, mask=slot_ok, other=0)
        c = tl.load(coef_ptr + row * m + slots, mask=slot_ok, other=0.0)
        rows = tl.load(table_ptr + idx[:, None] * d + cols[None, :], mask=slot_ok[:, None] & col_ok[None, :],
                       other=0.0).to(tl.float32)
        acc += c[:, None] * rows
    tl.store(out_ptr + row * d + cols, tl.sum(acc, axis=0), mask=col_ok)


@triton.jit
def peer_experts_bwd_kernel(grad_pre_ptr, grad_weights_ptr, grad_down_ptr, grad_up_ptr, grad_out_ptr, x_ptr, up_ptr,
                            indices_ptr, weights_ptr, pre_ptr, d, m, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    slots = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    slot_ok = slots < m
    idx = tl.load(indices_ptr + row * m + slots, mask=slot_ok, other=0)
    grad_coef = _gathered_dots(grad_out_ptr + row * d, up_ptr, idx, slot_ok, d, BLOCK_M, BLOCK_D)
    w = tl.load(weights_ptr + row * m + slots, mask=slot_ok, other=0.0).to(tl.float32)
    pre = tl.load(pre_ptr + row * m + slots, mask=slot_ok, other=0.0)
    activation, slope = _gelu_and_slope(pre)
    grad_pre = grad_coef * w * slope
    tl.store(grad_weights_ptr + row * m + slots, grad_coef * activation, mask=slot_ok)
    tl.store(grad_pre_ptr + row * m + slots, grad_pre, mask=slot_ok)
    coef = w * activation
    for start in range(0, d, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        col_ok = cols < d
        ok = slot_ok[:, None] & col_ok[None, :]
        g = tl.load(grad_out_ptr + row * d + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + row * d + cols, mask=col_ok, other=0.0).to(tl.float32)
        at = idx[:, None] * d + cols[None, :]
        tl.atomic_add(grad_up_ptr + at, coef[:, None] * g[None, :], mask=ok, sem="relaxed")
        tl.atomic_add(grad_down_ptr + at, grad_pre[:, None] * x[None, :], mask=ok, sem="relaxed")


# ---------------------------------------------------------------- launching


def _block_sizes(m, d):
    return min(_MAX_BLOCK_M, triton.next_power_of_2(m)), min(_MAX_BLOCK_D, triton.next_power_of_2(d))


def _bag(table, indices, coef):
    """sum_j coef[r, j] table[indices[r, j]] by peer_experts_bag_kernel: fp32 [R, d]."""
    n_rows, m = indices.shape
    d = table.shape[1]
    out = torch.zeros(n_rows, d, dtype=torch.float32, device=table.device)
    if n_rows and m and d:
        block_m, block_d = _block_sizes(m, d)
        peer_experts_bag_kernel[(n_rows, triton.cdiv(d, block_d))](out, table, indices, coef, d, m,
                                                                   BLOCK_M=block_m, BLOCK_D=block_d)
    return out


@torch.library.custom_op("languini::peer_experts_forward", mutates_args=())
def _forward_op(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor, indices: torch.Tensor,
                weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, m = indices.shape
    d = x.shape[1]
    pre = torch.zeros(n_rows, m, dtype=torch.float32, device=x.device)
    coef = torch.zeros(n_rows, m, dtype=torch.float32, device=x.device)
    if n_rows and m:
        block_m, block_d = _block_sizes(m, d)
        peer_experts_scores_kernel[(n_rows, triton.cdiv(m, block_m))](pre, coef, x, down, indices, weights, d, m,
                                                                      BLOCK_M=block_m, BLOCK_D=block_d)
    return _bag(up, indices, coef), pre


@_forward_op.register_fake
def _(x, down, up, indices, weights):
    return (x.new_empty(x.shape, dtype=torch.float32),
            x.new_empty(indices.shape, dtype=torch.float32))


@torch.library.custom_op("languini::peer_experts_backward", mutates_args=())
def _backward_op(grad_out: torch.Tensor, x: torch.Tensor, down: torch.Tensor, up: torch.Tensor,
                 indices: torch.Tensor, weights: torch.Tensor,
                 pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, m = indices.shape
    d = x.shape[1]
    grad_pre = torch.zeros(n_rows, m, dtype=torch.float32, device=x.device)
    grad_weights = torch.zeros(n_rows, m, dtype=torch.float32, device=x.device)
    grad_down = torch.zeros(down.shape, dtype=torch.float32, device=x.device)
    grad_up = torch.zeros(up.shape, dtype=torch.float32, device=x.device)
    if n_rows and m and d:
        block_m, block_d = _block_sizes(m, d)
        peer_experts_bwd_kernel[(n_rows, triton.cdiv(m, block_m))](
            grad_pre, grad_weights, grad_down, grad_up, grad_out, x, up, indices, weights, pre, d, m,
            BLOCK_M=block_m, BLOCK_D=block_d)
    return _bag(down, indices, grad_pre), grad_down, grad_up, grad_weights


@_backward_op.register_fake
def _(grad_out, x, down, up, indices, weights, pre):
    return (x.new_empty(x.shape, dtype=torch.float32), down.new_empty(down.shape, dtype=torch.float32),
            up.new_empty(up.shape, dtype=torch.float32), weights.new_empty(weights.shape, dtype=torch.float32))


class PeerExpertsFunction(torch.autograd.Function):
    """The Triton expert computation with gradients for x, both expert tables and the router weights."""

    @staticmethod
    def forward(ctx, x, down, up, indices, weights):
        out, pre = torch.ops.languini.peer_experts_forward(x, down, up, indices, weights)
        ctx.save_for_backward(x, down, up, indices, weights, pre)
        return out.to(torch.promote_types(torch.promote_types(x.dtype, down.dtype),
                                          torch.promote_types(up.dtype, weights.dtype)))

    @staticmethod
    def backward(ctx, grad_out):
        x, down, up, indices, weights, pre = ctx.saved_tensors
        grad_x, grad_down, grad_up, grad_weights = torch.ops.languini.peer_experts_backward(
            grad_out.contiguous(), x, down, up, indices, weights, pre)
        return (grad_x.to(x.dtype), grad_down.to(down.dtype), grad_up.to(up.dtype), None,
                grad_weights.to(weights.dtype))


def peer_experts_triton(x, down, up, indices, weights):
    """naive.peer_experts_reference by the kernels, differentiable in x, down, up and weights.

    Args:
        x: [R, d]; down, up: [N, d] (fp32 or bf16); indices: int64 [R, M], each in [0, N); weights: [R, M]; on CUDA
        (or on CPU under TRITON_INTERPRET=1).
    Returns:
        [R, d] in the promoted dtype of x, down, up and weights, accumulated in fp32.
    """
    check_inputs(x, down, up, indices, weights)
    if not x.is_cuda and not interpreting():
        raise ValueError("the Triton PEER experts need CUDA tensors (or TRITON_INTERPRET=1 set before importing "
                         "triton); use peer_experts_reference on CPU")
    return PeerExpertsFunction.apply(x.contiguous(), down.contiguous(), up.contiguous(), indices.contiguous(),
                                     weights.contiguous())
