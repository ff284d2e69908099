"""Triton kernels for the lattice memory read (naive.theta and naive.interpolate are the references).

One program of one warp serves one lookup (a token's head), so no step needs more than the warp:
1. torus query (fused): the head's 16 inputs z give the harmonic scale s and q_i = K_i / (2 pi) arg z_i
   (arg by a polynomial: the interpreter has no atan2), computed on z / c for a power of two c near the
   head's largest input, so that forward and backward are finite and right for every finite z (as
   naive.torus_query); or q is given (interpolate_triton, lookup_triton).
   A head with a NaN or infinite input (a given q: also one beyond +-2^22) is read at q = 0 with s = NaN: its
   output is NaN, the value gradient NaN in the rows it read, its z gradient 0; no row outside [0, N) is
   ever read or written, and no check stops the GPU to look (tests/lram_gpt/test_lookup.py).
2. the nearest lattice point c and the signed permutation into the fundamental region F (paper 2.6), z_F,
   one coordinate per lane; its results go through a small per-lookup scratch in memory (a store to the
   permuted address is the permutation, and memory keeps the compiler from recomputing this part in the
   layouts below, where every lane holds all 8 coordinates).
3. d2 = |z_F - p|^2 for the 232 FUNDAMENTAL_POINTS p, 32 lanes x 8.
4. the exact top-k by a threshold search on the count of d2 below it (warp reductions, no sort): the first
   probe is where k + 1/2 points lie below on average, the next interpolate the count as a function of d2^4 (a
   ball's volume), every fourth probe bisects; it stops when exactly k lie below. If two candidates share the
   boundary's d2 exactly, the earlier point wins, as in the reference's stable sort. The chosen candidates are
   written compacted (prefix sum) to a per-slot buffer.
5. per slot (one lane each): the lattice point, its memory index (int32) and weight u^4, u = 1 - d2/8.
6. the weighted sum of the k value rows (fp32 or bf16, fp32 accumulation), 4 rows at a time (each a
   coalesced [4, m] tile; fewer partial sums to add up at the end than 8), scaled by s and written in the
   output dtype (fused cast).
The forward saves what the backward needs (per slot the memory index and the candidate; per lookup z_F, the
permutation and signs packed in one int32, and s), so the backward does not select again. Per lookup it
gathers the k rows once for a_k = g . v_k and returns
    dL/dz_F = -s sum_k a_k u_k^3 (z_F - p_k)        (mapped back to q, then through the torus query)
    dL/ds   = sum_k u_k^4 a_k
    dL/dv_k += s u_k^4 g                             by relaxed atomics ("atomic"), or without per-entry atomics
                                                     ("segment"): entries sorted by int32 memory index, each
                                                     block of 64 sorted entries is cut in 8 stretches of 8
                                                     that 4 lanes each sum in order (one pass over the runs,
                                                     no value crossing lanes; where each entry's sum goes is
                                                     found once per block, a lane per entry) and store, runs
                                                     cut by a stretch's edge are added atomically. No host
                                                     synchronisation on the dense path.
With sparse=True the value gradient is a sparse COO tensor of the rows read (the segment sums written
compactly; the number of rows read is the one host synchronisation of that path).
scripts/kernel_cost.py prints what each kernel costs per lookup (projects/lram_gpt/kernel_cost.csv).
"""
import math

import torch
import triton
import triton.language as tl

from languini.memory_layers import check_value_grad, sparse_rows
from projects.lram_gpt.lattice import (
    DEFAULT_TOPK,
    DIM,
    FUNDAMENTAL_POINTS,
    check_torus,
    index_strides,
    memory_size,
)

HEAD_INPUTS = 2 * DIM
POINTS_PAD = 256  # the 232 points padded to 32 lanes x 8
SEGMENT_BLOCK = 64  # sorted (row, slot) entries per program of the segment sums
SEGMENT_PART = 16  # columns of a row part: 4 lanes, 4 each; 128 // SEGMENT_PART stretches summed side by side
# The segment sums' lanes should run over the stretches and each hold all parts of its row: of two dimensions with
# the same (unit) stride Triton 3.8 and 3.9 give the lanes to the inner one, 3.6 to the outer one
# (scripts/kernel_cost.py: 388 against 516 warp-instructions per lookup), so the parts go outside the stretches
# from 3.8 on (3.7 unseen)
PARTS_FIRST = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 8)
# Registers per thread: a one-warp program at 64 lets an SM hold 32 of them (its most), 50% occupancy (sm_80,
# sm_90). ptxas meets the cap without spilling (scripts/kernel_cost.py counts LDL/STL) for theta's forward and
# every backward; the forward from lattice coordinates (interpolate_triton, lookup_triton) goes uncapped.
REGISTERS = 64
COORDS = tl.constexpr(DIM)  # compiled kernels may read a global only if it is a constexpr
# The lattice (2 D8 and 2 D8 + 1: a point per 256 units of volume) has on average pi^4 t^4 / 6144 points below
# d2 = t around a query (an 8-ball's volume over 256): the threshold search models the count so.
POINTS_PER_T4 = math.pi**4 / 6144
BISECT_EVERY = tl.constexpr(4)  # every 4th probe bisects, so that the search ends whatever the model's error
PROBE_CEILING = tl.constexpr(40.0)  # above every candidate's d2 (|z_F| <= 2, |p| <= 4), below the padding's
PADDING_D2 = 1e30
TINY = tl.constexpr(torch.finfo(torch.float32).tiny)  # 2^-126; w_i is read at least sqrt(TINY) = 2^-63 from 0
FLOOR_INVERSE = tl.constexpr(2.0**63)
LIFT = tl.constexpr(2.0**64)
INFINITY = tl.constexpr(float("inf"))
Q_LIMIT = tl.constexpr(2.0**22)  # lattice coordinates beyond it (4 million periods) read as NaN: see lookup_fwd
PI = tl.constexpr(math.pi)
HALF_PI = tl.constexpr(math.pi / 2)
# atan(a) / a as a polynomial in a^2 on [0, 1]: a least-squares fit, max error 1e-7 rad in fp32 arithmetic.
A0, A1, A2, A3, A4, A5, A6, A7, A8 = (tl.constexpr(c) for c in (
    1.0, -0.3333309292793274, 0.19993020594120026, -0.14206823706626892, 0.1065329760313034, -0.07530403137207031,
    0.042997024953365326, -0.016254819929599762, 0.0028960001654922962))


@triton.jit
def _atan2(y, x):
    ax = tl.abs(x)
    ay = tl.abs(y)
    big = tl.maximum(ax, ay)
    a = tl.fdiv(tl.minimum(ax, ay), tl.where(big == 0.0, 1.0, big))  # 2 ulp: within the polynomial's error
    s = a * a
    p = A8 * s + A7
    p = p * s + A6
    p = p * s + A5
    p = p * s + A4
    p = p * s + A3
    p = p * s + A2
    p = p * s + A1
    p = p * s + A0
    r = a * p
    r = tl.where(ay > ax, HALF_PI - r, r)
    r = tl.where(x < 0.0, PI - r, r)
    return tl.where(y < 0.0, -r, r)


