"""Weighted embedding bag by Triton kernels: out[r] = sum_j weights[r, j] * values[indices[r, j]].

naive.py holds the reference. Here: the kernels (forward, per-sample-weight gradient, two value-gradient
variants), each launched from a `torch.library.custom_op` so that torch.compile treats it as opaque;
`EmbeddingBagFunction`, the autograd.Function tying them together; `embedding_bag_triton`, the entry.

Shapes: values [N, v_dim] (fp32 or bf16), indices [R, k] (int64, each in [0, N)),
weights [R, k]. The output [R, v_dim] is accumulated in fp32 and returned in the
promoted dtype of values and weights (as `weights * values` would be).

Value-gradient variants (`value_grad`):
- "atomic": one program per bag row scatters weight * grad_out into the table with atomic adds.
- "segment": reverse-index aggregation; the flat indices are sorted, and one program per
  distinct table row (a segment of the sorted entries) sums its entries' contributions and writes the row
  once, without atomics.
"atomic" is the default for now; which one is faster has not been measured on a GPU yet.
Both accumulate in an fp32 buffer and cast to the values' dtype at the end.

`sparse_values=True` makes the value gradient a coalesced sparse COO tensor holding only the rows read
(distinct rising indices, one summed row each), as nn.Embedding(sparse=True) does, for a lazy optimiser such
as torch.optim.SparseAdam: the "segment" sums written compactly (whatever `value_grad` says). The row count
depends on the data, so this path is a graph break under torch.compile.
"""

import torch
import triton
import triton.language as tl

from languini.memory_layers import sparse_rows
from languini.triton_utils import interpreting
from projects.pkm_gpt.ops.embedding_bag.naive import check_inputs

VALUE_GRAD_VARIANTS = ("atomic", "segment")

# Untuned block sizes (triton.autotune does not run in the interpreter); tune on a GPU.
_MAX_BLOCK_BAG = 32
_MAX_BLOCK_DIM = 128
_BLOCK_ENTRIES = 32


# ---------------------------------------------------------------- Triton kernels


