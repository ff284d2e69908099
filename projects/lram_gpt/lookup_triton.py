"""Triton kernels for the lattice memory read phi(q) = sum_k f(|q - k|) v_k (lattice.interpolate is the reference).

Per query row (one token and head) a program block finds the nearest lattice point, maps the query into the
fundamental region F, scores all 232 FUNDAMENTAL_POINTS as one [BLOCK, 256] tile, picks the `topk` heaviest
by repeated arg-max (ties go to the earlier point, as in the reference's stable sort), and accumulates
weight * values[index] in fp32 from fp32 or bf16 values. The backward pass recomputes the lookup instead of
storing it and returns
    dL/dq      = -sum_k (g . v_k) u_k^3 (q - k)     with u_k = 1 - |q - k|^2 / 8, so f = u^4,
    dL/dv_k   += f(|q - k|) g                      by atomics ("atomic") or, without atomics, by sorting the
                                                   (row, slot) pairs by memory index and summing each
                                                   index's segment ("segment").
With sparse=True the value gradient is a sparse COO tensor holding only the rows read: the segment sums
(unique sorted indices, one summed row each) written compactly instead of into a dense [N, m] table.
The harmonic scale and the arg of theta stay in torch (memory.theta), so their gradients are autograd's.
BLOCK_ROWS, SEGMENT_BLOCK and the default value_grad="atomic" are untuned: no GPU has timed them yet.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from projects.lram_gpt.lattice import (
    DEFAULT_TOPK,
    DIM,
    FUNDAMENTAL_POINTS,
    check_torus,
    index_strides,
    memory_size,
)

VALUE_GRAD_METHODS = ("atomic", "segment")
POINTS_PAD = 256  # the 232 points padded to a power of two for the score tile
BLOCK_ROWS = 16
SEGMENT_BLOCK = 32
COORDS = tl.constexpr(DIM)  # compiled kernels may read a global only if it is a constexpr


@triton.jit
def _nearest_d8(y, cols):
    """Nearest point of D8 to each row of y [BLOCK, 8] (Conway & Sloane): round, fix an odd sum."""
    rounded = tl.floor(y + 0.5)
    residual = y - rounded
    total = tl.sum(rounded, axis=1)
    odd = (total - 2.0 * tl.floor(total * 0.5)) != 0.0
    worst = tl.argmax(tl.abs(residual), axis=1, tie_break_left=True)
    step = tl.where(residual >= 0.0, 1.0, -1.0)
    fix = (cols[None, :] == worst[:, None]) & odd[:, None]
    return rounded + tl.where(fix, step, 0.0)


@triton.jit
def _locate(q, cols, points_t_ptr, N_POINTS: tl.constexpr, POINTS: tl.constexpr):
    """Nearest point, isometry into F and the [BLOCK, POINTS] tile of u = max(0, 1 - d^2/8) (-1 on padding)."""
    even = 2.0 * _nearest_d8(q * 0.5, cols)
    odd = 2.0 * _nearest_d8((q - 1.0) * 0.5, cols) + 1.0
    d_even = tl.sum((q - even) * (q - even), axis=1)
    d_odd = tl.sum((q - odd) * (q - odd), axis=1)
    center = tl.where((d_odd < d_even)[:, None], odd, even)
    offset = q - center
    # position[i]: rank of |offset_i| in descending order, equal magnitudes keep coordinate order.
    mag = tl.abs(offset)
    mag_i = mag[:, :, None]
    mag_j = mag[:, None, :]
    ahead = (mag_j > mag_i) | ((mag_j == mag_i) & (cols[None, None, :] < cols[None, :, None]))
    position = tl.sum(ahead.to(tl.int32), axis=2)
    negative = offset < 0.0
    odd_negatives = (tl.sum(negative.to(tl.int32), axis=1) % 2) == 1
    sign = tl.where(negative, -1.0, 1.0)
    sign = tl.where((position == COORDS - 1) & odd_negatives[:, None], -sign, sign)
    signed = sign * offset
    moved = position[:, :, None] == cols[None, None, :]
    z = tl.sum(tl.where(moved, signed[:, :, None], 0.0), axis=1)

    point_ids = tl.arange(0, POINTS)
    squared = tl.zeros((q.shape[0], POINTS), dtype=tl.float32)
    for k in tl.static_range(COORDS):
        z_k = tl.sum(tl.where(cols[None, :] == k, z, 0.0), axis=1)
        p_k = tl.load(points_t_ptr + k * POINTS + point_ids)
        diff = z_k[:, None] - p_k[None, :]
        squared += diff * diff
    closeness = tl.maximum(1.0 - squared * 0.125, 0.0)
    closeness = tl.where(point_ids[None, :] < N_POINTS, closeness, -1.0)
    return center, position, sign, closeness


@triton.jit
def _take_heaviest(closeness, center, position, sign, points_ptr, half_periods, strides, half_memory, cols,
                   POINTS: tl.constexpr):
    """Remove the heaviest point of each row from the tile; return it as (tile, u, lattice point, index)."""
    best, which = tl.max(closeness, axis=1, return_indices=True, return_indices_tie_break_left=True)
    closeness = tl.where(tl.arange(0, POINTS)[None, :] == which[:, None], -1.0, closeness)
    point = tl.load(points_ptr + which[:, None] * COORDS + position)
    lattice_point = center + sign * point
    coords = lattice_point.to(tl.int32)
    parity = tl.sum(tl.where(cols[None, :] == 0, coords & 1, 0), axis=1)
    digit = (coords - parity[:, None]) >> 1  # exact halving of an even number, floor for negatives
    digit = ((digit % half_periods[None, :]) + half_periods[None, :]) % half_periods[None, :]
    digit = tl.where(cols[None, :] == COORDS - 1, digit >> 1, digit)
    index = parity.to(tl.int64) * half_memory + tl.sum(digit.to(tl.int64) * strides[None, :], axis=1)
    return closeness, best, lattice_point, index


@triton.jit
def _forward_kernel(
    q_ptr, values_ptr, out_ptr, index_ptr, weight_ptr,
    half_periods_ptr, strides_ptr, points_ptr, points_t_ptr,
    n_rows, half_memory, M,
    M_PAD: tl.constexpr, TOPK: tl.constexpr, N_POINTS: tl.constexpr, POINTS: tl.constexpr,
    BLOCK: tl.constexpr, WRITE_OUTPUT: tl.constexpr, WRITE_LOOKUP: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    cols = tl.arange(0, COORDS)
    value_cols = tl.arange(0, M_PAD)
    value_ok = row_ok[:, None] & (value_cols[None, :] < M)
    q = tl.load(q_ptr + rows[:, None] * COORDS + cols[None, :], mask=row_ok[:, None], other=0.0)
    half_periods = tl.load(half_periods_ptr + cols)
    strides = tl.load(strides_ptr + cols)

    center, position, sign, closeness = _locate(q, cols, points_t_ptr, N_POINTS, POINTS)
    acc = tl.zeros((BLOCK, M_PAD), dtype=tl.float32)
    for slot in range(TOPK):
        closeness, u, lattice_point, index = _take_heaviest(
            closeness, center, position, sign, points_ptr, half_periods, strides, half_memory, cols, POINTS)
        weight = (u * u) * (u * u)
        if WRITE_OUTPUT:
            rows_v = tl.load(values_ptr + index[:, None] * M + value_cols[None, :], mask=value_ok, other=0.0)
            acc += weight[:, None] * rows_v.to(tl.float32)
        if WRITE_LOOKUP:
            tl.store(index_ptr + rows * TOPK + slot, index, mask=row_ok)
            tl.store(weight_ptr + rows * TOPK + slot, weight, mask=row_ok)
    if WRITE_OUTPUT:
        tl.store(out_ptr + rows[:, None] * M + value_cols[None, :], acc, mask=value_ok)


@triton.jit
def _backward_kernel(
    q_ptr, values_ptr, grad_out_ptr, grad_q_ptr, grad_values_ptr, index_ptr, weight_ptr,
    half_periods_ptr, strides_ptr, points_ptr, points_t_ptr,
    n_rows, half_memory, M,
    M_PAD: tl.constexpr, TOPK: tl.constexpr, N_POINTS: tl.constexpr, POINTS: tl.constexpr,
    BLOCK: tl.constexpr, GRAD_Q: tl.constexpr, GRAD_VALUES_ATOMIC: tl.constexpr, WRITE_LOOKUP: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    cols = tl.arange(0, COORDS)
    value_cols = tl.arange(0, M_PAD)
    value_ok = row_ok[:, None] & (value_cols[None, :] < M)
    q = tl.load(q_ptr + rows[:, None] * COORDS + cols[None, :], mask=row_ok[:, None], other=0.0)
    grad_out = tl.load(grad_out_ptr + rows[:, None] * M + value_cols[None, :], mask=value_ok, other=0.0)
    half_periods = tl.load(half_periods_ptr + cols)
    strides = tl.load(strides_ptr + cols)

    center, position, sign, closeness = _locate(q, cols, points_t_ptr, N_POINTS, POINTS)
    grad_q = tl.zeros((BLOCK, COORDS), dtype=tl.float32)
    for slot in range(TOPK):
        closeness, u, lattice_point, index = _take_heaviest(
            closeness, center, position, sign, points_ptr, half_periods, strides, half_memory, cols, POINTS)
        if GRAD_Q:
            rows_v = tl.load(values_ptr + index[:, None] * M + value_cols[None, :], mask=value_ok, other=0.0)
            along = tl.sum(grad_out * rows_v.to(tl.float32), axis=1)
            grad_q -= (along * u * u * u)[:, None] * (q - lattice_point)
        weight = (u * u) * (u * u)
        if GRAD_VALUES_ATOMIC:
            tl.atomic_add(grad_values_ptr + index[:, None] * M + value_cols[None, :],
                          weight[:, None] * grad_out, mask=value_ok)
        if WRITE_LOOKUP:
            tl.store(index_ptr + rows * TOPK + slot, index, mask=row_ok)
            tl.store(weight_ptr + rows * TOPK + slot, weight, mask=row_ok)
    if GRAD_Q:
        tl.store(grad_q_ptr + rows[:, None] * COORDS + cols[None, :], grad_q, mask=row_ok[:, None])


@triton.jit
def _segment_sum_kernel(
    grad_out_ptr, weight_ptr, order_ptr, segment_start_ptr, segment_index_ptr, grad_values_ptr, M,
    M_PAD: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr, COMPACT: tl.constexpr,
):
    """Sum of weight * grad_out over one memory index's run of sorted (row, slot) entries, stored at row
    `index` of a dense gradient, or at row `segment` of a compact one (COMPACT)."""
    segment = tl.program_id(0)
    start = tl.load(segment_start_ptr + segment)
    end = tl.load(segment_start_ptr + segment + 1)
    if COMPACT:
        target = segment.to(tl.int64)
    else:
        target = tl.load(segment_index_ptr + segment)
    value_cols = tl.arange(0, M_PAD)
    acc = tl.zeros((M_PAD,), dtype=tl.float32)
    for first in range(start, end, BLOCK):
        entries = first + tl.arange(0, BLOCK)
        ok = entries < end
        entry = tl.load(order_ptr + entries, mask=ok, other=0)
        weight = tl.load(weight_ptr + entry, mask=ok, other=0.0)
        grad_ok = ok[:, None] & (value_cols[None, :] < M)
        grad = tl.load(grad_out_ptr + (entry // TOPK)[:, None] * M + value_cols[None, :], mask=grad_ok, other=0.0)
        acc += tl.sum(weight[:, None] * grad, axis=0)
    tl.store(grad_values_ptr + target * M + value_cols, acc, mask=value_cols < M)


_TABLES: dict = {}


def _tables(K, device):
    """Device tensors the kernels read: half periods, index strides, the points and their transpose (padded)."""
    key = (K, str(device))
    if key not in _TABLES:
        points = FUNDAMENTAL_POINTS.to(torch.float32)
        points_t = torch.zeros(DIM, POINTS_PAD, dtype=torch.float32)
        points_t[:, : points.shape[0]] = points.T
        _TABLES[key] = (
            torch.tensor([k // 2 for k in K], dtype=torch.int32, device=device),
            torch.tensor(index_strides(K), dtype=torch.int64, device=device),
            points.contiguous().to(device),
            points_t.to(device),
        )
    return _TABLES[key]


def _check(q: torch.Tensor, K, topk: int, values: torch.Tensor | None = None):
    K = check_torus(K)
    if q.shape[-1] != DIM:
        raise ValueError(f"queries must have 8 coordinates in the last dimension, got shape {tuple(q.shape)}")
    if not 1 <= topk <= FUNDAMENTAL_POINTS.shape[0]:
        raise ValueError(f"topk must be in [1, {FUNDAMENTAL_POINTS.shape[0]}], got {topk}")
    if values is not None:
        if values.dim() != 2 or values.shape[0] != memory_size(K):
            raise ValueError(f"values must be [{memory_size(K)}, m] for the torus {K}, got {tuple(values.shape)}")
        if values.device != q.device:
            raise ValueError(f"values on {values.device} but queries on {q.device}; move them to one device")
    return K


def _launch_args(q_rows, K, M):
    half_periods, strides, points, points_t = _tables(K, q_rows.device)
    grid = (triton.cdiv(q_rows.shape[0], BLOCK_ROWS),)
    pointers = (half_periods, strides, points, points_t)
    scalars = (q_rows.shape[0], memory_size(K) // 2, M)
    meta = dict(M_PAD=triton.next_power_of_2(max(M, 1)), N_POINTS=FUNDAMENTAL_POINTS.shape[0],
                POINTS=POINTS_PAD, BLOCK=BLOCK_ROWS)
    return grid, pointers, scalars, meta


class _Interpolate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, values, K, topk, value_grad, sparse):
        q_rows = q.reshape(-1, DIM).to(torch.float32).contiguous()
        values_c = values.contiguous()
        M = values.shape[1]
        out = torch.empty(q_rows.shape[0], M, dtype=torch.float32, device=q.device)
        grid, pointers, scalars, meta = _launch_args(q_rows, K, M)
        _forward_kernel[grid](q_rows, values_c, out, out, out, *pointers, *scalars,
                              TOPK=topk, WRITE_OUTPUT=True, WRITE_LOOKUP=False, **meta)
        ctx.save_for_backward(q_rows, values_c)
        ctx.K, ctx.topk, ctx.value_grad, ctx.sparse = K, topk, value_grad, sparse
        ctx.q_shape, ctx.q_dtype = q.shape, q.dtype
        return out.view(*q.shape[:-1], M)

    @staticmethod
    def backward(ctx, grad_out):
        q_rows, values = ctx.saved_tensors
        K, topk = ctx.K, ctx.topk
        n_rows, M = q_rows.shape[0], values.shape[1]
        grad_rows = grad_out.reshape(n_rows, M).to(torch.float32).contiguous()
        need_q, need_values = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        segment = need_values and (ctx.value_grad == "segment" or ctx.sparse)
        atomic = need_values and not segment

        grad_q = torch.empty_like(q_rows) if need_q else q_rows
        dense = need_values and not ctx.sparse
        grad_values = torch.zeros(values.shape, dtype=torch.float32, device=values.device) if dense else None
        index = torch.empty(n_rows * topk, dtype=torch.int64, device=q_rows.device) if segment else q_rows
        weight = torch.empty(n_rows * topk, dtype=torch.float32, device=q_rows.device) if segment else q_rows
        grid, pointers, scalars, meta = _launch_args(q_rows, K, M)
        _backward_kernel[grid](
            q_rows, values, grad_rows, grad_q, grad_values if atomic else q_rows, index, weight,
            *pointers, *scalars, TOPK=topk, GRAD_Q=need_q, GRAD_VALUES_ATOMIC=atomic, WRITE_LOOKUP=segment, **meta)
        if segment:
            rows_read, sums = _segment_sum(grad_rows, index, weight, grad_values, topk)
            if ctx.sparse:
                grad_values = torch.sparse_coo_tensor(rows_read[None], sums.to(values.dtype), values.shape,
                                                      is_coalesced=True, check_invariants=False)
        grad_q = grad_q.view(ctx.q_shape).to(ctx.q_dtype) if need_q else None
        if dense:
            grad_values = grad_values.to(values.dtype)
        return grad_q, grad_values, None, None, None, None


def _segment_sum(grad_rows, index, weight, grad_values, topk):
    """Value gradient without atomics: sort (row, slot) entries by index, one program sums each index's run.

    Sums into the rows of grad_values [N, M]; with grad_values None into a new compact fp32 table [U, M].
    Returns (the U unique memory indices read, in rising order; the table written).
    """
    sorted_index, order = torch.sort(index, stable=True)
    segment_index, counts = torch.unique_consecutive(sorted_index, return_counts=True)
    segment_start = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=index.device)
    segment_start[1:] = counts.cumsum(0)
    M = grad_rows.shape[1]
    compact = grad_values is None
    if compact:
        grad_values = torch.empty(segment_index.shape[0], M, dtype=torch.float32, device=index.device)
    _segment_sum_kernel[(segment_index.shape[0],)](
        grad_rows, weight, order, segment_start, segment_index, grad_values, M,
        M_PAD=triton.next_power_of_2(max(M, 1)), TOPK=topk, BLOCK=SEGMENT_BLOCK, COMPACT=compact)
    return segment_index, grad_values


@torch.compiler.disable
def interpolate_triton(q: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK,
                       value_grad: str = "atomic", sparse: bool = False) -> torch.Tensor:
    """phi(q) for queries q [..., 8] from values [N, m] (fp32 or bf16); fp32 [..., m], differentiable in both.

    value_grad picks how a dense value gradient is accumulated: "atomic" (atomic adds) or "segment"
    (sort by memory index, then one sum per index, no atomics). sparse=True makes the value gradient a
    coalesced sparse COO tensor of the rows read (always by the segment sums), as nn.Embedding(sparse=True).
    """
    K = _check(q, K, topk, values)
    if value_grad not in VALUE_GRAD_METHODS:
        raise ValueError(f"value_grad must be one of {VALUE_GRAD_METHODS}, got {value_grad!r}")
    return _Interpolate.apply(q, values, K, topk, value_grad, sparse)


@torch.compiler.disable
@torch.no_grad()
def lookup_triton(q: torch.Tensor, K, topk: int = DEFAULT_TOPK):
    """lattice.lookup by the kernel: (index int64 [..., topk], weight fp32 [..., topk]), falling weight."""
    K = _check(q, K, topk)
    q_rows = q.reshape(-1, DIM).to(torch.float32).contiguous()
    index = torch.empty(q_rows.shape[0], topk, dtype=torch.int64, device=q.device)
    weight = torch.empty(q_rows.shape[0], topk, dtype=torch.float32, device=q.device)
    grid, pointers, scalars, meta = _launch_args(q_rows, K, 0)
    _forward_kernel[grid](q_rows, q_rows, q_rows, index, weight, *pointers, *scalars,
                          TOPK=topk, WRITE_OUTPUT=False, WRITE_LOOKUP=True, **meta)
    return index.view(*q.shape[:-1], topk), weight.view(*q.shape[:-1], topk)
