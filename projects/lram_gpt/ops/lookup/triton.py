"""Triton kernels for the lattice memory read (naive.theta and naive.interpolate are the references).

The forward is two kernels. The frame kernel serves 32 lookups (a token's head each) a program, a lookup per
lane, so its per-lookup scalar work costs a 32nd of a warp's:
1. torus query (fused): the head's 16 inputs z give the harmonic scale s and q_i = K_i / (2 pi) arg z_i
   (arg by a polynomial: the interpreter has no atan2), computed on z / c for a power of two c near the
   head's largest input, so that forward and backward are finite and right for every finite z (as
   naive.torus_query); or q is given (interpolate_triton, lookup_triton).
   A head with a NaN or infinite input (a given q: also one beyond +-2^22) is read at q = 0 with s = NaN: its
   output is NaN, the value gradient NaN in the rows it read, its z gradient 0; no row outside [0, N) is
   ever read or written, and no check stops the GPU to look (tests/lram_gpt/test_lookup.py).
2. the nearest lattice point c and the signed permutation into the fundamental region F (paper 2.6): z_F,
   and by place what step 5 needs of c, the signs and the torus (the `place` scratch), and the first probe
   of step 4 (first_probe_model, a quadratic in z_F).
The read kernel serves one lookup a program of one warp:
3. d2 = |z_F - p|^2 for the candidate points p (lattice.candidate_points: the 82 of the 232
   FUNDAMENTAL_POINTS that can be among the 32 nearest), 32 lanes x 4.
4. the exact top-k by a threshold search on the count of d2 below it (warp reductions, no sort): the next
   probes interpolate the count as a function of d2^4 (a ball's volume), every fourth probe bisects; it stops
   when exactly k lie below. If two candidates share the boundary's d2 exactly, the earlier point wins, as in
   the reference's stable sort. The chosen candidates are written compacted (prefix sum) to a per-slot buffer.
5. per slot (one lane each): the lattice point, its memory index (int32, from masks and multiply-adds) and
   weight u^4, u = 1 - d2/8.
6. the weighted sum of the k value rows (fp32, or bf16 read as words of two: fp32 accumulation), 4 rows at a
   time (each a coalesced [4, m] tile), scaled by s and written in the output dtype (fused cast).
The forward saves what the backward needs (per slot the memory index, the candidate and u^4; per lookup z_F, the
permutation and signs packed in one int32, and s), so the backward does not select again. It is two kernels. The
rows kernel serves one lookup a program of one warp: it gathers the k rows once, CHUNK at a time (4 lanes a row,
4 columns of each of its 16-column parts a lane, so that a_k is summed in the lane but for two shuffles), for
    a_k = g . v_k                                    (written per slot for the query kernel)
    dL/dv_k += s u_k^4 g                             by relaxed atomics ("atomic"), or without per-entry atomics
                                                     ("segment"): entries sorted by int32 memory index, each
                                                     block of 64 sorted entries is cut in 8 stretches of 8
                                                     that 4 lanes each sum in order (one pass over the runs,
                                                     no value crossing lanes; where each entry's sum goes is
                                                     found once per block, a lane per entry) and store, runs
                                                     cut by a stretch's edge are added atomically. No host
                                                     synchronisation on the dense path.
The query kernel serves 32 lookups a program, one per lane (as the frame kernel), and sums over the slots in the
lane
    dL/dz_F = -s sum_k a_k u_k^3 (z_F - p_k)        (mapped back to q, then through the torus query)
    dL/ds   = sum_k u_k^4 a_k
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
    candidate_points,
    check_torus,
    index_strides,
    memory_size,
)

HEAD_INPUTS = 2 * DIM
MAGIC = tl.constexpr(1.5 * 2.0**23)  # an fp32 in [2^23, 2^24) holds an integer in its low bits
PLACE = tl.constexpr(6 * DIM)  # int32 per lookup that the frame kernel writes for the forward
FRAME_BLOCK = 32  # lookups per program of the frame kernel: a row each
QUERY_UNROLL = 2  # slots a trip of the query kernel's loop; the 4 that LLVM chose unasked spilled registers
SEGMENT_BLOCK = 64  # sorted (row, slot) entries per program of the segment sums
SEGMENT_PART = 16  # columns of a row part (segment sums, backward rows): 4 lanes, 4 each; 128 // 16 stretches summed
# The segment sums' lanes should run over the stretches and each hold all parts of its row: of two dimensions with
# the same (unit) stride Triton 3.8 and 3.9 give the lanes to the inner one, 3.6 to the outer one
# (scripts/kernel_cost.py: 388 against 516 warp-instructions per lookup), so the parts go outside the stretches
# from 3.8 on (3.7 unseen)
PARTS_FIRST = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 8)
# Registers per thread: a one-warp program at 64 lets an SM hold 32 of them (its most), 50% occupancy (sm_80,
# sm_90). ptxas meets the cap without spilling (scripts/kernel_cost.py counts LDL/STL) for the frame kernel,
# theta's read and every backward; the read from lattice coordinates (interpolate_triton, lookup_triton) goes
# uncapped.
REGISTERS = 64
COORDS = tl.constexpr(DIM)  # compiled kernels may read a global only if it is a constexpr
BISECT_EVERY = tl.constexpr(4)  # every 4th probe bisects, so that the search ends whatever the model's error
PROBE_CEILING = tl.constexpr(40.0)  # above every candidate's d2 (|z_F| <= 2, |p| <= 4), below the padding's
PADDING_D2 = 1e30
TINY = tl.constexpr(torch.finfo(torch.float32).tiny)  # 2^-126; w_i is read at least sqrt(TINY) = 2^-63 from 0
FLOOR_INVERSE = tl.constexpr(2.0**63)
LIFT = tl.constexpr(2.0**64)
INFINITY = tl.constexpr(float("inf"))
Q_LIMIT = tl.constexpr(2.0**22)  # lattice coordinates beyond it (4 million periods) read as NaN: see the frame kernel
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
    """Nearest point of D8 to each row y [..., 8] (Conway & Sloane): round, then fix an odd sum at the worst
    coordinate."""
    rounded = tl.floor(y + 0.5)
    residual = y - rounded
    # the parity of the sum and the first coordinate of the largest |residual| by integer reductions (|y| < 2^22,
    # so rounded fits an int32; a float >= 0 orders as its bits)
    odd = (tl.sum(rounded.to(tl.int32), axis=-1, keep_dims=True) & 1) != 0
    size = tl.abs(residual).to(tl.int32, bitcast=True)
    worst = tl.min(tl.where(size == tl.max(size, axis=-1, keep_dims=True), cols, COORDS), axis=-1, keep_dims=True)
    step = tl.where(residual >= 0.0, 1.0, -1.0)
    return rounded + tl.where(cols == worst, tl.where(odd, step, 0.0), 0.0)


@triton.jit
def _columns(x):
    """The columns of x [rows, 1, 2, 4 or 8] (each lane holds a row: no value moves), column 0 first, the others
    in an order of their own."""
    ROWS: tl.constexpr = x.shape[0]
    WIDTH: tl.constexpr = x.shape[1]
    if WIDTH == 8:
        even, odd = tl.split(tl.reshape(x, (ROWS, 4, 2)))
        a, b = tl.split(tl.reshape(even, (ROWS, 2, 2)))
        c, d = tl.split(tl.reshape(odd, (ROWS, 2, 2)))
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        c0, c1 = tl.split(c)
        d0, d1 = tl.split(d)
        return a0, a1, b0, b1, c0, c1, d0, d1
    elif WIDTH == 4:
        even, odd = tl.split(tl.reshape(x, (ROWS, 2, 2)))
        a0, a1 = tl.split(even)
        b0, b1 = tl.split(odd)
        return a0, a1, b0, b1
    elif WIDTH == 2:
        a0, a1 = tl.split(x)
        return a0, a1
    else:
        return (tl.reshape(x, (ROWS, )), )


@triton.jit
def _scaled_head(re, im):
    """Heads' 16 inputs re, im [..., 8] as w = z / c (naive.head_scale: c a power of two, so w is exact and at most
    2 in size, whatever finite z is), and whether all 16 are finite: (re, im, c, valid), reductions over the last
    axis."""
    finite = (tl.abs(re) < INFINITY) & (tl.abs(im) < INFINITY)  # NaN compares false
    valid = tl.sum(finite.to(tl.int32), axis=-1, keep_dims=True) == COORDS
    largest = tl.max(tl.maximum(tl.abs(re), tl.abs(im)), axis=-1, keep_dims=True)
    # c = 2^e from the exponent bits, within [2^-126, 2^126] so that 1/c is a normal float too
    exponent = tl.minimum(tl.maximum(largest.to(tl.int32, bitcast=True) & 0x7F800000, 1 << 23), 253 << 23)
    inverse = ((254 << 23) - exponent).to(tl.float32, bitcast=True)
    return re * inverse, im * inverse, exponent.to(tl.float32, bitcast=True), valid


@triton.jit
def _rows_of(ptr, rows, STRIDE: tl.constexpr, OFFSET: tl.constexpr):
    """[BLOCK, 8]: ptr[rows * STRIDE + OFFSET + k], k < 8, for rows [BLOCK]; each column loaded on its own and
    the 8 joined, so that a lane holds a row (a [BLOCK, 8] load would spread a row over lanes)."""
    row_ptr = ptr + rows * STRIDE + OFFSET
    c0, c1, c2, c3 = tl.load(row_ptr), tl.load(row_ptr + 1), tl.load(row_ptr + 2), tl.load(row_ptr + 3)
    c4, c5, c6, c7 = tl.load(row_ptr + 4), tl.load(row_ptr + 5), tl.load(row_ptr + 6), tl.load(row_ptr + 7)
    return _joined(c0, c1, c2, c3, c4, c5, c6, c7)


@triton.jit
def _rows_at(ptr, position):
    """[BLOCK, 8]: ptr[b][position[b, i]] for pointers ptr [BLOCK] and a row per lane (_rows_of's gather)."""
    p0, p4, p2, p6, p1, p5, p3, p7 = _columns(position)
    return _joined(tl.load(ptr + p0), tl.load(ptr + p1), tl.load(ptr + p2), tl.load(ptr + p3), tl.load(ptr + p4),
                   tl.load(ptr + p5), tl.load(ptr + p6), tl.load(ptr + p7))


@triton.jit
def _joined(c0, c1, c2, c3, c4, c5, c6, c7):
    """[BLOCK, 8] of 8 columns [BLOCK], a row per lane."""
    # join adds a last dimension: [b, x, y, z] = c_{4x + 2y + z}
    joined = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(joined, (c0.shape[0], COORDS))


@triton.jit
def _ahead(size_j, j: tl.constexpr, size, cols):
    """1 where coordinate j (its |offset| size_j [BLOCK]) comes before coordinate i of size [BLOCK, 8] in the
    frame's order: larger, or as large and earlier."""
    size_j = size_j[:, None]
    return ((size_j > size) | ((size_j == size) & (j < cols))).to(tl.int32)


@triton.jit
def _store_by_place(ptr, position, value):
    """ptr[position[b, i]] = value[b, i] for pointers ptr [BLOCK] and a row per lane: a store per column (a
    [BLOCK, 8] store would spread the rows over lanes, and everything computed before it with them)."""
    places = _columns(position)
    values = _columns(value)
    for column in tl.static_range(COORDS):
        tl.store(ptr + places[column], values[column])


@triton.jit
def _torus_query(re, im, freq):
    """Harmonic scale and lattice coordinates q [BLOCK, 8] of heads' inputs re, im [BLOCK, 8], as
    naive.torus_query (freq: K_i / (2 pi)); a head with a non-finite input gets q = 0 and scale NaN."""
    re, im, c, valid = _scaled_head(re, im)
    squared = re * re + im * im
    scale = c * tl.fdiv(1.0, tl.sum(tl.math.rsqrt(tl.maximum(squared, TINY)), axis=-1, keep_dims=True))
    # a w_i below the floor (sqrt(tiny)): its angle from w_i * 2^64 (exact), where no division flushes it; _atan2
    # gives 0 at w_i = 0 as the reference (no test of squared == 0 here: below ~1e-19 it underflows for w_i != 0)
    lift = tl.where(squared < TINY, LIFT, 1.0)
    angle = _atan2(im * lift, re * lift)
    q = tl.where(valid, angle * freq, 0.0)
    # inf - inf is NaN: a NaN global would break the JIT's cache check (NaN != NaN)
    return tl.where(valid, scale, INFINITY - INFINITY), q


@triton.jit
def lram_lookup_frame_kernel(
    x_ptr, zf_ptr, frame_ptr, scale_ptr, place_ptr, freq_ptr, half_periods_ptr, strides_ptr, probe_ptr, n_rows,
    BLOCK: tl.constexpr, FROM_Q: tl.constexpr, POW2: tl.constexpr,
):
    """Steps 1-2 for a block of lookups, a lane each holding its 8 coordinates: the torus query (or the given q),
    the nearest lattice point and the signed permutation into F; writes z_F, the packed frame and the scale, and
    into `place` by place what the read kernel needs: c mod K, the signs, masks, multipliers and K (step 5),
    |z_F|^2 and the first probe (steps 3-4)."""
    block = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # the block's tail reads row 0 and writes to the buffers' padding rows (no masks: fewer registers)
    source = tl.where(block < n_rows, block, 0).to(tl.int64)
    block = block.to(tl.int64)
    cols = tl.arange(0, COORDS)[None, :]
    every = tl.zeros((BLOCK, ), tl.int32)  # the tables' 8 values on every row (each lane holds a row)
    half = _rows_of(half_periods_ptr, every, 0, 0)
    if FROM_Q:
        q = _rows_of(x_ptr, source, COORDS, 0).to(tl.float32)
        # beyond Q_LIMIT (or NaN, inf) the reduction below would not be exact: read at 0 with scale NaN
        valid = tl.sum((tl.abs(q) <= Q_LIMIT).to(tl.int32), axis=-1, keep_dims=True) == COORDS
        q = tl.where(valid, q, 0.0)
        # into [-K/2, K/2] (exactly: minus an integer), as the torus query's are; a lattice translation
        period = 2.0 * half.to(tl.float32)
        q = q - period * tl.floor(q * tl.fdiv(1.0, period) + 0.5)
        scale = tl.where(valid, 1.0, INFINITY - INFINITY)  # NaN
    else:
        re = _rows_of(x_ptr, source, 2 * COORDS, 0).to(tl.float32)
        im = _rows_of(x_ptr, source, 2 * COORDS, COORDS).to(tl.float32)
        scale, q = _torus_query(re, im, _rows_of(freq_ptr, every, 0, 0))

    # nearest lattice point: the nearer of the nearest points of the cosets 2*D8 and 2*D8 + 1
    even = 2.0 * _nearest_d8(q * 0.5, cols)
    odd = 2.0 * _nearest_d8((q - 1.0) * 0.5, cols) + 1.0
    d_even = tl.sum((q - even) * (q - even), axis=-1, keep_dims=True)
    d_odd = tl.sum((q - odd) * (q - odd), axis=-1, keep_dims=True)
    center = tl.where(d_odd < d_even, odd, even)
    offset = q - center
    # coordinate i moves to place position[i] (falling |offset|, ties in coordinate order) with sign[i]; an odd
    # count of negative signs flips the last place too, so the sign changes are even
    size = tl.abs(offset)
    s0, s4, s2, s6, s1, s5, s3, s7 = _columns(size)
    position = (_ahead(s0, 0, size, cols) + _ahead(s1, 1, size, cols) + _ahead(s2, 2, size, cols)
                + _ahead(s3, 3, size, cols) + _ahead(s4, 4, size, cols) + _ahead(s5, 5, size, cols)
                + _ahead(s6, 6, size, cols) + _ahead(s7, 7, size, cols))
    negative = offset < 0.0
    odd_negatives = (tl.sum(negative.to(tl.int32), axis=-1, keep_dims=True) & 1) != 0
    flipped = negative != ((position == COORDS - 1) & odd_negatives)
    zf = tl.where(flipped, -offset, offset)
    # the memory index of a point x = c + sign * p (lattice.memory_index) in integers: its digits are
    # floor(x / 2) mod K/2, so 2 x digit = (x mod K) with bit 0 cleared, and x mod K = (c mod K + sign p) mod K
    period = 2 * half
    c = center.to(tl.int32) % period  # |center| < 2^22 + 3
    c = tl.where(c < 0, c + period, c)
    place = place_ptr + block * PLACE
    if POW2:  # as fp32 bits, c + 1.5 x 2^23 and the sign: see the forward's step 5
        _store_by_place(place, position, (c.to(tl.float32) + MAGIC).to(tl.int32, bitcast=True))
        _store_by_place(place + COORDS, position, tl.where(flipped, -1.0, 1.0).to(tl.int32, bitcast=True))
    else:
        _store_by_place(place, position, c)
        _store_by_place(place + COORDS, position, tl.where(flipped, -1, 1))
        _store_by_place(place + 4 * COORDS, position, period)  # the read kernel's steps mod K
    _store_by_place(zf_ptr + block * COORDS, position, zf)
    # the masks and multipliers from the tables after a barrier, which keeps their loads (and so the registers
    # they hold) from being moved up
    tl.debug_barrier()
    period = 2 * _rows_of(half_periods_ptr, every, 0, 0)
    last = cols == COORDS - 1  # the last coordinate's digit is halved (lattice.memory_index) and its stride is 1
    if POW2:  # every K a power of two: mod K and the cleared bits in one mask
        _store_by_place(place + 2 * COORDS, position, tl.where(last, period - 4, period - 2))
    else:
        _store_by_place(place + 2 * COORDS, position, tl.where(last, -4, -2))
    strides = _rows_of(strides_ptr, every, 0, 0)
    _store_by_place(place + 3 * COORDS, position, tl.where(last, strides, 2 * strides))
    zz = tl.sum(offset * offset, axis=-1)
    tl.store(place + 5 * COORDS, zz.to(tl.int32, bitcast=True))
    # the threshold search's first probe z_F^T A z_F + b.z_F + c (first_probe_model): z_F by place read back
    # (a lane reads what it wrote); the barrier keeps the 72 constants' loads from being moved up, where they
    # would hold registers through everything above
    tl.debug_barrier()
    zf_by_place = _rows_of(zf_ptr, block, COORDS, 0)
    z0, z4, z2, z6, z1, z5, z3, z7 = _columns(zf_by_place)
    quadratic = (_rows_of(probe_ptr, every, 0, 8 * COORDS) + z0[:, None] * _rows_of(probe_ptr, every, 0, 0)
                 + z1[:, None] * _rows_of(probe_ptr, every, 0, COORDS)
                 + z2[:, None] * _rows_of(probe_ptr, every, 0, 2 * COORDS)
                 + z3[:, None] * _rows_of(probe_ptr, every, 0, 3 * COORDS)
                 + z4[:, None] * _rows_of(probe_ptr, every, 0, 4 * COORDS)
                 + z5[:, None] * _rows_of(probe_ptr, every, 0, 5 * COORDS)
                 + z6[:, None] * _rows_of(probe_ptr, every, 0, 6 * COORDS)
                 + z7[:, None] * _rows_of(probe_ptr, every, 0, 7 * COORDS))
    first = tl.sum(quadratic * zf_by_place, axis=-1) + tl.load(probe_ptr + 9 * COORDS)
    tl.store(place + 5 * COORDS + 1, first.to(tl.int32, bitcast=True))
    # bit fields apart: their sum is their union
    packed = tl.sum((position << (3 * cols)) | (flipped.to(tl.int32) << (24 + cols)), axis=-1)
    tl.store(frame_ptr + block, packed)
    tl.store(scale_ptr + block, tl.reshape(scale, (BLOCK, )))


@triton.jit
def lram_lookup_fwd_kernel(
    values_ptr, out_ptr, cand_ptr, index_ptr, weight_ptr, zf_ptr, scale_ptr, place_ptr,
    points_t_ptr, norms_ptr, points_ptr, half_memory,
    M: tl.constexpr, M_PAD: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr,
    CANDIDATES: tl.constexpr, FROM_Q: tl.constexpr, READ: tl.constexpr, POW2: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, COORDS)
    place = place_ptr + row * PLACE

    # squared distances |p|^2 + |z_F|^2 - 2 z_F.p to the candidates, [32 lanes, PER_LANE each] (padding: |p|^2 =
    # 1e30); in this order, points at equal distance get equal d2 where the reference's do, for its tie order
    PER_LANE: tl.constexpr = CANDIDATES // 32
    points = tl.arange(0, 32)[:, None] * PER_LANE + tl.arange(0, PER_LANE)[None, :]
    dot = tl.zeros((32, PER_LANE), tl.float32)
    for k in tl.range(COORDS, num_stages=1):  # a loop, not unrolled: registers for one coordinate's table row
        dot += tl.load(zf_ptr + row * COORDS + k) * tl.load(points_t_ptr + k * CANDIDATES + points)
    d2 = tl.load(norms_ptr + points) + (tl.load(place + 5 * COORDS).to(tl.float32, bitcast=True) - 2.0 * dot)

    # threshold t with exactly TOPK candidates below it; invariant count(lo) < TOPK < count(hi)
    lo = tl.full((), 0.0, tl.float32)
    hi = tl.full((), PROBE_CEILING, tl.float32)
    # the count modelled linear in t^4 through (lo^4, count_lo) and (hi^4, count_hi); until a probe counts more
    # than TOPK that upper point is the origin, so the first steps scale lo^4 by the density lo's count shows
    lo4 = tl.full((), 0.0, tl.float32)
    hi4 = tl.full((), 0.0, tl.float32)
    count_lo = tl.full((), 0.0, tl.float32)
    count_hi = tl.full((), 0.0, tl.float32)
    t = tl.load(place + 5 * COORDS + 1).to(tl.float32, bitcast=True)  # the frame kernel's first probe
    count = tl.full((), -1, tl.int32)
    probes = tl.full((), 0, tl.int32)
    stalled = tl.full((), 0, tl.int1)
    while (count != TOPK) & (stalled == 0):
        count = tl.sum((d2 < t).to(tl.int32))
        counted = count.to(tl.float32)
        t4 = (t * t) * (t * t)
        below = count < TOPK
        above = count > TOPK
        lo = tl.where(below, t, lo)
        lo4 = tl.where(below, t4, lo4)
        count_lo = tl.where(below, counted, count_lo)
        hi = tl.where(above, t, hi)
        hi4 = tl.where(above, t4, hi4)
        count_hi = tl.where(above, counted, count_hi)
        probes += 1
        # the two differences share their sign (both negative while the upper point is the origin): their ratio
        # is |span| / |gap|, 1 / |gap| by an approximate rsqrt
        gap = count_hi - count_lo
        guess = tl.sqrt(tl.sqrt(lo4 + (TOPK + 0.5 - count_lo) * tl.abs(hi4 - lo4) * tl.math.rsqrt(gap * gap)))
        # every BISECT_EVERY-th probe bisects, and so does a guess outside (lo, hi) (or NaN: 0 / 0 where lo
        # counted none before any probe counted more than TOPK)
        inside = (guess > lo) & (guess < hi)
        guess = tl.where(((probes % BISECT_EVERY) == 0) | (inside == 0), 0.5 * (lo + hi), guess)
        stalled = (guess <= lo) | (guess >= hi)  # lo and hi are neighbouring floats: a tie at lo
        t = tl.where(count == TOPK, t, guess)
    if count != TOPK:  # a tie at d2 = lo: the earliest points at lo fill the remaining slots
        equal = d2 == lo
        first = tl.full((), 0, tl.int32)  # bisect the point bound b: count(equal and point < b) reaches TOPK
        last = tl.full((), CANDIDATES, tl.int32)
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
    # a lane's entries stored as PER_LANE stores of one entry per lane: a [32, PER_LANE] store with data-dependent
    # addresses would move its 64-bit pointers through shared memory into a layout of one entry per thread first
    slot_columns = _columns(slot_of)
    point_columns = _columns(points)
    chosen_columns = _columns(chosen)
    for column in tl.static_range(PER_LANE):
        tl.store(cand_ptr + row * TOPK + slot_columns[column], point_columns[column].to(tl.int16),
                 mask=chosen_columns[column] != 0)
    tl.debug_barrier()  # the slots were written by other lanes

    # per slot (a lane each): the lattice point x = c + sign * p, its memory index and its weight. The index in
    # integers: the frame kernel wrote by place c mod K, the signs, masks that take x mod K and clear its low bit
    # (two for the last coordinate, whose digit is halved) and the multipliers 2 x stride (the last: 1), so the
    # masked coordinates times the multipliers sum to 4 x the index's digit part. Where every K is a power of
    # two, x comes from one fp32 multiply-add, sign * p + (c + 1.5 x 2^23): the sum lies in [2^23, 2^24), where
    # the low bits of an fp32 are those of the integer x + 2^22, and x mod K is x's low bits (|x| < 2^22);
    # otherwise in int32, x mod K by one step either way (x lies within [-4, K + 4))
    slots = tl.arange(0, TOPK_PAD)
    slot_ok = slots < TOPK
    cand = tl.load(cand_ptr + row * TOPK + slots, mask=slot_ok, other=0).to(tl.int32)
    # int16: 8 coordinates are one 128-bit load, which gives the [TOPK_PAD, 8] tensors here a row per lane
    p_int = tl.load(points_ptr + cand[:, None] * COORDS + cols[None, :]).to(tl.int32)  # [TOPK_PAD, 8]
    p = p_int.to(tl.float32)
    diff = tl.load(zf_ptr + row * COORDS + cols)[None, :] - p
    u = tl.maximum(1.0 - tl.sum(diff * diff, axis=1) * 0.125, 0.0)
    weight = tl.where(slot_ok, (u * u) * (u * u), 0.0)
    scale = tl.load(scale_ptr + row)
    if FROM_Q:  # lookup_triton's weights: NaN for a query read as invalid (scale is 1 otherwise)
        weight = weight * scale
    c = tl.load(place + cols)[None, :]
    sign = tl.load(place + COORDS + cols)[None, :]
    if POW2:
        x = (sign.to(tl.float32, bitcast=True) * p + c.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True)
    else:
        x = c + sign * p_int
        period = tl.load(place + 4 * COORDS + cols)[None, :]
        x += tl.where(x < 0, period, 0) - tl.where(x >= period, period, 0)
    digits = tl.sum((x & tl.load(place + 2 * COORDS + cols)[None, :]) * tl.load(place + 3 * COORDS + cols)[None, :],
                    axis=1)
    # the parity of any coordinate is x's; 4 x the digit part is below 2 N <= 2^32: read as unsigned
    parity = _columns(x)[0] & 1
    index = parity * half_memory + (digits.to(tl.uint32, bitcast=True) >> 2).to(tl.int32)
    tl.store(index_ptr + row * TOPK + slots, index, mask=slot_ok)
    tl.store(weight_ptr + row * TOPK + slots, weight, mask=slot_ok)

    if READ:  # the rows, CHUNK at a time from the slots just written: fewer registers, fused multiply-adds
        tl.debug_barrier()
        value_cols = tl.arange(0, M_PAD)
        if values_ptr.dtype.element_ty == tl.bfloat16 and M % 2 == 0:
            # a bf16 table read as words of two values, the low one in the low half: each becomes an fp32 in one
            # instruction (a shift, a mask), not the two of an element-wise conversion
            PAIRS: tl.constexpr = M_PAD // 2
            words = values_ptr.to(tl.pointer_type(tl.int32))
            pair_cols = tl.arange(0, PAIRS)
            acc_low = tl.zeros((CHUNK, PAIRS), tl.float32)
            acc_high = tl.zeros((CHUNK, PAIRS), tl.float32)
            for chunk in tl.range(TOPK_PAD // CHUNK, num_stages=1):
                part = chunk * CHUNK + tl.arange(0, CHUNK)
                part_ok = part < TOPK
                part_index = tl.load(index_ptr + row * TOPK + part, mask=part_ok, other=0).to(tl.int64)
                part_weight = tl.load(weight_ptr + row * TOPK + part, mask=part_ok, other=0.0)[:, None]
                ok = part_ok[:, None] & (pair_cols[None, :] < M // 2)
                pair = tl.load(words + part_index[:, None] * (M // 2) + pair_cols[None, :], mask=ok, other=0)
                acc_low += part_weight * (pair << 16).to(tl.float32, bitcast=True)
                acc_high += part_weight * (pair & -65536).to(tl.float32, bitcast=True)
            phi = tl.reshape(tl.join(tl.sum(acc_low, axis=0), tl.sum(acc_high, axis=0)), (M_PAD, ))
        else:
            acc = tl.zeros((CHUNK, M_PAD), tl.float32)
            for chunk in tl.range(TOPK_PAD // CHUNK, num_stages=1):  # a loop, not unrolled: registers for a chunk
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
def _per_group(x, PARTS_FIRST: tl.constexpr):
    """A value per row (the backward: a chunk's rows; the segment sums: each stretch's entry), broadcast over the
    parts and columns of its row."""
    if PARTS_FIRST:
        return x[None, :, None]
    else:
        return x[:, None, None]


@triton.jit
def _part_columns(PARTS: tl.constexpr, PART: tl.constexpr, VECTOR: tl.constexpr, ROWS: tl.constexpr,
                  PARTS_FIRST: tl.constexpr):
    """The columns of a row's PARTS parts of PART, the same on each of ROWS rows: [PARTS, ROWS, PART] where
    PARTS_FIRST, else [ROWS, PARTS, PART] (see _segment_sum); VECTOR consecutive columns of each part a lane."""
    cols = tl.max_contiguous(tl.multiple_of(tl.arange(0, PART), VECTOR), VECTOR)
    rows = tl.arange(0, ROWS)
    if PARTS_FIRST:
        return tl.arange(0, PARTS)[:, None, None] * PART + cols[None, None, :] + 0 * rows[None, :, None]
    else:
        return tl.arange(0, PARTS)[None, :, None] * PART + cols[None, None, :] + 0 * rows[:, None, None]


@triton.jit
def lram_lookup_bwd_kernel(
    values_ptr, grad_out_ptr, grad_values_ptr, weight_ptr, slot_weight_ptr, along_ptr, index_ptr, scale_ptr,
    M: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr, PARTS: tl.constexpr,
    PART: tl.constexpr, PARTS_FIRST: tl.constexpr, GRAD_X: tl.constexpr, GRAD_VALUES_ATOMIC: tl.constexpr,
):
    """The rows of one lookup, CHUNK at a time: the slot weights s u^4 (from the forward's u^4), a_k = g . v_k
    (GRAD_X) and the value gradient by atomics (GRAD_VALUES_ATOMIC)."""
    row = tl.program_id(0).to(tl.int64)
    scale = tl.load(scale_ptr + row)
    # A row's PARTS parts of PART columns are spread over PART / 4 lanes, 4 columns of each part a lane (the
    # layout of the segment sums): a_k is summed in the lane but for two shuffles, where a [CHUNK, m] tile's lanes
    # ran along the row (16 shuffles a chunk); a load or an atomic still covers 64 contiguous bytes of each row
    VECTOR: tl.constexpr = min(PART, 4)
    value_cols = _part_columns(PARTS, PART, VECTOR, CHUNK, PARTS_FIRST)
    value_ok = value_cols < M
    # g in every row of the chunk: each lane loads its own copy, in the layout of the rows
    g = tl.load(grad_out_ptr + row * M + value_cols, mask=value_ok, other=0.0).to(tl.float32)
    # each lane's columns once; a row then adds its offset (one wide multiply-add an address)
    if GRAD_VALUES_ATOMIC:
        grad_cols = grad_values_ptr + value_cols
    WORDS: tl.constexpr = GRAD_X and values_ptr.dtype.element_ty == tl.bfloat16 and M % 2 == 0
    if WORDS:  # a bf16 table read as words of two values (as the forward): g split into even and odd columns
        word_cols = _part_columns(PARTS, PART // 2, VECTOR // 2, CHUNK, PARTS_FIRST)
        word_ok = word_cols < M // 2
        g_low, g_high = tl.split(tl.reshape(g, word_cols.shape + [2]))  # in the lanes that hold them
        value_cols_ptr = values_ptr.to(tl.pointer_type(tl.int32)) + word_cols
    elif GRAD_X:
        value_cols_ptr = values_ptr + value_cols
    for chunk in tl.range(TOPK_PAD // CHUNK, num_stages=1):
        part = chunk * CHUNK + tl.arange(0, CHUNK)
        part_ok = part < TOPK
        part_index = tl.load(index_ptr + row * TOPK + part, mask=part_ok, other=0).to(tl.int64)
        part_weight = scale * tl.load(weight_ptr + row * TOPK + part, mask=part_ok, other=0.0)
        tl.store(slot_weight_ptr + row * TOPK + part, part_weight, mask=part_ok)  # the segment sums read it
        ok = _per_group(part_ok, PARTS_FIRST) & value_ok
        offsets = _per_group(part_index * M, PARTS_FIRST)
        if GRAD_VALUES_ATOMIC:
            tl.atomic_add(grad_cols + offsets, _per_group(part_weight, PARTS_FIRST) * g, mask=ok, sem="relaxed")
        if GRAD_X:
            if WORDS:  # each value made fp32 by one shift or one mask
                pair = tl.load(value_cols_ptr + _per_group(part_index * (M // 2), PARTS_FIRST),
                               mask=_per_group(part_ok, PARTS_FIRST) & word_ok, other=0)
                products = (pair << 16).to(tl.float32, bitcast=True) * g_low
                products += (pair & -65536).to(tl.float32, bitcast=True) * g_high
            else:
                products = tl.load(value_cols_ptr + offsets, mask=ok, other=0.0).to(tl.float32) * g
            # the parts (in the lane) first, then the columns (in the lane, then over the row's lanes)
            along = tl.sum(tl.sum(products, axis=0 if PARTS_FIRST else 1), axis=1)
            tl.store(along_ptr + row * TOPK + part, along, mask=part_ok)


@triton.jit
def _store_rows(ptr, value, mask):
    """Stores value[b, k] at ptr[b] + k where mask[b], for rows [BLOCK, 8] held a row per lane: a store per
    column (as _store_by_place)."""
    c0, c4, c2, c6, c1, c5, c3, c7 = _columns(value)
    tl.store(ptr, c0, mask=mask)
    tl.store(ptr + 1, c1, mask=mask)
    tl.store(ptr + 2, c2, mask=mask)
    tl.store(ptr + 3, c3, mask=mask)
    tl.store(ptr + 4, c4, mask=mask)
    tl.store(ptr + 5, c5, mask=mask)
    tl.store(ptr + 6, c6, mask=mask)
    tl.store(ptr + 7, c7, mask=mask)


@triton.jit
def lram_lookup_bwd_query_kernel(
    x_ptr, grad_x_ptr, along_ptr, cand_ptr, zf_ptr, frame_ptr, scale_ptr, freq_ptr, points_ptr, n_rows,
    TOPK: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr, FROM_Q: tl.constexpr,
):
    """The gradient to the queries of a block of lookups, a lane each holding its 8 coordinates (the frame
    kernel's layout): from a_k = g . v_k (lram_lookup_bwd_kernel) over the slots k, in the lane,
        dL/dz_F / s = -sum_k a_k u_k^3 (z_F - p_k)       and       dL/ds = sum_k a_k u_k^4,
    dL/dz_F mapped back to q through the frame, then through the torus query (theta) or times s (from q)."""
    block = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    source = tl.where(block < n_rows, block, 0).to(tl.int64)  # the block's tail reads row 0 and writes nothing
    cols = tl.arange(0, COORDS)[None, :]
    zf = _rows_of(zf_ptr, source, COORDS, 0)
    grad_zf = tl.zeros((BLOCK, COORDS), tl.float32)  # over s: the scale enters below as a ratio (no overflow)
    grad_scale = tl.zeros((BLOCK, ), tl.float32)
    # a loop of UNROLL slots a trip (independent loads in flight), not unrolled whole (registers)
    for k in tl.range(TOPK, num_stages=1, loop_unroll_factor=UNROLL):
        p = _rows_of(points_ptr, tl.load(cand_ptr + source * TOPK + k).to(tl.int32), COORDS, 0).to(tl.float32)
        diff = zf - p
        u = tl.maximum(1.0 - tl.sum(diff * diff, axis=-1) * 0.125, 0.0)
        au2 = tl.load(along_ptr + source * TOPK + k) * (u * u)
        grad_zf -= (au2 * u)[:, None] * diff
        grad_scale += au2 * (u * u)
    # coordinate i went to place position_i with sign_i: dL/dq_i = sign_i dL/dz_F[position_i], gathered through
    # memory (this lane's row of dL/dx, overwritten below). The block again, not registers held through the loop.
    # The block's tail writes nothing and gathers from row 0: values it never stores
    block = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = block < n_rows
    source = tl.where(ok, block, 0).to(tl.int64)
    WIDTH: tl.constexpr = COORDS if FROM_Q else 2 * COORDS
    grad_x_row = grad_x_ptr + source * WIDTH
    _store_rows(grad_x_row, grad_zf, ok)
    tl.debug_barrier()
    frame = tl.load(frame_ptr + source)[:, None]
    grad_q = _rows_at(grad_x_row, (frame >> (3 * cols)) & 7)
    grad_q = tl.where(((frame >> (24 + cols)) & 1) != 0, -grad_q, grad_q)
    if FROM_Q:
        _store_rows(grad_x_row, tl.load(scale_ptr + source)[:, None] * grad_q, ok)
    else:
        # on w = z / c as the forward (naive.torus_query): with rho_i = max(|w_i|, 2^-63), (cos_i, sin_i) the
        # direction of w_i and r_i = s / (c rho_i) <= 1, ds/d(re_i, im_i) = r_i^2 (cos_i, sin_i) and
        # s dq_i/d(re_i, im_i) = s K_i/(2 pi) (-sin_i, cos_i) / (c rho_i): bounded for every finite z.
        # K_i/(2 pi) dL/dq_i through memory too: registers for what follows
        freq = _rows_of(freq_ptr, tl.zeros((BLOCK, ), tl.int32), 0, 0)
        _store_rows(grad_x_row, grad_q * freq, ok)
        tl.debug_barrier()
        re = _rows_of(x_ptr, source, 2 * COORDS, 0).to(tl.float32)
        im = _rows_of(x_ptr, source, 2 * COORDS, COORDS).to(tl.float32)
        re, im, c, valid = _scaled_head(re, im)
        squared = re * re + im * im
        lift = squared < TINY
        re = tl.where(lift, re * LIFT, re)
        im = tl.where(lift, im * LIFT, im)
        lifted = re * re + im * im
        direction = tl.math.rsqrt(tl.where(lifted == 0.0, 1.0, lifted))
        cos = tl.where(lifted == 0.0, 1.0, re * direction)
        sin = im * direction
        inverse_rho = tl.where(lift, FLOOR_INVERSE, direction)
        ratio = inverse_rho * tl.fdiv(1.0, tl.sum(inverse_rho, axis=-1, keep_dims=True))
        radial = grad_scale[:, None] * ratio * ratio
        angular = _rows_of(grad_x_row, tl.zeros((BLOCK, ), tl.int32), 0, 0) * ratio
        _store_rows(grad_x_row, tl.where(valid, radial * cos - angular * sin, 0.0), ok)
        _store_rows(grad_x_row + COORDS, tl.where(valid, radial * sin + angular * cos, 0.0), ok)


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


def _tables(K, topk, device):
    """Device tables: K/(2 pi), half periods, index strides (int32); of the candidate points (lattice.candidate_points,
    padded to `candidates(topk)`): transposed (fp32), |p|^2, as rows (int16); the first probe's A, b, c (fp32)."""
    key = (K, topk, str(device))
    if key not in _TABLES:
        points = FUNDAMENTAL_POINTS[candidate_points(topk)]
        n, pad = points.shape[0], candidates(topk)
        points_t = torch.zeros(DIM, pad, dtype=torch.float32)
        points_t[:, :n] = points.T.float()
        norms = torch.full((pad,), PADDING_D2, dtype=torch.float32)
        norms[:n] = (points**2).sum(-1).float()
        points16 = torch.zeros(pad, DIM, dtype=torch.int16)
        points16[:n] = points.to(torch.int16)
        A, b, c = first_probe_model(topk)
        probe = torch.cat([A.reshape(-1), b, torch.tensor([c])])  # the first probe's quadratic form
        periods = torch.tensor(K, dtype=torch.float32)
        _TABLES[key] = tuple(t.to(device) for t in (
            periods / (2 * math.pi),  # as naive.torus_query computes it
            torch.tensor([k // 2 for k in K], dtype=torch.int32),
            torch.tensor(index_strides(K), dtype=torch.int32),
            points_t, norms, points16, probe))
    return _TABLES[key]


def candidates(topk):
    """The candidate points of a topk lookup padded to a power of two, at least 32: one or more per lane."""
    return max(32, triton.next_power_of_2(candidate_points(topk).shape[0]))


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


def _parts(M):
    # a row's parts: PART columns each, PART / 4 lanes with 4 columns each
    M_PAD = triton.next_power_of_2(max(M, 1))
    part = min(M_PAD, SEGMENT_PART)
    return dict(PARTS=M_PAD // part, PART=part)


_FIRST_PROBES: dict = {}


def first_probe_model(topk):
    """(A [8, 8] symmetric, b [8], c) of the threshold search's first probe z^T A z + b.z + c at z = z_F: a least-
    squares fit (float64, seeded random queries) of the d2 midway between a query's topk-th and next nearest
    candidate. For topk = 32 it misses that d2 by 0.077 (root mean square over random queries) where its mean
    misses by 0.135, and the search takes 3.2 probes on average instead of 3.6. The search is exact from any first
    probe; this only makes it shorter."""
    if topk not in _FIRST_PROBES:
        from projects.lram_gpt.lattice import to_fundamental

        generator = torch.Generator().manual_seed(0)
        z = to_fundamental((torch.rand(16384, DIM, generator=generator, dtype=torch.float64) * 2 - 1) * 16)[0]
        points = FUNDAMENTAL_POINTS[candidate_points(topk)].double()
        d2 = ((z[:, None, :] - points) ** 2).sum(-1).sort(-1).values
        upper = d2[:, topk] if topk < d2.shape[1] else d2[:, -1] + 1
        i, j = torch.triu_indices(DIM, DIM)
        features = torch.cat([torch.ones(z.shape[0], 1, dtype=z.dtype), z, z[:, i] * z[:, j]], -1)
        coef = torch.linalg.lstsq(features, ((d2[:, topk - 1] + upper) / 2)[:, None]).solution[:, 0]
        A = torch.zeros(DIM, DIM, dtype=torch.float64)
        A.index_put_((i, j), coef[1 + DIM:] / 2, accumulate=True)
        A.index_put_((j, i), coef[1 + DIM:] / 2, accumulate=True)
        _FIRST_PROBES[topk] = (A.float(), coef[1:1 + DIM].float(), float(coef[0]))
    return _FIRST_PROBES[topk]


def first_probes(zf, topk):
    """The first probe of each z_F [n, 8] (float32), as the frame kernel computes it."""
    A, b, c = first_probe_model(topk)
    return ((zf @ A) * zf).sum(-1) + zf @ b + c


def lookup_fwd(x_rows, values, K, topk, from_q, read, save, out_dtype=torch.float32):
    """Launch the forward kernels (frame, then selection and read); returns (out, cand, index, weight, zf, frame,
    scale).

    values is None when not `read`; zf, frame and scale are None when not `save` (nothing for a backward).
    """
    n, device = x_rows.shape[0], x_rows.device
    M = values.shape[1] if read else 0
    freq, half_periods, strides, points_t, norms, points16, probe = _tables(K, topk, device)
    # every K a power of two (and below 2^21, for the fp32 trick of the forward's step 5): mod K by a mask
    pow2 = all(k & (k - 1) == 0 and k <= 2**21 for k in K)
    out = torch.empty(n, M, dtype=out_dtype, device=device)
    cand = torch.empty(n, topk, dtype=torch.int16, device=device)
    index = torch.empty(n, topk, dtype=torch.int32, device=device)  # saved for the backward, or scratch
    weight = torch.empty(n, topk, dtype=torch.float32, device=device)  # the lookup's result, or scratch
    # the frame kernel writes whole blocks of rows: its buffers end in padding, what is returned leaves it out
    padded = triton.cdiv(n, FRAME_BLOCK) * FRAME_BLOCK
    zf = torch.empty(padded, DIM, dtype=torch.float32, device=device)
    frame = torch.empty(padded, dtype=torch.int32, device=device)
    scale = torch.empty(padded, dtype=torch.float32, device=device)
    place = torch.empty(padded, PLACE.value, dtype=torch.int32, device=device)  # scratch: the frame, by place
    if n:
        lram_lookup_frame_kernel[(triton.cdiv(n, FRAME_BLOCK),)](
            x_rows, zf, frame, scale, place, freq, half_periods, strides, probe, n, BLOCK=FRAME_BLOCK, FROM_Q=from_q,
            POW2=pow2, num_warps=FRAME_BLOCK // 32, maxnreg=REGISTERS)
        lram_lookup_fwd_kernel[(n,)](
            values if read else None, out, cand, index, weight, zf, scale, place, points_t, norms, points16,
            memory_size(K) // 2, CHUNK=min(4, triton.next_power_of_2(topk)),
            CANDIDATES=candidates(topk), FROM_Q=from_q, READ=read, POW2=pow2, num_warps=1, **_meta(topk, M),
            **({"maxnreg": REGISTERS} if read and not from_q else {}))
    if not save:
        return out, cand, index, weight, None, None, None
    return out, cand, index, weight, zf[:n], frame[:n], scale[:n]


def lookup_bwd(x_rows, values, grad_rows, cand, index, weight, zf, frame, scale, K, topk, from_q, need_x,
               value_grad):
    """Launch the backward kernels; returns (grad_x fp32 or None, grad_values, slot_weight s u^4 [n, topk]).

    weight: the forward's u^4 (times s, NaN or 1, from q). value_grad: "atomic" or "segment" give the dense fp32
    value gradient [N, m]; "sparse" gives (the memory indices read, rising; their [U, m] fp32 sums); "none" gives
    None.
    """
    n, M = x_rows.shape[0], values.shape[1]
    atomic = value_grad == "atomic"
    grad_x = torch.empty(x_rows.shape, dtype=torch.float32, device=x_rows.device) if need_x else None
    dense = value_grad in ("atomic", "segment")
    grad_values = torch.zeros(values.shape, dtype=torch.float32, device=values.device) if dense else None
    slot_weight = torch.empty(n, topk, dtype=torch.float32, device=x_rows.device)
    along = torch.empty(n, topk, dtype=torch.float32, device=x_rows.device) if need_x else None  # g . v_k
    if n and (need_x or value_grad != "none"):
        lram_lookup_bwd_kernel[(n,)](
            values if need_x else None, grad_rows, grad_values if atomic else None, weight, slot_weight, along,
            index, scale, M=M, TOPK=topk, TOPK_PAD=triton.next_power_of_2(topk),
            CHUNK=min(8, triton.next_power_of_2(topk)), **_parts(M), PARTS_FIRST=PARTS_FIRST, GRAD_X=need_x,
            GRAD_VALUES_ATOMIC=atomic, num_warps=1, maxnreg=REGISTERS)
    if n and need_x:
        freq, _, _, _, _, points16, _ = _tables(K, topk, x_rows.device)
        lram_lookup_bwd_query_kernel[(triton.cdiv(n, FRAME_BLOCK),)](
            x_rows, grad_x, along, cand, zf, frame, scale, freq, points16, n, TOPK=topk, BLOCK=FRAME_BLOCK,
            UNROLL=QUERY_UNROLL, FROM_Q=from_q, num_warps=FRAME_BLOCK // 32, maxnreg=REGISTERS)
    if value_grad in ("segment", "sparse"):
        grad_values = _segment_sum(grad_rows, index, slot_weight, grad_values, topk, values.shape)
    return grad_x, grad_values, slot_weight


# ---------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile) and autograd
# ---------------------------------------------------------------------------------------------------

@torch.library.custom_op("lram_gpt::lookup_fwd", mutates_args=())
def _lookup_fwd_op(x_rows: torch.Tensor, values: torch.Tensor, K: list[int], topk: int, from_q: bool, save: bool,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor, torch.Tensor]:
    out, cand, index, weight, zf, frame, scale = lookup_fwd(x_rows, values, tuple(K), topk, from_q, True, save,
                                                            out_dtype)
    if not save:  # a custom op returns tensors, none aliasing another: empty ones stand for nothing saved
        zf, frame, scale = (x_rows.new_empty(0) for _ in range(3))
    return out, cand, index, weight, zf, frame, scale


@_lookup_fwd_op.register_fake
def _(x_rows, values, K, topk, from_q, save, out_dtype):
    n = x_rows.shape[0]
    saved = (x_rows.new_empty(n, DIM, dtype=torch.float32), x_rows.new_empty(n, dtype=torch.int32),
             x_rows.new_empty(n, dtype=torch.float32)) if save else (x_rows.new_empty(0),) * 3
    return (x_rows.new_empty(n, values.shape[1], dtype=out_dtype), x_rows.new_empty(n, topk, dtype=torch.int16),
            x_rows.new_empty(n, topk, dtype=torch.int32), x_rows.new_empty(n, topk, dtype=torch.float32), *saved)


@torch.library.custom_op("lram_gpt::lookup_bwd", mutates_args=())
def _lookup_bwd_op(x_rows: torch.Tensor, values: torch.Tensor, grad_rows: torch.Tensor, cand: torch.Tensor,
                   index: torch.Tensor, weight: torch.Tensor, zf: torch.Tensor, frame: torch.Tensor,
                   scale: torch.Tensor, K: list[int], topk: int, from_q: bool, need_x: bool,
                   value_grad: str) -> tuple[torch.Tensor, torch.Tensor]:
    grad_x, grad_values, _ = lookup_bwd(x_rows, values, grad_rows, cand, index, weight, zf, frame, scale, tuple(K),
                                        topk, from_q, need_x, value_grad)
    empty = x_rows.new_empty(0, dtype=torch.float32)
    return (grad_x if need_x else empty), (grad_values if value_grad != "none" else empty)


@_lookup_bwd_op.register_fake
def _(x_rows, values, grad_rows, cand, index, weight, zf, frame, scale, K, topk, from_q, need_x, value_grad):
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
        out, cand, index, weight, zf, frame, scale = torch.ops.lram_gpt.lookup_fwd(x_rows, values_c, list(K), topk,
                                                                                   from_q, save, out_dtype)
        ctx.save_for_backward(x_rows, values_c, cand, index, weight, zf, frame, scale)
        ctx.K, ctx.topk, ctx.value_grad, ctx.sparse, ctx.from_q = K, topk, value_grad, sparse, from_q
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return out.view(*x.shape[:-1], values.shape[1])

    @staticmethod
    def backward(ctx, grad_out):
        x_rows, values, cand, index, weight, zf, frame, scale = ctx.saved_tensors
        n, M = x_rows.shape[0], values.shape[1]
        grad_rows = grad_out.reshape(n, M).contiguous()
        need_x, need_values = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if need_values and ctx.sparse:  # a data-dependent row count: eager, as the sparse forward
            grad_x, (rows_read, sums), _ = lookup_bwd(x_rows, values, grad_rows, cand, index, weight, zf, frame,
                                                      scale, ctx.K, ctx.topk, ctx.from_q, need_x, "sparse")
            grad_values = sparse_rows(rows_read.long(), sums.to(values.dtype), values.shape)
        else:
            grad_x, grad_values = torch.ops.lram_gpt.lookup_bwd(
                x_rows, values, grad_rows, cand, index, weight, zf, frame, scale, list(ctx.K), ctx.topk,
                ctx.from_q, need_x, ctx.value_grad if need_values else "none")
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
        parts = _parts(M)
        blocks = triton.cdiv(n_entries, SEGMENT_BLOCK)
        record = torch.empty(blocks * SEGMENT_BLOCK, 4, dtype=torch.int32, device=index.device)  # scratch
        lram_lookup_segment_sum_kernel[(blocks,)](
            sorted_index, order, slot_weight, grad_rows, target, grad_values, record, n_entries,
            M=M, **parts, TOPK=topk, BLOCK=SEGMENT_BLOCK, GROUPS=min(SEGMENT_BLOCK, 128 // parts["PART"]),
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
    and whether it ended on an exact tie (then the tie loop bisects the candidates' ids). The kernel divides by an
    approximate rsqrt: its guesses may differ in their last bits, so this is a model of its trip count, not a
    replay."""
    from projects.lram_gpt.lattice import to_fundamental

    zf = to_fundamental(q.float())[0]
    points = FUNDAMENTAL_POINTS[candidate_points(topk)].float()
    d2 = (points**2).sum(-1) + ((zf * zf).sum(-1, keepdim=True) - 2 * zf @ points.T)
    n = q.shape[0]
    lo, hi = torch.zeros(n), torch.full((n,), PROBE_CEILING.value)
    lo4, hi4, count_lo, count_hi = torch.zeros(n), torch.zeros(n), torch.zeros(n), torch.zeros(n)
    t = first_probes(zf, topk)
    probes = torch.zeros(n, dtype=torch.long)
    active = torch.ones(n, dtype=torch.bool)
    tie = torch.zeros(n, dtype=torch.bool)
    while active.any():
        count = (d2 < t[:, None]).sum(-1).float()
        probes += active
        below, above = active & (count < topk), active & (count > topk)
        lo, lo4, count_lo = (torch.where(below, new, old) for new, old in ((t, lo), (t**4, lo4), (count, count_lo)))
        hi, hi4, count_hi = (torch.where(above, new, old) for new, old in ((t, hi), (t**4, hi4), (count, count_hi)))
        guess = (lo4 + (topk + 0.5 - count_lo) * (hi4 - lo4) / (count_hi - count_lo)).sqrt().sqrt()
        guess = torch.where((probes % BISECT_EVERY.value == 0) | ~((guess > lo) & (guess < hi)), 0.5 * (lo + hi), guess)
        stalled = active & (count != topk) & ((guess <= lo) | (guess >= hi))
        tie |= stalled
        active = active & (count != topk) & ~stalled
        t = torch.where(active, guess, t)
    return probes, tie


def cost_spec(kernel, constants, signature, spec):
    """For scripts/kernel_cost.py: lookups per program, loop trip counts and bytes per lookup of a launch."""
    value_bytes = {"*bf16": 2, "*fp16": 2}.get(signature.get("values_ptr"), 4)
    topk = constants.get("TOPK", 0)
    # the row width padded to a power of two: the read kernel's M_PAD, the backward's and segment sums' parts
    m = constants.get("M_PAD", constants.get("PARTS", 0) * constants.get("PART", 0))
    if kernel == "lram_lookup_frame_kernel":  # per lookup: its inputs, then z_F, frame, scale and the place rows
        moved = (DIM if constants["FROM_Q"] else HEAD_INPUTS) * 4 + DIM * 4 + 4 + 4 + PLACE.value * 4
        return spec(constants["BLOCK"], [], moved, f"a program: {constants['BLOCK']} lookups, a row each")
    if kernel == "lram_lookup_fwd_kernel":
        # the threshold search's mean trip count over uniform random queries (seeded)
        generator = torch.Generator().manual_seed(0)
        q = (torch.rand(4096, DIM, generator=generator) * 2 - 1) * 16
        probes, tie = threshold_probes(q, topk)
        bisections = constants["CANDIDATES"].bit_length() - 1
        probes, tie_trips = probes.float().mean().item(), bisections * tie.float().mean().item()
        read = topk * m * value_bytes if constants["READ"] else 0
        # z_F, the place rows (the last 8 only where some K is not a power of two), scale; out, slots and weights
        frame = DIM * 4 + (PLACE.value - DIM * constants["POW2"]) * 4 + 4
        moved = read + frame + m * 2 + topk * (2 + 4 + 4)
        trips = [probes, tie_trips] + [triton.next_power_of_2(topk) // constants["CHUNK"]] * constants["READ"]
        return spec(1, trips, moved, f"loops: mean {probes:.2f} probes, {tie_trips:.3f} tie steps "
                                     f"over 4096 random queries")
    if kernel == "lram_lookup_bwd_kernel":  # per lookup: its rows (read, added to), g, the per-slot values
        grad_bytes = {"*bf16": 2, "*fp16": 2}.get(signature.get("grad_out_ptr"), 4)
        moved = topk * m * value_bytes * constants["GRAD_X"] + topk * m * 4 * constants["GRAD_VALUES_ATOMIC"]
        moved += m * grad_bytes + 4 + topk * (4 + 4 + 4 + 4 * constants["GRAD_X"])  # index, u^4, s u^4 and a_k
        return spec(1, [triton.next_power_of_2(topk) // constants["CHUNK"]], moved,
                    f"a lookup: one head reading its {topk} rows of m = {m} values")
    if kernel == "lram_lookup_bwd_query_kernel":  # per lookup: a_k and the slots, z_F, frame, scale; x and dL/dx
        x_bytes = {"*bf16": 2, "*fp16": 2}.get(signature.get("x_ptr"), 4)
        width = DIM if constants["FROM_Q"] else HEAD_INPUTS
        moved = topk * (4 + 2) + DIM * 4 + 4 + 4 + width * 4 + (0 if constants["FROM_Q"] else width * x_bytes)
        # the slot loop: UNROLL slots a trip, then a loop over the rest (none where UNROLL divides TOPK)
        trips = [topk // constants["UNROLL"], topk % constants["UNROLL"]]
        return spec(constants["BLOCK"], trips, moved, f"a program: {constants['BLOCK']} lookups, a row each")
    if kernel == "lram_lookup_segment_sum_kernel":  # per lookup: its TOPK entries; a row's gradient written ~once
        per_entry = m * 4 + 4 + 8 + 4 + 4 * constants["COMPACT"] + 16  # 16: the entry's record, written once
        return spec(constants["BLOCK"] / topk, [], topk * per_entry + topk * m * 4,
                    "a block of entries summed in stretches, one entry per stretch a step (straight-line code)")
    return None