@triton.jit
def _nearest_d8(y, cols):
    """Nearest point of D8 to y [8] (Conway & Sloane): round, then fix an odd sum at the worst coordinate."""
    rounded = tl.floor(y + 0.5)
    residual = y - rounded
    # integer reductions (one warp instruction each): the parity of the sum, the first coordinate of the largest
    # |residual| (|y| < 2^22, so rounded fits an int32)
    odd = (tl.sum(rounded.to(tl.int32), axis=0) & 1) != 0
    size = tl.abs(residual).to(tl.int32, bitcast=True)  # a float >= 0 orders as its bits
    worst = tl.min(tl.where(size == tl.max(size, axis=0), cols, COORDS), axis=0)
    step = tl.where(residual >= 0.0, 1.0, -1.0)
    return rounded + tl.where(cols == worst, tl.where(odd, step, 0.0), 0.0)


@triton.jit
def _columns(x):
    """The 8 columns of x [32, 8] (each lane holds a row: no value moves), in an order of their own."""
    even, odd = tl.split(tl.reshape(x, (32, 4, 2)))
    a, b = tl.split(tl.reshape(even, (32, 2, 2)))
    c, d = tl.split(tl.reshape(odd, (32, 2, 2)))
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    c0, c1 = tl.split(c)
    d0, d1 = tl.split(d)
    return a0, a1, b0, b1, c0, c1, d0, d1


@triton.jit
def _head_inputs(z_ptr, row, cols):
    """One head's 16 inputs as w = z / c (naive.head_scale: c a power of two, so w is exact and at most 2 in
    size, whatever finite z is), and whether all 16 are finite. Returns (re, im, c, valid)."""
    re = tl.load(z_ptr + row * (2 * COORDS) + cols).to(tl.float32)
    im = tl.load(z_ptr + row * (2 * COORDS) + COORDS + cols).to(tl.float32)
    finite = (tl.abs(re) < INFINITY) & (tl.abs(im) < INFINITY)  # NaN compares false
    valid = tl.sum(finite.to(tl.int32), axis=0) == COORDS
    largest = tl.max(tl.maximum(tl.abs(re), tl.abs(im)), axis=0)
    # c = 2^e from the exponent bits, within [2^-126, 2^126] so that 1/c is a normal float too
    exponent = tl.minimum(tl.maximum(largest.to(tl.int32, bitcast=True) & 0x7F800000, 1 << 23), 253 << 23)
    inverse = ((254 << 23) - exponent).to(tl.float32, bitcast=True)
    return re * inverse, im * inverse, exponent.to(tl.float32, bitcast=True), valid


@triton.jit
def _torus_query(z_ptr, freq_ptr, row, cols):
    """Harmonic scale and lattice coordinates q [8] of one head's 16 inputs, as naive.torus_query; a head with a
    non-finite input gets q = 0 and scale NaN."""
    re, im, c, valid = _head_inputs(z_ptr, row, cols)
    squared = re * re + im * im
    scale = c * tl.fdiv(1.0, tl.sum(tl.math.rsqrt(tl.maximum(squared, TINY)), axis=0))
    # a w_i below the floor (sqrt(tiny)): its angle from w_i * 2^64 (exact), where no division flushes it
    lift = tl.where(squared < TINY, LIFT, 1.0)
    angle = _atan2(im * lift, tl.where(squared == 0.0, 1.0, re * lift))
    q = tl.where(valid, angle * tl.load(freq_ptr + cols), 0.0)
    # inf - inf is NaN: a NaN global would break the JIT's cache check (NaN != NaN)
    return tl.where(valid, scale, INFINITY - INFINITY), q


