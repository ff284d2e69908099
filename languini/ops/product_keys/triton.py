"""The product-key search by Triton kernels (naive.product_key_topk_reference is the reference).

Forward, one program per block of BLOCK_T queries and one head (product_key_search_fwd_kernel):
1. each half of the queries is scored against its n_keys sub-keys, a chunk of them at a time, by a matrix
   product (tl.dot; fp32 inputs, bf16 ones converted at load) into [BLOCK_T, CHUNK_N] scores;
2. the knn best of each half by tl.topk (a bitonic network, no sort of all scores) on 64-bit keys that pack
   the score's bits (order-preserving) over the sub-key's index, so a key carries its index with it and
   equal scores rank the lower index first; each chunk's best are merged with the running best;
3. the candidates: (i, j) is the pair of the i-th best of half 1 and the j-th best of half 2, scored
   s1_i + s2_j. Only pairs with (i + 1)(j + 1) <= knn can be among the knn best (each other pair is beaten by
   at least knn pairs at or above it in both halves), about knn ln(knn) of the knn^2 (119 of 1024 for knn 32).
   They are read back through a per-program scratch (a gather by a table of pairs) and their knn best taken
   by tl.topk, packed as above with the memory index i1 * n_keys + i2 (lower index first on equal scores).
Out: scores [R, heads, knn] fp32, descending, and the memory indices int64.

Backward (product_key_search_bwd_kernel, the same grid): the score of winner k is q_1 . key1[a_k] + q_2 . key2[b_k],
so dL/dq_h = sum_k g_k key_h[.] (rows gathered) and dL/dkey_h[.] += g_k q_h (relaxed atomic adds into an fp32
table, cast to the sub-keys' dtype after).

A NaN score ranks above every number (as in torch.topk): a NaN query still returns indices in [0, n_keys^2).
"""

import functools

import torch
import triton
import triton.language as tl

from languini.ops.product_keys.naive import check_inputs

BLOCK_T = 16  # queries per program: tl.dot's smallest M
WARPS = 8  # 4 need 210 registers (XLM's sizes: 255) for the top-k networks, 8 need 168 (sm_90, Triton 3.9)
# sub-keys scored per step: a [BLOCK_T, chunk] tile of 64-bit keys and a [half, chunk] tile of sub-keys in
# registers; 128 for halves of up to 32 values, fewer for longer ones (XLM's 128: 32), at least knn
CHUNK_ELEMENTS = 4096
# fp32 scores as three TF32 products (about fp32's accuracy on tensor cores) on a GPU; the interpreter
# multiplies in fp32
DOT_PRECISION = tl.constexpr("tf32x3")
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _pack(score, low):
    """64-bit keys ordered as the fp32 scores, ties by `low` (non-negative, < 2^32): signed integer order."""
    bits = score.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def _unpack(key):
    """(fp32 score, low 32 bits as int64) of _pack's keys."""
    ordered = (key >> 32).to(tl.int32)
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), key & 0xFFFFFFFF


