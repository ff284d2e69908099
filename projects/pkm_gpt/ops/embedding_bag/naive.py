"""Weighted embedding bag in plain PyTorch: the reference and the CPU path (triton.py holds the kernels)."""

import torch

from languini.memory_layers import gather_rows


def embedding_bag_reference(values, indices, weights, sparse_values=False):
    """out[r] = sum_j weights[r, j] * values[indices[r, j]], accumulated in fp32.

    Args:
        values: [N, v_dim]; indices: int64 [R, k]; weights: [R, k].
        sparse_values: the value gradient is a coalesced sparse COO tensor of the rows read.
    Returns:
        [R, v_dim] in the promoted dtype of values and weights.
    """
    if sparse_values:
        return _reference_with_sparse_value_grad(values, indices, weights)
    out_dtype = torch.promote_types(values.dtype, weights.dtype)
    # Cast the table before gathering so that the backward scatter-add also accumulates in fp32.
    gathered = values.float()[indices]  # [R, k, v_dim]
    return (weights.float().unsqueeze(-1) * gathered).sum(dim=1).to(out_dtype)


@torch.compiler.disable  # a data-dependent row count and a sparse gradient: torch.compile cannot trace them
def _reference_with_sparse_value_grad(values, indices, weights):
    # The bag reads a small table of the rows read, whose (dense) gradient has one summed row per row read.
    rows_read, positions = torch.unique(indices, sorted=True, return_inverse=True)
    return embedding_bag_reference(gather_rows(values, rows_read), positions, weights)


def check_inputs(values, indices, weights):
    if values.dim() != 2 or not values.is_floating_point():
        raise ValueError(f"values must be a floating [N, v_dim] table, got {values.dtype} {tuple(values.shape)}")
    if indices.dim() != 2 or indices.dtype != torch.int64:
        raise ValueError(f"indices must be int64 [R, k], got {indices.dtype} {tuple(indices.shape)}; "
                         "convert with indices.long()")
    if weights.shape != indices.shape or not weights.is_floating_point():
        raise ValueError(f"weights must be floating with the shape of indices {tuple(indices.shape)}, "
                         f"got {weights.dtype} {tuple(weights.shape)}")
    if not (values.device == indices.device == weights.device):
        raise ValueError(f"values, indices and weights must be on one device, got "
                         f"{values.device}, {indices.device}, {weights.device}")
