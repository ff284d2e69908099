"""The top-k cells of the TDQKR candidate grid by one Triton kernel (naive.tucker_topk_naive is the reference).

ultramem_gpt_tucker_topk_kernel, one program per token: the grid rows[a]^T core cols[b] over the K1 x K2 candidate
cells, built in registers as sum_q (sum_p rows[:, p] core[p, q]) outer cols[:, q] (r^2 + r K1 K2 multiply-adds;
r is small: 2 in the papers), never written to memory; then its knn best by tl.topk (a bitonic network) on 64-bit
keys that pack the fp32 score's bits (order-preserving) over the reversed cell number, so that a key carries its
cell and equal scores rank the lower cell a * K2 + b first. Out: the cells' row and column positions, int64.
No gradient: the model recomputes the chosen cells' scores (ops/tucker_topk/__init__.py). The launch is a
torch.library custom op (ultramem_gpt::tucker_topk), opaque to torch.compile.
"""
import torch
import triton
import triton.language as tl

from projects.ultramem_gpt.ops.tucker_topk.naive import check_inputs

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def ultramem_gpt_tucker_topk_kernel(rows_ptr, cols_ptr, core_ptr, row_pos_ptr, col_pos_ptr, K1, K2, knn,
                                    RANK: tl.constexpr, K1_PAD: tl.constexpr, K2_PAD: tl.constexpr,
                                    KNN_PAD: tl.constexpr, LOG_K2: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    a = tl.arange(0, K1_PAD)
    b = tl.arange(0, K2_PAD)
    a_ok = a < K1
    b_ok = b < K2
    grid = tl.zeros([K1_PAD, K2_PAD], dtype=tl.float32)
    for q in tl.static_range(RANK):
        row_times_core = tl.zeros([K1_PAD], dtype=tl.float32)  # (rows @ core)[:, q]
        for p in tl.static_range(RANK):
            row_p = tl.load(rows_ptr + (token * K1 + a) * RANK + p, mask=a_ok, other=0.0).to(tl.float32)
            row_times_core += row_p * tl.load(core_ptr + p * RANK + q).to(tl.float32)
        col_q = tl.load(cols_ptr + (token * K2 + b) * RANK + q, mask=b_ok, other=0.0).to(tl.float32)
        grid += row_times_core[:, None] * col_q[None, :]
    grid = tl.where(a_ok[:, None] & b_ok[None, :], grid, NEG_INF)
    # cell a * K2_PAD + b, reversed so that the larger low bits (a lower cell) win ties
    cell = a[:, None] * K2_PAD + b[None, :]
    bits = grid.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    keys = (ordered.to(tl.int64) << 32) | ((K1_PAD * K2_PAD - 1) - cell).to(tl.int64)
    best = tl.topk(tl.reshape(keys, (1, K1_PAD * K2_PAD)), KNN_PAD)
    cell = (K1_PAD * K2_PAD - 1) - (best & 0xFFFFFFFF)
    slots = tl.arange(0, KNN_PAD)[None, :]
    ok = slots < knn
    tl.store(row_pos_ptr + token * knn + slots, cell >> LOG_K2, mask=ok)
    tl.store(col_pos_ptr + token * knn + slots, cell & (K2_PAD - 1), mask=ok)


@torch.library.custom_op("ultramem_gpt::tucker_topk", mutates_args=())
def _tucker_topk_op(rows: torch.Tensor, cols: torch.Tensor, core: torch.Tensor,
                    knn: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_tokens, k1, rank = rows.shape
    k2 = cols.shape[1]
    row_pos = torch.empty(n_tokens, knn, dtype=torch.int64, device=rows.device)
    col_pos = torch.empty(n_tokens, knn, dtype=torch.int64, device=rows.device)
    if n_tokens:
        k2_pad = triton.next_power_of_2(k2)
        ultramem_gpt_tucker_topk_kernel[(n_tokens,)](
            rows, cols, core, row_pos, col_pos, k1, k2, knn, RANK=rank, K1_PAD=triton.next_power_of_2(k1),
            K2_PAD=k2_pad, KNN_PAD=triton.next_power_of_2(knn), LOG_K2=k2_pad.bit_length() - 1)
    return row_pos, col_pos


@_tucker_topk_op.register_fake
def _(rows, cols, core, knn):
    return (rows.new_empty(rows.shape[0], knn, dtype=torch.int64),
            rows.new_empty(rows.shape[0], knn, dtype=torch.int64))


def tucker_topk_triton(rows, cols, core, knn):
    """naive.tucker_topk_naive by the kernel.

    Args:
        rows: [R, K1, r], cols: [R, K2, r] (any floating dtype, read as fp32), core: [r, r]; knn <= K1 x K2; on
        CUDA (or on CPU under TRITON_INTERPRET=1).
    Returns:
        (row positions, column positions), int64 [R, knn], best first; equal scores: the lower a * K2 + b first.
    """
    check_inputs(rows, cols, core, knn)
    return torch.ops.ultramem_gpt.tucker_topk(rows.detach().contiguous(), cols.detach().contiguous(),
                                              core.detach().contiguous(), knn)