@triton.jit
def _chunk_best(q, keys_base, start, d, HALF: tl.constexpr, N_KEYS: tl.constexpr, N_PAD: tl.constexpr,
                K_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """The K_PAD best of the sub-keys start .. start + CHUNK - 1 for the queries q: packed keys, descending."""
    n = start + tl.arange(0, CHUNK)
    keys_t = tl.load(keys_base + n[None, :] * HALF + d[:, None], mask=(n[None, :] < N_KEYS) & (d[:, None] < HALF),
                     other=0.0).to(tl.float32)  # [D_PAD, CHUNK]
    scores = tl.dot(q, keys_t, input_precision=DOT_PRECISION)
    scores = tl.where(n[None, :] < N_KEYS, scores, NEG_INF)
    return tl.topk(_pack(scores, (N_PAD - 1) - n[None, :]), K_PAD)


@triton.jit
def _best_of_half(q_ptr, keys_ptr, rows, row_ok, head, half, heads, HALF: tl.constexpr,
                  D_PAD: tl.constexpr, N_KEYS: tl.constexpr, N_PAD: tl.constexpr, K_PAD: tl.constexpr,
                  CHUNK: tl.constexpr):
    """The K_PAD best sub-keys of one half for BLOCK_T queries: packed keys [BLOCK_T, K_PAD], descending."""
    d = tl.arange(0, D_PAD)
    q = tl.load(q_ptr + (rows[:, None] * heads + head) * (2 * HALF) + half * HALF + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < HALF), other=0.0).to(tl.float32)
    keys_base = keys_ptr + (head * 2 + half) * N_KEYS * HALF
    best = _chunk_best(q, keys_base, 0, d, HALF, N_KEYS, N_PAD, K_PAD, CHUNK)
    # a loop, not unrolled: at 2^28 parameters a half has 8 chunks (more for longer halves), each its top-k networks
    for start in tl.range(CHUNK, N_PAD, CHUNK):
        chunk_best = _chunk_best(q, keys_base, start, d, HALF, N_KEYS, N_PAD, K_PAD, CHUNK)
        best = tl.topk(tl.reshape(tl.join(best, chunk_best), (q.shape[0], 2 * K_PAD)), K_PAD)
    return best


@triton.jit
def product_key_search_fwd_kernel(
    q_ptr, keys_ptr, scores_ptr, index_ptr, scratch_score_ptr, scratch_key_ptr, pair_i_ptr, pair_j_ptr, n_rows,
    heads, HALF: tl.constexpr, D_PAD: tl.constexpr, N_KEYS: tl.constexpr, N_PAD: tl.constexpr,
    KNN: tl.constexpr, K_PAD: tl.constexpr, PAIRS: tl.constexpr, PAIRS_PAD: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK: tl.constexpr, LOG_N: tl.constexpr,
):
    block = tl.program_id(0)
    head = tl.program_id(1)
    rows = block * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    slots = tl.arange(0, K_PAD)
    scratch = ((block * heads + head) * 2 * BLOCK + tl.arange(0, BLOCK)[:, None]) * K_PAD + slots[None, :]
    for half in tl.static_range(2):
        best = _best_of_half(q_ptr, keys_ptr, rows, row_ok, head, half, heads, HALF, D_PAD, N_KEYS, N_PAD, K_PAD,
                             CHUNK)
        score, low = _unpack(best)
        tl.store(scratch_score_ptr + scratch + half * BLOCK * K_PAD, score)
        tl.store(scratch_key_ptr + scratch + half * BLOCK * K_PAD, ((N_PAD - 1) - low).to(tl.int32))
    tl.debug_barrier()  # the halves' best were written by other threads

    pair = tl.arange(0, PAIRS_PAD)
    pair_ok = pair < PAIRS
    first = tl.load(pair_i_ptr + pair, mask=pair_ok, other=0)
    second = tl.load(pair_j_ptr + pair, mask=pair_ok, other=0)
    base = ((block * heads + head) * 2 * BLOCK + tl.arange(0, BLOCK)[:, None]) * K_PAD
    s1 = tl.load(scratch_score_ptr + base + first[None, :])
    s2 = tl.load(scratch_score_ptr + base + BLOCK * K_PAD + second[None, :])
    a = tl.load(scratch_key_ptr + base + first[None, :])
    b = tl.load(scratch_key_ptr + base + BLOCK * K_PAD + second[None, :])
    total = tl.where(pair_ok[None, :], s1 + s2, NEG_INF)
    # ties: the lower memory index a * n_keys + b first (the low bits hold (N_PAD - 1 - a, N_PAD - 1 - b))
    low = ((N_PAD - 1) - a).to(tl.int64) * N_PAD + ((N_PAD - 1) - b).to(tl.int64)
    best = tl.topk(_pack(total, low), K_PAD)
    score, low = _unpack(best)
    a = (N_PAD - 1) - (low >> LOG_N)
    b = (N_PAD - 1) - (low & (N_PAD - 1))
    out = (rows[:, None] * heads + head) * KNN + slots[None, :]
    ok = row_ok[:, None] & (slots[None, :] < KNN)
    tl.store(scores_ptr + out, score, mask=ok)
    tl.store(index_ptr + out, a * N_KEYS + b, mask=ok)


