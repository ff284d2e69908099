"""The exact K-nearest-word search of SAM's read (naive.py holds the reference) as a Triton kernel.

One program scores a block of BLOCK_N words against one query (cosine similarity; all-zero words score EMPTY)
and keeps the block's K best by K rounds of max and mask (lowest index first among equals); the host then picks
the K best of all blocks' candidates with torch.topk. The search has no gradient (SAM recomputes the K chosen
similarities in PyTorch), so the launch is a torch.library custom op, opaque to torch.compile, without autograd.
"""
import torch
import triton
import triton.language as tl

from projects.sam.ops.topk.naive import EMPTY

BLOCK_N = 128  # words per program


@triton.jit
def sam_topk_block_kernel(q_ptr, mem_ptr, cand_val_ptr, cand_idx_ptr, H, N, W, n_blocks,
                          EMPTY_SCORE: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_W: tl.constexpr):
    query = tl.program_id(0).to(tl.int64)  # b * H + h
    block = tl.program_id(1)
    batch = query // H
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_W)
    row_ok, col_ok = rows < N, cols < W
    q = tl.load(q_ptr + query * W + cols, mask=col_ok, other=0.0).to(tl.float32)
    words = tl.load(mem_ptr + batch * N * W + rows[:, None].to(tl.int64) * W + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    dots = tl.sum(words * q[None, :], axis=1)
    norms = tl.sqrt(tl.sum(words * words, axis=1))
    score = tl.where(norms > 0, dots / tl.where(norms > 0, norms, 1.0), EMPTY_SCORE)
    score = tl.where(row_ok, score, float("-inf"))
    out = (query * n_blocks + block) * K
    for j in tl.static_range(K):
        best = tl.max(score, axis=0)
        index = tl.min(tl.where(score == best, rows, 2147483647), axis=0)  # the lowest index among equals
        tl.store(cand_val_ptr + out + j, best)
        tl.store(cand_idx_ptr + out + j, index)
        score = tl.where(rows == index, float("-inf"), score)


@torch.library.custom_op("sam::cosine_topk", mutates_args=())
def cosine_topk_op(query: torch.Tensor, memory: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (B, H, k) fp32, indices (B, H, k) int64) from a unit-norm fp32 query (B, H, W) and memory (B, N, W)."""
    B, H, W = query.shape
    N = memory.shape[1]
    n_blocks = triton.cdiv(N, BLOCK_N)
    cand_val = torch.empty(B, H, n_blocks * k, device=query.device, dtype=torch.float32)
    cand_idx = torch.empty(B, H, n_blocks * k, device=query.device, dtype=torch.int32)
    sam_topk_block_kernel[(B * H, n_blocks)](query, memory, cand_val, cand_idx, H, N, W, n_blocks,
                                             EMPTY_SCORE=EMPTY, K=k, BLOCK_N=BLOCK_N,
                                             BLOCK_W=triton.next_power_of_2(W))
    values, positions = cand_val.topk(k, dim=-1)
    return values, cand_idx.gather(-1, positions).long()


@cosine_topk_op.register_fake
def _(query, memory, k):
    B, H, _ = query.shape
    return query.new_empty(B, H, k), query.new_empty(B, H, k, dtype=torch.int64)


def cosine_topk_triton(query: torch.Tensor, memory: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k words of memory most similar to each query by cosine, as cosine_topk_naive, by the Triton kernel.

    Args:
        query: (B, H, W) queries, any float dtype (their norm does not matter).
        memory: (B, N, W) words, N >= k; all-zero words score EMPTY.
        k: words per query (at most 16: the kernel unrolls k rounds).
    Returns:
        (similarities (B, H, k) fp32 in descending order, word indices (B, H, k) int64); no gradient.
    """
    if memory.shape[1] < k:
        raise ValueError(f"the memory holds {memory.shape[1]} words, fewer than k={k}")
    q = query.detach().float()
    q = (q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)).contiguous()
    return torch.ops.sam.cosine_topk(q, memory.detach().contiguous(), k)