@triton.jit
def pkm_bag_fwd_kernel(out_ptr, values_ptr, indices_ptr, weights_ptr, v_dim, bag_size,
                    BLOCK_BAG: tl.constexpr, BLOCK_DIM: tl.constexpr):
    # One program per (bag row, block of value columns).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    col_mask = cols < v_dim
    # A 2-D accumulator: multiply-adds in the loop, one reduction over the bag (across warps) after it.
    acc = tl.zeros([BLOCK_BAG, BLOCK_DIM], dtype=tl.float32)
    for start in range(0, bag_size, BLOCK_BAG):
        slots = start + tl.arange(0, BLOCK_BAG)
        slot_mask = slots < bag_size
        idx = tl.load(indices_ptr + row * bag_size + slots, mask=slot_mask, other=0)
        w = tl.load(weights_ptr + row * bag_size + slots, mask=slot_mask, other=0.0).to(tl.float32)
        vals = tl.load(values_ptr + idx[:, None] * v_dim + cols[None, :],
                       mask=slot_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += w[:, None] * vals
    tl.store(out_ptr + row * v_dim + cols, tl.sum(acc, axis=0), mask=col_mask)


@triton.jit
def pkm_bag_weight_grad_kernel(grad_weights_ptr, grad_out_ptr, values_ptr, indices_ptr, v_dim, bag_size,
                        BLOCK_BAG: tl.constexpr, BLOCK_DIM: tl.constexpr):
    # grad_weights[r, j] = <grad_out[r], values[indices[r, j]]>; one program per (row, block of slots).
    row = tl.program_id(0).to(tl.int64)
    slots = tl.program_id(1) * BLOCK_BAG + tl.arange(0, BLOCK_BAG)
    slot_mask = slots < bag_size
    idx = tl.load(indices_ptr + row * bag_size + slots, mask=slot_mask, other=0)
    acc = tl.zeros([BLOCK_BAG], dtype=tl.float32)
    for start in range(0, v_dim, BLOCK_DIM):
        cols = start + tl.arange(0, BLOCK_DIM)
        col_mask = cols < v_dim
        grad = tl.load(grad_out_ptr + row * v_dim + cols, mask=col_mask, other=0.0).to(tl.float32)
        vals = tl.load(values_ptr + idx[:, None] * v_dim + cols[None, :],
                       mask=slot_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(vals * grad[None, :], axis=1)
    tl.store(grad_weights_ptr + row * bag_size + slots, acc, mask=slot_mask)


@triton.jit
def pkm_bag_value_grad_atomic_kernel(grad_values_ptr, grad_out_ptr, indices_ptr, weights_ptr, v_dim, bag_size,
                              BLOCK_BAG: tl.constexpr, BLOCK_DIM: tl.constexpr):
    # Scatter weight * grad_out[r] into the fp32 table gradient; one program per (row, column block).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    col_mask = cols < v_dim
    grad = tl.load(grad_out_ptr + row * v_dim + cols, mask=col_mask, other=0.0).to(tl.float32)
    for start in range(0, bag_size, BLOCK_BAG):
        slots = start + tl.arange(0, BLOCK_BAG)
        slot_mask = slots < bag_size
        idx = tl.load(indices_ptr + row * bag_size + slots, mask=slot_mask, other=0)
        w = tl.load(weights_ptr + row * bag_size + slots, mask=slot_mask, other=0.0).to(tl.float32)
        tl.atomic_add(grad_values_ptr + idx[:, None] * v_dim + cols[None, :], w[:, None] * grad[None, :],
                      mask=slot_mask[:, None] & col_mask[None, :], sem="relaxed")


@triton.jit
def pkm_bag_value_grad_segment_kernel(grad_values_ptr, grad_out_ptr, weights_ptr, entry_order_ptr, segment_rows_ptr,
                              segment_starts_ptr, segment_ends_ptr, v_dim, bag_size,
                              BLOCK_ENTRIES: tl.constexpr, BLOCK_DIM: tl.constexpr, COMPACT: tl.constexpr):
    # One program per (distinct table row, column block): sum its entries, write the row once, into
    # its table row, or with COMPACT into row `segment` of a table of the rows read only.
    segment = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    col_mask = cols < v_dim
    seg_start = tl.load(segment_starts_ptr + segment)
    seg_end = tl.load(segment_ends_ptr + segment)
    acc = tl.zeros([BLOCK_DIM], dtype=tl.float32)
    for start in range(seg_start, seg_end, BLOCK_ENTRIES):
        positions = start + tl.arange(0, BLOCK_ENTRIES)
        entry_mask = positions < seg_end
        entry = tl.load(entry_order_ptr + positions, mask=entry_mask, other=0)  # flat r * bag_size + j
        w = tl.load(weights_ptr + entry, mask=entry_mask, other=0.0).to(tl.float32)
        bag_row = entry // bag_size
        grad = tl.load(grad_out_ptr + bag_row[:, None] * v_dim + cols[None, :],
                       mask=entry_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(w[:, None] * grad, axis=0)
    if COMPACT:
        out_row = segment.to(tl.int64)
    else:
        out_row = tl.load(segment_rows_ptr + segment)
    tl.store(grad_values_ptr + out_row * v_dim + cols, acc, mask=col_mask)


def _block_sizes(bag_size, v_dim):
    return (min(_MAX_BLOCK_BAG, triton.next_power_of_2(bag_size)),
            min(_MAX_BLOCK_DIM, triton.next_power_of_2(v_dim)))


def _segment_sums(grad_out, indices, weights, grad_values=None):
    """Per distinct table row read, the sum of weight * grad_out over its entries, by the segment kernel.

    Writes into the rows of grad_values [N, v_dim] (fp32) when given, else into a new compact fp32 table
    [U, v_dim]. Returns (the U rows read, rising; the table written).
    """
    bag_size, v_dim = indices.shape[1], grad_out.shape[1]
    # Reverse index: entries grouped by table row; each group is one segment of the sorted order.
    sorted_rows, entry_order = torch.sort(indices.reshape(-1))
    segment_rows, segment_lengths = torch.unique_consecutive(sorted_rows, return_counts=True)
    segment_ends = segment_lengths.cumsum(0)
    segment_starts = segment_ends - segment_lengths
    compact = grad_values is None
    if compact:
        grad_values = torch.empty(segment_rows.numel(), v_dim, dtype=torch.float32, device=grad_out.device)
    if segment_rows.numel() and v_dim:
        block_dim = _block_sizes(bag_size, v_dim)[1]
        pkm_bag_value_grad_segment_kernel[(segment_rows.numel(), triton.cdiv(v_dim, block_dim))](
            grad_values, grad_out, weights, entry_order, segment_rows, segment_starts, segment_ends, v_dim,
            bag_size, BLOCK_ENTRIES=_BLOCK_ENTRIES, BLOCK_DIM=block_dim, COMPACT=compact)
    return segment_rows, grad_values


# ---------------------------------------------------------------- custom ops (opaque to torch.compile)


@torch.library.custom_op("pkm_gpt::embedding_bag_forward", mutates_args=())
def _forward_op(values: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    num_bags, bag_size = indices.shape
    v_dim = values.shape[1]
    out = torch.empty(num_bags, v_dim, dtype=torch.promote_types(values.dtype, weights.dtype),
                      device=values.device)
    if out.numel() == 0:
        return out
    if bag_size == 0:
        return out.zero_()
    block_bag, block_dim = _block_sizes(bag_size, v_dim)
    pkm_bag_fwd_kernel[(num_bags, triton.cdiv(v_dim, block_dim))](
        out, values, indices, weights, v_dim, bag_size, BLOCK_BAG=block_bag, BLOCK_DIM=block_dim)
    return out


@_forward_op.register_fake
def _(values, indices, weights):
    return values.new_empty(indices.shape[0], values.shape[1],
                            dtype=torch.promote_types(values.dtype, weights.dtype))


@torch.library.custom_op("pkm_gpt::embedding_bag_weight_grad", mutates_args=())
def _weight_grad_op(grad_out: torch.Tensor, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    num_bags, bag_size = indices.shape
    v_dim = values.shape[1]
    grad_weights = torch.zeros(num_bags, bag_size, dtype=torch.float32, device=values.device)
    if grad_weights.numel() == 0 or v_dim == 0:
        return grad_weights
    block_bag, block_dim = _block_sizes(bag_size, v_dim)
    pkm_bag_weight_grad_kernel[(num_bags, triton.cdiv(bag_size, block_bag))](
        grad_weights, grad_out, values, indices, v_dim, bag_size, BLOCK_BAG=block_bag, BLOCK_DIM=block_dim)
    return grad_weights


@_weight_grad_op.register_fake
def _(grad_out, values, indices):
    return values.new_empty(indices.shape, dtype=torch.float32)


@torch.library.custom_op("pkm_gpt::embedding_bag_value_grad", mutates_args=())
def _value_grad_op(grad_out: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, num_rows: int,
                   value_grad: str) -> torch.Tensor:
    num_bags, bag_size = indices.shape
    v_dim = grad_out.shape[1]
    grad_values = torch.zeros(num_rows, v_dim, dtype=torch.float32, device=grad_out.device)
    if indices.numel() == 0 or v_dim == 0:
        return grad_values
    block_bag, block_dim = _block_sizes(bag_size, v_dim)
    if value_grad == "atomic":
        pkm_bag_value_grad_atomic_kernel[(num_bags, triton.cdiv(v_dim, block_dim))](
            grad_values, grad_out, indices, weights, v_dim, bag_size, BLOCK_BAG=block_bag, BLOCK_DIM=block_dim)
        return grad_values
    _segment_sums(grad_out, indices, weights, grad_values)
    return grad_values


@_value_grad_op.register_fake
def _(grad_out, indices, weights, num_rows, value_grad):
    return grad_out.new_empty(num_rows, grad_out.shape[1], dtype=torch.float32)


# ---------------------------------------------------------------- autograd and dispatch


class EmbeddingBagFunction(torch.autograd.Function):
    """Triton weighted embedding bag with gradients for the values and the per-sample weights."""

    @staticmethod
    def forward(ctx, values, indices, weights, value_grad, sparse_values):
        ctx.save_for_backward(values, indices, weights)
        ctx.value_grad, ctx.sparse_values = value_grad, sparse_values
        return torch.ops.pkm_gpt.embedding_bag_forward(values, indices, weights)

    @staticmethod
    def backward(ctx, grad_out):
        values, indices, weights = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_values = grad_weights = None
        if ctx.needs_input_grad[0] and ctx.sparse_values:
            rows_read, row_grads = _segment_sums(grad_out, indices, weights)
            grad_values = sparse_rows(rows_read, row_grads.to(values.dtype), values.shape)
        elif ctx.needs_input_grad[0]:
            grad_values = torch.ops.pkm_gpt.embedding_bag_value_grad(
                grad_out, indices, weights, values.shape[0], ctx.value_grad).to(values.dtype)
        if ctx.needs_input_grad[2]:
            grad_weights = torch.ops.pkm_gpt.embedding_bag_weight_grad(grad_out, values, indices).to(weights.dtype)
        return grad_values, None, grad_weights, None, None


def embedding_bag_triton(values, indices, weights, value_grad="atomic", sparse_values=False):
    """Weighted embedding bag by the Triton kernels, differentiable in values and weights.

    Args:
        values: [N, v_dim] fp32 or bf16 table, on CUDA (or on CPU under TRITON_INTERPRET=1).
        indices: int64 [R, k], each in [0, N).
        weights: [R, k] per-sample weights.
        value_grad: "atomic" or "segment", how the dense value gradient is reduced (module docstring).
        sparse_values: the value gradient is a coalesced sparse COO tensor of the rows read.
    Returns:
        [R, v_dim] in the promoted dtype of values and weights, accumulated in fp32.
    """
    check_inputs(values, indices, weights)
    if value_grad not in VALUE_GRAD_VARIANTS:
        raise ValueError(f"value_grad must be one of {VALUE_GRAD_VARIANTS}, got {value_grad!r}")
    if not values.is_cuda and not interpreting():
        raise ValueError("the Triton embedding bag needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                         "importing triton); use embedding_bag_reference on CPU")
    inputs = (values.contiguous(), indices.contiguous(), weights.contiguous())
    if sparse_values:
        return _triton_with_sparse_value_grad(*inputs)
    return EmbeddingBagFunction.apply(*inputs, value_grad, False)


@torch.compiler.disable  # a data-dependent row count and a sparse gradient: torch.compile cannot trace them
def _triton_with_sparse_value_grad(values, indices, weights):
    return EmbeddingBagFunction.apply(values, indices, weights, "segment", True)
