"""The K words of a memory nearest to each query by cosine similarity, in plain PyTorch: the reference of the
Triton kernel (triton.py) and the CPU path of the exact index.

A word that is all zeros (never written, or erased and not written since) has no direction: it scores EMPTY,
below every cosine, so it is read only while fewer than K words hold something.
"""
import torch

EMPTY = -2.0  # the similarity of an all-zero word: below any cosine (>= -1)


def cosine_similarity(query: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """(B, H, N) cosine similarity of each of the H queries (B, H, W) with every word of memory (B, N, W); EMPTY
    for all-zero words. No gradient (in place, so that a step holds one (B, H, N) array, not four)."""
    q = query / query.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    norms = memory.norm(dim=-1)[:, None, :]  # (B, 1, N)
    scores = torch.einsum("bhw,bnw->bhn", q, memory)
    return scores.div_(norms.clamp_min(1e-30)).masked_fill_(norms == 0, EMPTY)


def cosine_topk_naive(query: torch.Tensor, memory: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(similarities (B, H, k) in descending order, word indices (B, H, k) int64) of the k most similar words."""
    return cosine_similarity(query, memory).topk(k, dim=-1)