@triton.jit
def lram_lookup_fwd_kernel(
    x_ptr, values_ptr, out_ptr, cand_ptr, index_ptr, weight_ptr, zf_ptr, frame_ptr, scale_ptr, place_ptr,
    place_stride_ptr, freq_ptr, half_periods_ptr, strides_ptr, points_t_ptr, norms_ptr, points_ptr,
    half_memory, first_probe,
    M: tl.constexpr, M_PAD: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr,
    FROM_Q: tl.constexpr, READ: tl.constexpr, SAVE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, COORDS)
    if FROM_Q:
        q = tl.load(x_ptr + row * COORDS + cols)
        # beyond Q_LIMIT (or NaN, inf) the reduction below would not be exact: read at 0 with scale NaN
        valid = tl.sum((tl.abs(q) <= Q_LIMIT).to(tl.int32), axis=0) == COORDS
        q = tl.where(valid, q, 0.0)
        # into [-K/2, K/2] (exactly: minus an integer), as the torus query's are; a lattice translation
        period = 2.0 * tl.load(half_periods_ptr + cols).to(tl.float32)
        q = q - period * tl.floor(q * tl.fdiv(1.0, period) + 0.5)
        scale = tl.where(valid, 1.0, INFINITY - INFINITY)  # NaN
    else:
        scale, q = _torus_query(x_ptr, freq_ptr, row, cols)

    # nearest lattice point: the nearer of the nearest points of the cosets 2*D8 and 2*D8 + 1
    even = 2.0 * _nearest_d8(q * 0.5, cols)
    odd = 2.0 * _nearest_d8((q - 1.0) * 0.5, cols) + 1.0
    d_even = tl.sum((q - even) * (q - even), axis=0)
    d_odd = tl.sum((q - odd) * (q - odd), axis=0)
    center = tl.where(d_odd < d_even, odd, even)
    offset = q - center
    # coordinate i moves to place position[i] (falling |offset|, ties in coordinate order) with sign[i]; an odd
    # count of negative signs flips the last coordinate too, so the sign changes are even. The comparison of
    # all pairs reads |offset| from memory: the compiler would otherwise compute everything above twice.
    place = place_ptr + row * (6 * COORDS)
    tl.store(place + 5 * COORDS + cols, tl.abs(offset))
    tl.debug_barrier()
    mag_i = tl.load(place + 5 * COORDS + cols)[:, None]
    mag_j = tl.load(place + 5 * COORDS + cols)[None, :]
    ahead = (mag_j > mag_i) | ((mag_j == mag_i) & (cols[None, :] < cols[:, None]))
    position = tl.sum(ahead.to(tl.int32), axis=1)
    negative = offset < 0.0
    odd_negatives = (tl.sum(negative.to(tl.int32), axis=0) % 2) == 1
    sign = tl.where(negative, -1.0, 1.0)
    sign = tl.where(position == COORDS - 1, tl.where(odd_negatives, -sign, sign), sign)
    # By place, through memory (a store to the permuted address is the permutation): z_F, and what the
    # memory index needs there. Memory also keeps the compiler from redoing the work above in the layouts
    # below, where every lane holds all 8 coordinates, instead of one coordinate per lane.
    tl.store(place + position, sign * offset)
    tl.store(place + COORDS + position, center)
    tl.store(place + 2 * COORDS + position, sign)
    tl.store(place + 3 * COORDS + position, tl.load(half_periods_ptr + cols).to(tl.float32))
    tl.store(place + 4 * COORDS + position, (cols == COORDS - 1).to(tl.float32))
    tl.store(place_stride_ptr + row * COORDS + position, tl.load(strides_ptr + cols))
    if SAVE:
        tl.store(zf_ptr + row * COORDS + position, sign * offset)
        # bit fields apart: their sum is their union, in one warp reduction
        packed = tl.sum((position << (3 * cols)) | ((sign < 0.0).to(tl.int32) << (24 + cols)), axis=0)
        tl.store(frame_ptr + row, packed)
        tl.store(scale_ptr + row, scale)
    zz = tl.sum(offset * offset, axis=0)
    tl.debug_barrier()

    # squared distances |p|^2 + |z_F|^2 - 2 z_F.p to the candidates, [32 lanes, 8 each] (padding: |p|^2 = 1e30)
    points = tl.arange(0, 32)[:, None] * 8 + tl.arange(0, 8)[None, :]
    dot = tl.zeros((32, 8), tl.float32)
    for k in tl.range(COORDS, num_stages=1):  # a loop, not unrolled: registers for one coordinate's table row
        dot += tl.load(place + k) * tl.load(points_t_ptr + k * 256 + points)
    d2 = tl.load(norms_ptr + points) + (zz - 2.0 * dot)

    # threshold t with exactly TOPK candidates below it; invariant count(lo) < TOPK < count(hi)
    lo = tl.full((), 0.0, tl.float32)
    hi = tl.full((), PROBE_CEILING, tl.float32)
    count_lo = tl.full((), 0, tl.int32)
    count_hi = tl.full((), 256, tl.int32)
    t = tl.full((), first_probe, tl.float32)  # fp32 (the interpreter passes a Python float)
    count = tl.full((), -1, tl.int32)
    probes = tl.full((), 0, tl.int32)
    stalled = tl.full((), 0, tl.int1)
    while (count != TOPK) & (stalled == 0):
        count = tl.sum((d2 < t).to(tl.int32))
        below = count < TOPK
        above = count > TOPK
        lo = tl.where(below, t, lo)
        count_lo = tl.where(below, count, count_lo)
        hi = tl.where(above, t, hi)
        count_hi = tl.where(above, count, count_hi)
        probes += 1
        # the count linear in t^4 through (lo, count_lo) and (hi, count_hi), or through 0 while hi is the ceiling:
        # t^4 = lo^4 + (TOPK + 1/2 - count_lo) span / gap, span and gap >= 0 (1 / gap by an approximate rsqrt)
        lo4 = (lo * lo) * (lo * lo)
        hi4 = (hi * hi) * (hi * hi)
        ceiling = count_hi == 256
        span = tl.where(ceiling, lo4, hi4 - lo4)
        gap = tl.where(ceiling, count_lo, count_hi - count_lo).to(tl.float32)
        guess = tl.sqrt(tl.sqrt(lo4 + (TOPK + 0.5 - count_lo.to(tl.float32)) * span * tl.math.rsqrt(gap * gap)))
        middle = 0.5 * (lo + hi)
        # a guess outside (lo, hi) bisects too (infinite where count_lo = 0 with hi at the ceiling)
        inside = (guess > lo) & (guess < hi)
        guess = tl.where(((probes % BISECT_EVERY) == 0) | (inside == 0), middle, guess)
        stalled = (guess <= lo) | (guess >= hi)  # lo and hi are neighbouring floats: a tie at lo
        t = tl.where(count == TOPK, t, guess)
    if count != TOPK:  # a tie at d2 = lo: the earliest points at lo fill the remaining slots
        equal = d2 == lo
        first = tl.full((), 0, tl.int32)  # bisect the point bound b: count(equal and point < b) reaches TOPK
        last = tl.full((), 256, tl.int32)
        while last - first > 1:
            middle_id = (first + last) // 2
            enough = (count_lo + tl.sum((equal & (points < middle_id)).to(tl.int32))) >= TOPK
            last = tl.where(enough, middle_id, last)
            first = tl.where(enough, first, middle_id)
        # chosen: those below lo and the tied points before the bound (one comparison below for both cases)
        d2 = tl.where(equal & (points < last), -1.0, d2)
        t = lo
    chosen = (d2 < t).to(tl.int32)
    # compacted in point order: slot = chosen points before this one (in the lane, then in earlier lanes)
    in_lane = tl.cumsum(chosen, axis=1) - chosen
    per_lane = tl.sum(chosen, axis=1)
    slot_of = (tl.cumsum(per_lane, axis=0) - per_lane)[:, None] + in_lane
    # a lane's 8 entries stored as 8 stores of one entry per lane: a [32, 8] store with data-dependent addresses
    # would move its 64-bit pointers through shared memory into a layout of one entry per thread first
    slot_columns = _columns(slot_of)
    point_columns = _columns(points)
    chosen_columns = _columns(chosen)
    for column in tl.static_range(8):
        tl.store(cand_ptr + row * TOPK + slot_columns[column], point_columns[column].to(tl.int16),
                 mask=chosen_columns[column] != 0)
    tl.debug_barrier()  # the slots were written by other lanes

    # per slot (a lane each): the lattice point center + sign * p, its memory index and its weight
    slots = tl.arange(0, TOPK_PAD)
    slot_ok = slots < TOPK
    cand = tl.load(cand_ptr + row * TOPK + slots, mask=slot_ok, other=0).to(tl.int32)
    p = tl.load(points_ptr + cand[:, None] * COORDS + cols[None, :]).to(tl.float32)  # [TOPK_PAD, 8]
    diff = tl.load(place + cols)[None, :] - p
    u = tl.maximum(1.0 - tl.sum(diff * diff, axis=1) * 0.125, 0.0)
    weight = tl.where(slot_ok, (u * u) * (u * u), 0.0)
    if FROM_Q:  # lookup_triton's weights: NaN for a query read as invalid (scale is 1 otherwise)
        weight = weight * scale
    coords = tl.load(place + COORDS + cols)[None, :] + tl.load(place + 2 * COORDS + cols)[None, :] * p
    parity = tl.sum(tl.where(cols[None, :] == 0, coords, 0.0), axis=1)  # all coordinates share it
    parity = parity - 2.0 * tl.floor(parity * 0.5)
    halved = (coords - parity[:, None]) * 0.5  # exact: an even integer halved
    # mod K/2: q lies in [-K/2, K/2] and the point within 3 of it, so halved lies in [-K/2, K)
    half = tl.load(place + 3 * COORDS + cols)[None, :]
    digit = halved + tl.where(halved < 0.0, half, 0.0) - tl.where(halved >= half, half, 0.0)
    digit = tl.where(tl.load(place + 4 * COORDS + cols)[None, :] != 0.0, tl.floor(digit * 0.5), digit)
    stride = tl.load(place_stride_ptr + row * COORDS + cols)[None, :]
    index = parity.to(tl.int32) * half_memory + tl.sum(digit.to(tl.int32) * stride, axis=1)
    tl.store(index_ptr + row * TOPK + slots, index, mask=slot_ok)
    tl.store(weight_ptr + row * TOPK + slots, weight, mask=slot_ok)

    if READ:  # the rows, CHUNK at a time from the slots just written: fewer registers, fused multiply-adds
        tl.debug_barrier()
        value_cols = tl.arange(0, M_PAD)
        acc = tl.zeros((CHUNK, M_PAD), tl.float32)
        for chunk in tl.range(TOPK_PAD // CHUNK, num_stages=1):  # a loop, not unrolled: registers for one chunk
            part = chunk * CHUNK + tl.arange(0, CHUNK)
            part_ok = part < TOPK
            part_index = tl.load(index_ptr + row * TOPK + part, mask=part_ok, other=0).to(tl.int64)
            part_weight = tl.load(weight_ptr + row * TOPK + part, mask=part_ok, other=0.0)
            ok = part_ok[:, None] & (value_cols[None, :] < M)
            rows_v = tl.load(values_ptr + part_index[:, None] * M + value_cols[None, :], mask=ok, other=0.0)
            acc += part_weight[:, None] * rows_v.to(tl.float32)
        phi = tl.sum(acc, axis=0)
        tl.store(out_ptr + row * M + value_cols, (scale * phi).to(out_ptr.dtype.element_ty), mask=value_cols < M)


@triton.jit
def lram_lookup_bwd_kernel(
    x_ptr, values_ptr, grad_out_ptr, grad_x_ptr, grad_values_ptr, slot_weight_ptr, along_ptr,
    cand_ptr, index_ptr, zf_ptr, frame_ptr, scale_ptr,
    freq_ptr, points_ptr,
    M: tl.constexpr, M_PAD: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr,
    FROM_Q: tl.constexpr, GRAD_X: tl.constexpr, GRAD_VALUES_ATOMIC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, COORDS)
    slots = tl.arange(0, TOPK_PAD)
    slot_ok = slots < TOPK
    value_cols = tl.arange(0, M_PAD)
    value_ok = value_cols < M
    scale = tl.load(scale_ptr + row)
    zf = tl.load(zf_ptr + row * COORDS + cols)
    cand = tl.load(cand_ptr + row * TOPK + slots, mask=slot_ok, other=0).to(tl.int32)
    p = tl.load(points_ptr + cand[:, None] * COORDS + cols[None, :]).to(tl.float32)
    diff = zf[None, :] - p
    u = tl.where(slot_ok, tl.maximum(1.0 - tl.sum(diff * diff, axis=1) * 0.125, 0.0), 0.0)
    weight = (u * u) * (u * u)
    tl.store(slot_weight_ptr + row * TOPK + slots, scale * weight, mask=slot_ok)  # the segment sums read it
    tl.debug_barrier()
    # the rows, CHUNK at a time: a_k = g . v_k (through memory, back to one slot per lane) and the value gradient;
    # coalesced [CHUNK, m] tiles: a lane per slot issued fewer instructions but ran slower on an H200 (README)
    g = tl.load(grad_out_ptr + row * M + value_cols, mask=value_ok, other=0.0).to(tl.float32)
    for chunk in tl.range(TOPK_PAD // CHUNK, num_stages=1):
        part = chunk * CHUNK + tl.arange(0, CHUNK)
        part_ok = part < TOPK
        part_index = tl.load(index_ptr + row * TOPK + part, mask=part_ok, other=0).to(tl.int64)
        ok = part_ok[:, None] & value_ok[None, :]
        pointers = part_index[:, None] * M + value_cols[None, :]
        if GRAD_VALUES_ATOMIC:
            part_weight = tl.load(slot_weight_ptr + row * TOPK + part, mask=part_ok, other=0.0)
            tl.atomic_add(grad_values_ptr + pointers, part_weight[:, None] * g[None, :], mask=ok, sem="relaxed")
        if GRAD_X:
            rows_v = tl.load(values_ptr + pointers, mask=ok, other=0.0).to(tl.float32)
            tl.store(along_ptr + row * TOPK + part, tl.sum(rows_v * g[None, :], axis=1), mask=part_ok)
    if GRAD_X:
        tl.debug_barrier()
        along = tl.load(along_ptr + row * TOPK + slots, mask=slot_ok, other=0.0)
        # dL/dz_F / s: the scale enters below as a ratio, so no product of it over- or underflows
        grad_zf = -tl.sum((along * (u * u * u))[:, None] * diff, axis=0)
        frame = tl.load(frame_ptr + row)
        position = (frame >> (3 * cols)) & 7
        sign = tl.where(((frame >> (24 + cols)) & 1) != 0, -1.0, 1.0)
        grad_q = sign * tl.sum(tl.where(position[:, None] == cols[None, :], grad_zf[None, :], 0.0), axis=1)
        if FROM_Q:
            tl.store(grad_x_ptr + row * COORDS + cols, scale * grad_q)
        else:
            grad_scale = tl.sum(weight * along, axis=0)  # dL/ds = g . phi
            # through memory, so that the torus part runs one coordinate per lane (see the forward)
            tl.store(grad_x_ptr + row * (2 * COORDS) + cols, grad_q)
            tl.debug_barrier()
            grad_q = tl.load(grad_x_ptr + row * (2 * COORDS) + cols)
            tl.debug_barrier()
            # on w = z / c as the forward (naive.torus_query): with rho_i = max(|w_i|, 2^-63), (cos_i, sin_i) the
            # direction of w_i and r_i = s / (c rho_i) <= 1, ds/d(re_i, im_i) = r_i^2 (cos_i, sin_i) and
            # s dq_i/d(re_i, im_i) = s K_i/(2 pi) (-sin_i, cos_i) / (c rho_i): bounded for every finite z
            re, im, c, valid = _head_inputs(x_ptr, row, cols)
            squared = re * re + im * im
            lift = squared < TINY
            re = tl.where(lift, re * LIFT, re)
            im = tl.where(lift, im * LIFT, im)
            lifted = re * re + im * im
            direction = tl.math.rsqrt(tl.where(lifted == 0.0, 1.0, lifted))
            cos = tl.where(lifted == 0.0, 1.0, re * direction)
            sin = im * direction
            inverse_rho = tl.where(lift, FLOOR_INVERSE, direction)
            ratio = inverse_rho * tl.fdiv(1.0, tl.sum(inverse_rho, axis=0))
            radial = grad_scale * ratio * ratio
            angular = grad_q * tl.load(freq_ptr + cols) * ratio
            grad_re = tl.where(valid, radial * cos - angular * sin, 0.0)
            grad_im = tl.where(valid, radial * sin + angular * cos, 0.0)
            tl.store(grad_x_ptr + row * (2 * COORDS) + cols, grad_re)
            tl.store(grad_x_ptr + row * (2 * COORDS) + COORDS + cols, grad_im)


@triton.jit
def _per_group(x, PARTS_FIRST: tl.constexpr):
    """A [GROUPS] value of each stretch's entry, broadcast over the parts and columns of its row."""
    if PARTS_FIRST:
        return x[None, :, None]
    else:
        return x[:, None, None]


@triton.jit
def lram_lookup_segment_sum_kernel(
    sorted_index_ptr, order_ptr, slot_weight_ptr, grad_out_ptr, target_ptr, grad_values_ptr, record_ptr, n_entries,
    M: tl.constexpr, PARTS: tl.constexpr, PART: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr,
    GROUPS: tl.constexpr, PARTS_FIRST: tl.constexpr, COMPACT: tl.constexpr, WIDE: tl.constexpr,
):
    """Sums s u^4 g over the runs of equal memory index in one block of the sorted (row, slot) entries, in one
    pass over them: the block is cut into GROUPS stretches of consecutive entries, each summed in order by its
    own lanes (4 columns of each of the row's PARTS parts a lane), so that no sum crosses lanes; each step adds
    one entry per stretch and writes the sum where a run (or its part in the stretch) ends.

    What a step needs of its entry (the gradient row, the weight, where its sum goes and how) is found first for
    the whole block, one entry per lane, and kept as a record of 4 int32 in record_ptr for the steps to read.
    A run that starts and ends in the stretch is stored (its row has no other writer); one cut by the stretch's
    edge is added atomically, so the dense gradient must start at zero. WIDE: offsets into grad_out or
    grad_values may pass 2^31 (int64 arithmetic)."""
    STEPS: tl.constexpr = BLOCK // GROUPS
    ALIGN: tl.constexpr = M & -M  # the offsets are multiples of M: of its largest power-of-two factor
    # one entry per lane (scalar loads: one layout for all, no shuffles between them)
    entries = tl.program_id(0) * BLOCK + tl.max_contiguous(tl.arange(0, BLOCK), 1)
    ok = entries < n_entries
    index = tl.load(sorted_index_ptr + entries, mask=ok, other=-1)
    following = tl.load(sorted_index_ptr + entries + 1, mask=entries + 1 < n_entries, other=-1)
    # the entry before the stretch: a run of its index began before the stretch (its part here is added)
    before = entries - entries % STEPS - 1
    outside = tl.load(sorted_index_ptr + before, mask=(before >= 0) & ok, other=-1)
    entry = tl.load(order_ptr + entries, mask=ok, other=0).to(tl.int32)  # < 2^31: index is int32
    weight = tl.load(slot_weight_ptr + entry, mask=ok, other=0.0)
    row = (entry.to(tl.uint32) // TOPK).to(tl.int32)  # unsigned: a shift where TOPK is a power of two
    ends = index != following
    last = ends | (entries % STEPS == STEPS - 1)  # the run, or its part in the stretch, ends here
    mode = tl.where(ok & last, tl.where(ends & (index != outside), 1, 2), 0)  # 1: store, 2: add atomically
    target = tl.load(target_ptr + entries, mask=ok, other=0) if COMPACT else index
    record = record_ptr + entries * 4
    tl.store(record, row if WIDE else row * M)  # WIDE: the row, else its offset
    tl.store(record + 1, weight.to(tl.int32, bitcast=True))
    tl.store(record + 2, target if WIDE else target * M)
    tl.store(record + 3, mode)
    tl.debug_barrier()  # the records were written by other lanes

    firsts = tl.program_id(0) * BLOCK + tl.arange(0, GROUPS) * STEPS  # each stretch's first entry
    # a lane holds 4 columns in each of the row's PARTS parts: the gradient's loads and the sums' stores share
    # one layout (4 values a lane, whatever the gradient's dtype), and a step's per-entry work serves them all
    VECTOR: tl.constexpr = min(PART, 4)
    cols = tl.max_contiguous(tl.multiple_of(tl.arange(0, PART), VECTOR), VECTOR)
    if PARTS_FIRST:  # [PARTS, GROUPS, PART] or [GROUPS, PARTS, PART]: see _segment_sum
        value_cols = tl.arange(0, PARTS)[:, None, None] * PART + cols[None, None, :]
        total = tl.zeros((PARTS, GROUPS, PART), tl.float32)
    else:
        value_cols = tl.arange(0, PARTS)[None, :, None] * PART + cols[None, None, :]
        total = tl.zeros((GROUPS, PARTS, PART), tl.float32)
    value_ok = value_cols < M
    grad_cols = grad_out_ptr + value_cols  # each lane's columns: a step adds the row's offset
    target_cols = grad_values_ptr + value_cols
    for step in tl.static_range(STEPS):
        record = record_ptr + (firsts + step) * 4
        at = tl.load(record)  # entries past n_entries: row 0 with weight 0, nothing written
        at = at.to(tl.int64) * M if WIDE else tl.multiple_of(at, ALIGN)
        weight = tl.load(record + 1).to(tl.float32, bitcast=True)
        target = tl.load(record + 2)
        target = target.to(tl.int64) * M if WIDE else tl.multiple_of(target, ALIGN)
        mode = _per_group(tl.load(record + 3), PARTS_FIRST)
        grad = tl.load(grad_cols + _per_group(at, PARTS_FIRST), mask=value_ok, other=0.0)
        if grad_out_ptr.dtype.element_ty == tl.bfloat16:  # the bits shifted into place: no conversion
            grad = (grad.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        total += _per_group(weight, PARTS_FIRST) * grad.to(tl.float32)
        pointers = target_cols + _per_group(target, PARTS_FIRST)
        tl.store(pointers, total, mask=(mode == 1) & value_ok)
        tl.atomic_add(pointers, total, mask=(mode == 2) & value_ok, sem="relaxed")
        total = tl.where(mode != 0, 0.0, total)


# ---------------------------------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------------------------------

_TABLES: dict = {}


def _tables(K, device):
    """Device tables: K/(2 pi), half periods, index strides, points transposed (fp32), |p|^2, points (int16)."""
    key = (K, str(device))
    if key not in _TABLES:
        points = FUNDAMENTAL_POINTS
        n = points.shape[0]
        points_t = torch.zeros(DIM, POINTS_PAD, dtype=torch.float32)
        points_t[:, :n] = points.T.float()
        norms = torch.full((POINTS_PAD,), PADDING_D2, dtype=torch.float32)
        norms[:n] = (points**2).sum(-1).float()
        points16 = torch.zeros(POINTS_PAD, DIM, dtype=torch.int16)
        points16[:n] = points.to(torch.int16)
        periods = torch.tensor(K, dtype=torch.float32)
        _TABLES[key] = tuple(t.to(device) for t in (
            periods / (2 * math.pi),  # as naive.torus_query computes it
            torch.tensor([k // 2 for k in K], dtype=torch.int32),
            torch.tensor(index_strides(K), dtype=torch.int32),
            points_t, norms, points16))
    return _TABLES[key]


def _check(x: torch.Tensor, K, topk: int, width: int, values: torch.Tensor | None = None):
    K = check_torus(K)
    what = "queries must have 8 coordinates" if width == DIM else "each head needs 16 inputs (re_1..re_8, im_1..im_8)"
    if x.shape[-1] != width:
        raise ValueError(f"{what} in the last dimension, got shape {tuple(x.shape)}")
    if not 1 <= topk <= FUNDAMENTAL_POINTS.shape[0]:
        raise ValueError(f"topk must be in [1, {FUNDAMENTAL_POINTS.shape[0]}], got {topk}")
    if memory_size(K) >= 2**31:
        raise ValueError(f"the torus {K} has {memory_size(K)} locations; the kernels index at most 2^31 - 1")
    if values is not None:
        if values.dim() != 2 or values.shape[0] != memory_size(K):
            raise ValueError(f"values must be [{memory_size(K)}, m] for the torus {K}, got {tuple(values.shape)}")
        if values.device != x.device:
            raise ValueError(f"values on {values.device} but queries on {x.device}; move them to one device")
    return K


def _meta(topk, M):
    # the value width is a compile-time constant: when it is a power of two the row loads carry no mask
    return dict(M=M, M_PAD=triton.next_power_of_2(max(M, 1)), TOPK=topk, TOPK_PAD=triton.next_power_of_2(topk))


def first_probe(topk):
    """The threshold search's first probe: the d2 below which topk + 1/2 points lie on average."""
    return ((topk + 0.5) / POINTS_PER_T4) ** 0.25


def lookup_fwd(x_rows, values, K, topk, from_q, read, save, out_dtype=torch.float32):
    """Launch the forward kernel; returns its buffers (out, cand, index, weight, zf, frame, scale).

    values is None when not `read`; zf, frame and scale are None when not `save` (nothing for a backward).
    """
    n, device = x_rows.shape[0], x_rows.device
    M = values.shape[1] if read else 0
    freq, half_periods, strides, points_t, norms, points16 = _tables(K, device)
    out = torch.empty(n, M, dtype=out_dtype, device=device)
    cand = torch.empty(n, topk, dtype=torch.int16, device=device)
    index = torch.empty(n, topk, dtype=torch.int32, device=device)  # saved for the backward, or scratch
    weight = torch.empty(n, topk, dtype=torch.float32, device=device)  # the lookup's result, or scratch
    zf = torch.empty(n, DIM, dtype=torch.float32, device=device) if save else None
    frame = torch.empty(n, dtype=torch.int32, device=device) if save else None
    scale = torch.empty(n, dtype=torch.float32, device=device) if save else None
    place = torch.empty(n, 6 * DIM, dtype=torch.float32, device=device)  # scratch: the frame, by place
    place_stride = torch.empty(n, DIM, dtype=torch.int32, device=device)
    if n:
        lram_lookup_fwd_kernel[(n,)](
            x_rows, values if read else None, out, cand, index, weight, zf, frame, scale, place, place_stride,
            freq, half_periods, strides, points_t, norms, points16, memory_size(K) // 2, first_probe(topk),
            CHUNK=min(4, triton.next_power_of_2(topk)), FROM_Q=from_q, READ=read, SAVE=save,
            num_warps=1, **_meta(topk, M), **({"maxnreg": REGISTERS} if read and not from_q else {}))
    return out, cand, index, weight, zf, frame, scale


def lookup_bwd(x_rows, values, grad_rows, cand, index, zf, frame, scale, K, topk, from_q, need_x, value_grad):
    """Launch the backward kernels; returns (grad_x fp32 or None, grad_values, slot_weight s u^4 [n, topk]).

    value_grad: "atomic" or "segment" give the dense fp32 value gradient [N, m]; "sparse" gives (the memory
    indices read, rising; their [U, m] fp32 sums); "none" gives None.
    """
    n, M = x_rows.shape[0], values.shape[1]
    atomic = value_grad == "atomic"
    grad_x = torch.empty(x_rows.shape, dtype=torch.float32, device=x_rows.device) if need_x else None
    dense = value_grad in ("atomic", "segment")
    grad_values = torch.zeros(values.shape, dtype=torch.float32, device=values.device) if dense else None
    slot_weight = torch.empty(n, topk, dtype=torch.float32, device=x_rows.device)
    along = torch.empty(n, topk, dtype=torch.float32, device=x_rows.device) if need_x else None  # g . v_k
    freq, _, _, _, _, points16 = _tables(K, x_rows.device)
    if n and (need_x or value_grad != "none"):
        lram_lookup_bwd_kernel[(n,)](
            x_rows, values if need_x else None, grad_rows, grad_x, grad_values if atomic else None, slot_weight,
            along, cand, index, zf, frame if need_x else None, scale, freq, points16,
            CHUNK=min(8, triton.next_power_of_2(topk)), FROM_Q=from_q, GRAD_X=need_x, GRAD_VALUES_ATOMIC=atomic,
            num_warps=1, maxnreg=REGISTERS, **_meta(topk, M))
    if value_grad in ("segment", "sparse"):
        grad_values = _segment_sum(grad_rows, index, slot_weight, grad_values, topk, values.shape)
    return grad_x, grad_values, slot_weight


# ---------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile) and autograd
# ---------------------------------------------------------------------------------------------------

@torch.library.custom_op("lram_gpt::lookup_fwd", mutates_args=())
def _lookup_fwd_op(x_rows: torch.Tensor, values: torch.Tensor, K: list[int], topk: int, from_q: bool, save: bool,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor]:
    out, cand, index, _, zf, frame, scale = lookup_fwd(x_rows, values, tuple(K), topk, from_q, True, save, out_dtype)
    if not save:  # a custom op returns tensors, none aliasing another: empty ones stand for nothing saved
        zf, frame, scale = (x_rows.new_empty(0) for _ in range(3))
    return out, cand, index, zf, frame, scale


@_lookup_fwd_op.register_fake
def _(x_rows, values, K, topk, from_q, save, out_dtype):
    n = x_rows.shape[0]
    saved = (x_rows.new_empty(n, DIM, dtype=torch.float32), x_rows.new_empty(n, dtype=torch.int32),
             x_rows.new_empty(n, dtype=torch.float32)) if save else (x_rows.new_empty(0),) * 3
    return (x_rows.new_empty(n, values.shape[1], dtype=out_dtype), x_rows.new_empty(n, topk, dtype=torch.int16),
            x_rows.new_empty(n, topk, dtype=torch.int32), *saved)


@torch.library.custom_op("lram_gpt::lookup_bwd", mutates_args=())
def _lookup_bwd_op(x_rows: torch.Tensor, values: torch.Tensor, grad_rows: torch.Tensor, cand: torch.Tensor,
                   index: torch.Tensor, zf: torch.Tensor, frame: torch.Tensor, scale: torch.Tensor, K: list[int],
                   topk: int, from_q: bool, need_x: bool, value_grad: str) -> tuple[torch.Tensor, torch.Tensor]:
    grad_x, grad_values, _ = lookup_bwd(x_rows, values, grad_rows, cand, index, zf, frame, scale, tuple(K), topk,
                                        from_q, need_x, value_grad)
    empty = x_rows.new_empty(0, dtype=torch.float32)
    return (grad_x if need_x else empty), (grad_values if value_grad != "none" else empty)


@_lookup_bwd_op.register_fake
def _(x_rows, values, grad_rows, cand, index, zf, frame, scale, K, topk, from_q, need_x, value_grad):
    empty = x_rows.new_empty(0, dtype=torch.float32)
    return (x_rows.new_empty(x_rows.shape, dtype=torch.float32) if need_x else empty,
            values.new_empty(values.shape, dtype=torch.float32) if value_grad != "none" else empty)


class LookupFunction(torch.autograd.Function):
    """theta (from_q False: x holds the heads' 16 inputs) or phi (from_q True: x holds q) by the kernels."""

    @staticmethod
    def forward(ctx, x, values, K, topk, value_grad, sparse, from_q, out_dtype):
        x_rows = x.reshape(-1, x.shape[-1]).contiguous()
        if from_q:
            x_rows = x_rows.to(torch.float32)
        values_c = values.contiguous()
        save = any(ctx.needs_input_grad[:2])
        out, cand, index, zf, frame, scale = torch.ops.lram_gpt.lookup_fwd(x_rows, values_c, list(K), topk, from_q,
                                                                           save, out_dtype)
        ctx.save_for_backward(x_rows, values_c, cand, index, zf, frame, scale)
        ctx.K, ctx.topk, ctx.value_grad, ctx.sparse, ctx.from_q = K, topk, value_grad, sparse, from_q
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return out.view(*x.shape[:-1], values.shape[1])

    @staticmethod
    def backward(ctx, grad_out):
        x_rows, values, cand, index, zf, frame, scale = ctx.saved_tensors
        n, M = x_rows.shape[0], values.shape[1]
        grad_rows = grad_out.reshape(n, M).contiguous()
        need_x, need_values = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if need_values and ctx.sparse:  # a data-dependent row count: eager, as the sparse forward
            grad_x, (rows_read, sums), _ = lookup_bwd(x_rows, values, grad_rows, cand, index, zf, frame, scale,
                                                      ctx.K, ctx.topk, ctx.from_q, need_x, "sparse")
            grad_values = sparse_rows(rows_read.long(), sums.to(values.dtype), values.shape)
        else:
            grad_x, grad_values = torch.ops.lram_gpt.lookup_bwd(
                x_rows, values, grad_rows, cand, index, zf, frame, scale, list(ctx.K), ctx.topk, ctx.from_q,
                need_x, ctx.value_grad if need_values else "none")
            grad_values = grad_values.to(values.dtype) if need_values else None
        grad_x = grad_x.view(ctx.x_shape).to(ctx.x_dtype) if need_x else None
        return grad_x, grad_values, None, None, None, None, None, None


def _segment_sum(grad_rows, index, slot_weight, grad_values, topk, shape):
    """Value gradient without per-entry atomics: sort the (row, slot) entries by their int32 memory index, then
    each program sums the runs of one chunk. Into grad_values [N, M] (zeros); with grad_values None into a
    compact table: returns (the U memory indices read, rising; their [U, M] sums)."""
    sorted_index, order = torch.sort(index.reshape(-1))
    n_entries, M = sorted_index.shape[0], shape[1]
    compact = grad_values is None
    target = sorted_index
    if compact:
        starts = torch.ones_like(sorted_index, dtype=torch.bool)
        starts[1:] = sorted_index[1:] != sorted_index[:-1]
        target = (torch.cumsum(starts, 0, dtype=torch.int32) - 1)
        rows_read = sorted_index[starts]  # the one host synchronisation: the sparse tensor's size
        grad_values = torch.zeros(rows_read.shape[0], M, dtype=torch.float32, device=index.device)
    if n_entries:
        M_PAD = triton.next_power_of_2(max(M, 1))
        part = min(M_PAD, SEGMENT_PART)  # a row's part: PART / 4 lanes, 4 columns each
        blocks = triton.cdiv(n_entries, SEGMENT_BLOCK)
        record = torch.empty(blocks * SEGMENT_BLOCK, 4, dtype=torch.int32, device=index.device)  # scratch
        lram_lookup_segment_sum_kernel[(blocks,)](
            sorted_index, order, slot_weight, grad_rows, target, grad_values, record, n_entries,
            M=M, PARTS=M_PAD // part, PART=part, TOPK=topk, BLOCK=SEGMENT_BLOCK, GROUPS=min(SEGMENT_BLOCK, 128 // part),
            PARTS_FIRST=PARTS_FIRST, COMPACT=compact, WIDE=max(grad_rows.shape[0], shape[0]) * M >= 2**31, num_warps=1)
    return (rows_read, grad_values) if compact else grad_values


def _read(x, values, K, topk, value_grad, sparse, from_q, out_dtype):
    if sparse:
        return _read_sparse(x, values, K, topk, from_q, out_dtype)
    return LookupFunction.apply(x, values, K, topk, value_grad, False, from_q, out_dtype)


@torch.compiler.disable  # a data-dependent row count and a sparse gradient: torch.compile cannot trace them
def _read_sparse(x, values, K, topk, from_q, out_dtype):
    return LookupFunction.apply(x, values, K, topk, "segment", True, from_q, out_dtype)


def theta_triton(z: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK, value_grad: str = "atomic",
                 sparse: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """naive.theta by the kernels: torus query, lookup, harmonic scale and weighted read in one forward kernel.

    Args:
        z: heads [..., 16] (re_1..re_8, im_1..im_8), fp32, bf16 or fp16, on CUDA (or CPU under TRITON_INTERPRET=1).
        values: the memory [N, m], fp32 or bf16, N = memory_size(K).
        K: the 8 torus periods; topk: lattice points read per head.
        value_grad, sparse: see interpolate_triton.
        out_dtype: the output's dtype; None for the autocast dtype where autocast is on, else float32.
    Returns:
        [..., m] in out_dtype, differentiable in z and values.
    """
    K = _check(z, K, topk, HEAD_INPUTS, values)
    check_value_grad(value_grad)
    if out_dtype is None:
        device_type = z.device.type
        out_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32
    return _read(z, values, K, topk, value_grad, sparse, False, out_dtype)


def interpolate_triton(q: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK,
                       value_grad: str = "atomic", sparse: bool = False) -> torch.Tensor:
    """phi(q) by the kernels (naive.interpolate is the reference).

    Args:
        q: queries [..., 8] in lattice coordinates; values: the memory [N, m], fp32 or bf16.
        K: the 8 torus periods; topk: lattice points read per query.
        value_grad: how a dense value gradient is accumulated, "atomic" (relaxed atomic adds) or "segment"
            (sort by memory index, then sums of runs).
        sparse: the value gradient is a coalesced sparse COO tensor of the rows read (always by the segment
            sums), as nn.Embedding(sparse=True).
    Returns:
        fp32 [..., m], differentiable in q and values.
    """
    K = _check(q, K, topk, DIM, values)
    check_value_grad(value_grad)
    return _read(q, values, K, topk, value_grad, sparse, True, torch.float32)


@torch.compiler.disable
@torch.no_grad()
def lookup_triton(q: torch.Tensor, K, topk: int = DEFAULT_TOPK):
    """naive.lookup by the kernel: (index int64 [..., topk], weight fp32 [..., topk]), falling weight."""
    K = _check(q, K, topk, DIM)
    q_rows = q.reshape(-1, DIM).to(torch.float32).contiguous()
    _, _, index, weight, _, _, _ = lookup_fwd(q_rows, None, K, topk, True, False, False)
    # slots come in point order, so a stable sort by falling weight orders equal weights as the reference
    weight, order = torch.sort(weight, dim=-1, descending=True, stable=True)
    index = index.long().gather(-1, order)
    return index.view(*q.shape[:-1], topk), weight.view(*q.shape[:-1], topk)


# ---------------------------------------------------------------------------------------------------
# What scripts/kernel_cost.py needs: the selection's trip count, lookups per program, bytes per lookup
# ---------------------------------------------------------------------------------------------------

def threshold_probes(q: torch.Tensor, topk: int = DEFAULT_TOPK):
    """The forward's threshold search in torch, for queries q [n, 8]: how many counts the kernel's loop makes,
    and whether it ended on an exact tie (then the tie loop makes 8 more). The kernel divides by an approximate
    rsqrt: its guesses may differ in their last bits, so this is a model of its trip count, not a replay."""
    from projects.lram_gpt.lattice import to_fundamental

    zf = to_fundamental(q.float())[0]
    points = FUNDAMENTAL_POINTS.float()
    d2 = (points**2).sum(-1) + ((zf * zf).sum(-1, keepdim=True) - 2 * zf @ points.T)
    n = q.shape[0]
    lo, hi = torch.zeros(n), torch.full((n,), PROBE_CEILING.value)
    count_lo, count_hi = torch.zeros(n), torch.full((n,), float(POINTS_PAD))
    t = torch.full((n,), first_probe(topk))
    probes = torch.zeros(n, dtype=torch.long)
    active = torch.ones(n, dtype=torch.bool)
    tie = torch.zeros(n, dtype=torch.bool)
    while active.any():
        count = (d2 < t[:, None]).sum(-1).float()
        probes += active
        below, above = active & (count < topk), active & (count > topk)
        lo, count_lo = torch.where(below, t, lo), torch.where(below, count, count_lo)
        hi, count_hi = torch.where(above, t, hi), torch.where(above, count, count_hi)
        lo4, hi4 = lo**4, hi**4
        ceiling = count_hi == POINTS_PAD
        span = torch.where(ceiling, lo4, hi4 - lo4)
        gap = torch.where(ceiling, count_lo, count_hi - count_lo)
        guess = (lo4 + (topk + 0.5 - count_lo) * span / gap).sqrt().sqrt()
        middle = 0.5 * (lo + hi)
        guess = torch.where((probes % BISECT_EVERY.value == 0) | ~((guess > lo) & (guess < hi)), middle, guess)
        stalled = active & (count != topk) & ((guess <= lo) | (guess >= hi))
        tie |= stalled
        active = active & (count != topk) & ~stalled
        t = torch.where(active, guess, t)
    return probes, tie


def cost_spec(kernel, constants, signature, spec):
    """For scripts/kernel_cost.py: lookups per program, loop trip counts and bytes per lookup of a launch."""
    value_bytes = {"*bf16": 2, "*fp16": 2}.get(signature.get("values_ptr"), 4)
    topk = constants.get("TOPK", 0)
    m = constants.get("M_PAD", constants.get("PARTS", 0) * constants.get("PART", 0))  # the segment sums' M_PAD
    if kernel == "lram_lookup_fwd_kernel":
        # the threshold search's mean trip count over uniform random queries (seeded)
        generator = torch.Generator().manual_seed(0)
        q = (torch.rand(4096, DIM, generator=generator) * 2 - 1) * 16
        probes, tie = threshold_probes(q, topk)
        probes, tie_trips = probes.float().mean().item(), 8 * tie.float().mean().item()
        read = topk * m * value_bytes if constants["READ"] else 0
        moved = read + 16 * 4 + m * 2 + topk * (2 + 4 * constants["SAVE"]) + 40 * constants["SAVE"]
        trips = [probes, tie_trips] + [triton.next_power_of_2(topk) // constants["CHUNK"]] * constants["READ"]
        return spec(1, trips, moved, f"loops: mean {probes:.2f} probes, {tie_trips:.3f} tie steps "
                                                   f"over 4096 random queries")
    if kernel == "lram_lookup_bwd_kernel":
        moved = topk * m * value_bytes * constants["GRAD_X"] + topk * m * 4 * constants["GRAD_VALUES_ATOMIC"]
        moved += 16 * 8 + m * 2 + topk * 6 + 40 + topk * 4 * (1 + constants["GRAD_X"])
        return spec(1, [triton.next_power_of_2(topk) // constants["CHUNK"]], moved,
                    f"a lookup: one head reading its {topk} rows of m = {m} values")
    if kernel == "lram_lookup_segment_sum_kernel":  # per lookup: its TOPK entries; a row's gradient written ~once
        per_entry = m * 4 + 4 + 8 + 4 + 4 * constants["COMPACT"] + 16  # 16: the entry's record, written once
        return spec(constants["BLOCK"] / topk, [], topk * per_entry + topk * m * 4,
                    "a block of entries summed in stretches, one entry per stretch a step (straight-line code)")
    return None
