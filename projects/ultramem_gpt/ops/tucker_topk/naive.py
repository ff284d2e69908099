"""The top-k cells of a Tucker-decomposed candidate grid in plain PyTorch: the reference of triton.py, and the CPU
path.

A token's row candidates carry rank-r row scores rows[a] (r numbers each), its column candidates cols[b]; the score
of cell (a, b) is rows[a]^T core cols[b] (UltraMem, Huang et al. 2024, TDQKR: S_grid = S_row^T C
S_col restricted to the candidates).
"""
import torch


def tucker_grid(rows, cols, core):
    """[R, K1, K2]: grid[t, a, b] = rows[t, a] @ core @ cols[t, b], from rows [R, K1, r], cols [R, K2, r] and core
    [r, r], in their promoted dtype. torch.linalg.matmul: DeepSpeed's profiler counts none of it (the model's
    extra_flops does, as for the kernel)."""
    return torch.linalg.matmul(torch.linalg.matmul(rows, core), cols.transpose(1, 2))


@torch.no_grad()
def tucker_topk_naive(rows, cols, core, knn):
    """(row positions, column positions), each int64 [R, knn], of the knn best cells of each token's grid, best
    first; computed in fp32 (float64 for float64 inputs)."""
    acc = torch.promote_types(torch.promote_types(rows.dtype, cols.dtype), torch.float32)
    grid = tucker_grid(rows.to(acc), cols.to(acc), core.to(acc))
    flat = grid.flatten(1).topk(knn, dim=1).indices
    return flat // cols.shape[1], flat % cols.shape[1]


def check_inputs(rows, cols, core, knn):
    if rows.dim() != 3 or cols.dim() != 3 or rows.shape[0] != cols.shape[0]:
        raise ValueError(f"rows and cols must be [R, K, r] with one R, got {tuple(rows.shape)} and "
                         f"{tuple(cols.shape)}")
    rank = rows.shape[2]
    if cols.shape[2] != rank or core.shape != (rank, rank):
        raise ValueError(f"rows {tuple(rows.shape)}, cols {tuple(cols.shape)} and core {tuple(core.shape)} must "
                         f"share the rank r (core [r, r])")
    if not 1 <= knn <= rows.shape[1] * cols.shape[1]:
        raise ValueError(f"knn must be in [1, {rows.shape[1]} x {cols.shape[1]} cells], got {knn}")
    if not (rows.is_floating_point() and cols.is_floating_point() and core.is_floating_point()):
        raise ValueError("rows, cols and core must be floating")
    if len({rows.device, cols.device, core.device}) != 1:
        raise ValueError("rows, cols and core must be on one device")
