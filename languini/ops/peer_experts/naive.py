"""PEER's expert computation in plain PyTorch: the reference of the kernels in triton.py, and the CPU path."""

import torch
import torch.nn.functional as F


# With at most this many experts per expert read per row, the CPU path computes every expert's input by one matrix
# product: N / M times the multiply-adds, but 5x faster than the gathered products at N = 529, M = 96 and 1.7x at
# N = 4,096 (a forward and backward of R = 2,048 rows, d = 128, one thread of the 2-core CPU); 3.5x slower at
# N = 32,761.
EVERY_EXPERT_UP_TO = 32


def peer_experts_reference(x, down, up, indices, weights, every_expert=None):
    """out[r] = sum_j weights[r, j] * gelu(down[indices[r, j]] . x[r]) * up[indices[r, j]], accumulated in fp32
    (float64 for float64 inputs).

    Each expert i is one hidden neuron with its down vector down[i] and up vector up[i] (He 2024, eq. 6); the GELU
    is GPT-2's (tanh approximation), as in the MLP a PEER layer replaces.

    Args:
        x: [R, d] one input row per token; down, up: [N, d] the experts' vectors; indices: int64 [R, M] the experts
        each row reads (every head's, flattened); weights: [R, M] their router scores.
        every_expert: each row's input to every expert by one matrix product, then the chosen ones picked, instead
            of products with the gathered down vectors (the same numbers up to rounding); None: when N is at most
            EVERY_EXPERT_UP_TO x M.
    Returns:
        [R, d] in the promoted dtype of x, down, up and weights.
    """
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, down.dtype), torch.promote_types(up.dtype,
                                                                                                 weights.dtype))
    acc = torch.promote_types(out_dtype, torch.float32)  # fp32, or float64 for float64 inputs
    if every_expert is None:
        every_expert = down.shape[0] <= EVERY_EXPERT_UP_TO * indices.shape[1]
    # Tables cast before the reads, so that the backward also accumulates in fp32. F.embedding's backward, matrix
    # products and the embedding bag are several times faster on CPU than indexing and sums. DeepSpeed's profiler
    # counts none of them (torch.linalg.matmul is torch.matmul under a name it does not patch), so the model's
    # extra_flops holds the experts' FLOPs (those of the gathered products) on either path.
    if every_expert:
        pre = torch.linalg.matmul(x.to(acc), down.to(acc).T).gather(1, indices)  # [R, M]: the chosen neurons' inputs
    else:
        pre = torch.linalg.matmul(F.embedding(indices, down.to(acc)), x.to(acc).unsqueeze(-1)).squeeze(-1)
    coef = weights.to(acc) * F.gelu(pre, approximate="tanh")
    return F.embedding_bag(indices, up.to(acc), per_sample_weights=coef, mode="sum").to(out_dtype)


def check_inputs(x, down, up, indices, weights):
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a floating [R, d] tensor, got {x.dtype} {tuple(x.shape)}")
    for name, table in (("down", down), ("up", up)):
        if table.dim() != 2 or not table.is_floating_point() or table.shape[1] != x.shape[1]:
            raise ValueError(f"{name} must be a floating [N, d={x.shape[1]}] table, got {table.dtype} "
                             f"{tuple(table.shape)}")
    if down.shape != up.shape:
        raise ValueError(f"down and up must have one shape, got {tuple(down.shape)} and {tuple(up.shape)}")
    if indices.dim() != 2 or indices.dtype != torch.int64 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices must be int64 [R={x.shape[0]}, M], got {indices.dtype} {tuple(indices.shape)}")
    if weights.shape != indices.shape or not weights.is_floating_point():
        raise ValueError(f"weights must be floating with the shape of indices {tuple(indices.shape)}, got "
                         f"{weights.dtype} {tuple(weights.shape)}")
    if len({t.device for t in (x, down, up, indices, weights)}) != 1:
        raise ValueError("x, down, up, indices and weights must be on one device")