@triton.jit
def product_key_search_bwd_kernel(
    q_ptr, keys_ptr, index_ptr, grad_scores_ptr, grad_q_ptr, grad_keys_ptr, n_rows,
    heads, HALF: tl.constexpr, D_PAD: tl.constexpr, N_KEYS: tl.constexpr, KNN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    block = tl.program_id(0)
    head = tl.program_id(1)
    rows = block * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    d = tl.arange(0, D_PAD)
    ok = row_ok[:, None] & (d[None, :] < HALF)
    q_rows = q_ptr + (rows[:, None] * heads + head) * (2 * HALF) + d[None, :]
    q1 = tl.load(q_rows, mask=ok, other=0.0).to(tl.float32)
    q2 = tl.load(q_rows + HALF, mask=ok, other=0.0).to(tl.float32)
    grad1 = tl.zeros((BLOCK, D_PAD), tl.float32)
    grad2 = tl.zeros((BLOCK, D_PAD), tl.float32)
    keys1 = keys_ptr + head * 2 * N_KEYS * HALF
    keys2 = keys1 + N_KEYS * HALF
    grad_keys1 = grad_keys_ptr + head * 2 * N_KEYS * HALF
    grad_keys2 = grad_keys1 + N_KEYS * HALF
    for k in range(KNN):
        at = (rows * heads + head) * KNN + k
        index = tl.load(index_ptr + at, mask=row_ok, other=0)
        g = tl.load(grad_scores_ptr + at, mask=row_ok, other=0.0).to(tl.float32)
        a = (index // N_KEYS)[:, None] * HALF + d[None, :]
        b = (index % N_KEYS)[:, None] * HALF + d[None, :]
        grad1 += g[:, None] * tl.load(keys1 + a, mask=ok, other=0.0).to(tl.float32)
        grad2 += g[:, None] * tl.load(keys2 + b, mask=ok, other=0.0).to(tl.float32)
        tl.atomic_add(grad_keys1 + a, g[:, None] * q1, mask=ok, sem="relaxed")
        tl.atomic_add(grad_keys2 + b, g[:, None] * q2, mask=ok, sem="relaxed")
    tl.store(grad_q_ptr + (rows[:, None] * heads + head) * (2 * HALF) + d[None, :], grad1, mask=ok)
    tl.store(grad_q_ptr + (rows[:, None] * heads + head) * (2 * HALF) + HALF + d[None, :], grad2, mask=ok)


# ---------------------------------------------------------------- launching


@functools.lru_cache(maxsize=None)
def candidate_pairs(knn):
    """(i, j) with (i + 1)(j + 1) <= knn, in order: the only pairs that can be among the knn best."""
    pairs = [(i, j) for i in range(knn) for j in range(knn) if (i + 1) * (j + 1) <= knn]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


_PAIR_TABLES: dict = {}


def _pair_tables(knn, device):
    key = (knn, str(device))
    if key not in _PAIR_TABLES:
        first, second = candidate_pairs(knn)
        _PAIR_TABLES[key] = (torch.tensor(first, dtype=torch.int32, device=device),
                             torch.tensor(second, dtype=torch.int32, device=device))
    return _PAIR_TABLES[key]


def _meta(n_keys, half, knn):
    n_pad, d_pad = max(16, triton.next_power_of_2(n_keys)), max(16, triton.next_power_of_2(half))
    pairs = len(candidate_pairs(knn)[0])
    return dict(HALF=half, D_PAD=d_pad, N_KEYS=n_keys, N_PAD=n_pad,
                KNN=knn, K_PAD=triton.next_power_of_2(knn), PAIRS=pairs, PAIRS_PAD=triton.next_power_of_2(pairs),
                BLOCK=BLOCK_T, CHUNK=min(n_pad, max(min(128, CHUNK_ELEMENTS // d_pad), triton.next_power_of_2(knn))),
                LOG_N=n_pad.bit_length() - 1)


@torch.library.custom_op("languini::product_key_search", mutates_args=())
def _search_op(queries: torch.Tensor, sub_keys: torch.Tensor, knn: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, heads, _ = queries.shape
    _, _, n_keys, half = sub_keys.shape
    scores = torch.empty(n_rows, heads, knn, dtype=torch.float32, device=queries.device)
    index = torch.empty(n_rows, heads, knn, dtype=torch.int64, device=queries.device)
    if n_rows:
        meta = _meta(n_keys, half, knn)
        blocks = triton.cdiv(n_rows, BLOCK_T)
        scratch_score = torch.empty(blocks * heads * 2 * BLOCK_T * meta["K_PAD"], dtype=torch.float32,
                                    device=queries.device)
        scratch_key = torch.empty(scratch_score.shape, dtype=torch.int32, device=queries.device)
        pair_i, pair_j = _pair_tables(knn, queries.device)
        product_key_search_fwd_kernel[(blocks, heads)](queries, sub_keys, scores, index, scratch_score, scratch_key,
                                                       pair_i, pair_j, n_rows, heads, num_warps=WARPS, **meta)
    return scores, index


@_search_op.register_fake
def _(queries, sub_keys, knn):
    shape = (queries.shape[0], queries.shape[1], knn)
    return queries.new_empty(shape, dtype=torch.float32), queries.new_empty(shape, dtype=torch.int64)


@torch.library.custom_op("languini::product_key_search_backward", mutates_args=())
def _search_backward_op(queries: torch.Tensor, sub_keys: torch.Tensor, index: torch.Tensor,
                        grad_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, heads, knn = index.shape
    _, _, n_keys, half = sub_keys.shape
    grad_queries = torch.empty(queries.shape, dtype=torch.float32, device=queries.device)
    grad_keys = torch.zeros(sub_keys.shape, dtype=torch.float32, device=sub_keys.device)
    if n_rows:
        product_key_search_bwd_kernel[(triton.cdiv(n_rows, BLOCK_T), heads)](
            queries, sub_keys, index, grad_scores, grad_queries, grad_keys, n_rows, heads, HALF=half,
            D_PAD=max(16, triton.next_power_of_2(half)), N_KEYS=n_keys, KNN=knn, BLOCK=BLOCK_T, num_warps=4)
    return grad_queries, grad_keys


@_search_backward_op.register_fake
def _(queries, sub_keys, index, grad_scores):
    return (queries.new_empty(queries.shape, dtype=torch.float32),
            sub_keys.new_empty(sub_keys.shape, dtype=torch.float32))


class ProductKeySearch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, queries, sub_keys, knn):
        scores, index = torch.ops.languini.product_key_search(queries, sub_keys, knn)
        ctx.save_for_backward(queries, sub_keys, index)
        ctx.mark_non_differentiable(index)
        return scores, index

    @staticmethod
    def backward(ctx, grad_scores, _):
        queries, sub_keys, index = ctx.saved_tensors
        grad_queries, grad_keys = torch.ops.languini.product_key_search_backward(
            queries, sub_keys, index, grad_scores.contiguous())
        return grad_queries.to(queries.dtype), grad_keys.to(sub_keys.dtype), None


def product_key_topk_triton(queries, sub_keys, knn):
    """naive.product_key_topk_reference by the kernels: scores fp32 [R, heads, knn] (descending) and indices
    int64 [R, heads, knn]; queries and sub_keys fp32 or bf16, on CUDA (or CPU under TRITON_INTERPRET=1)."""
    check_inputs(queries, sub_keys, knn)
    if sub_keys.shape[2] > 2**16:
        raise ValueError(f"the kernels pack a memory index in 32 bits: n_keys at most 2^16, got {sub_keys.shape[2]}")
    return ProductKeySearch.apply(queries.contiguous(), sub_keys.contiguous(), knn)
