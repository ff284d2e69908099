"""Exact top-K cosine search over a memory: `cosine_topk(query, memory, k, impl)`; impl "naive" (PyTorch, the
CPU path) or "triton" (the kernel; None picks it for CUDA tensors)."""
import torch

from projects.sam.ops.topk.naive import EMPTY, cosine_similarity, cosine_topk_naive

IMPLS = ("naive", "triton")


def cosine_topk(query: torch.Tensor, memory: torch.Tensor, k: int, impl: str | None = None):
    """(similarities (B, H, k), indices (B, H, k)) of the k words of memory (B, N, W) nearest each query (B, H, W)."""
    impl = impl or ("triton" if memory.is_cuda else "naive")
    if impl == "triton":
        from projects.sam.ops.topk.triton import cosine_topk_triton

        return cosine_topk_triton(query, memory, k)
    if impl != "naive":
        raise ValueError(f"impl must be one of {IMPLS} or None, not {impl!r}")
    with torch.no_grad():
        return cosine_topk_naive(query.float(), memory.float(), k)


__all__ = ["EMPTY", "IMPLS", "cosine_similarity", "cosine_topk", "cosine_topk_naive"]
