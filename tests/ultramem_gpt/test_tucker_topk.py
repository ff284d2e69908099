"""The top-k cells of the TDQKR candidate grid: both paths against a brute force over every cell of the grid
rows[a]^T core cols[b] computed one cell at a time in float64, on odd sizes (candidates and knn off the kernel's
powers of two, ranks 1-3), fp32 and bf16 scores; the kernel under the Triton interpreter on CPU."""

import pytest
import torch

from projects.ultramem_gpt.ops.tucker_topk import tucker_grid, tucker_topk

# (tokens, row candidates K1, column candidates K2, rank r, knn), dtype of the row and column scores; the large
# grids with one token (the interpreter's top-k network takes seconds a program)
CASES = [pytest.param((3, 5, 7, 3, 9), torch.float32, id="R3-K5x7-r3-knn9-fp32"),
         pytest.param((3, 5, 7, 3, 9), torch.bfloat16, id="R3-K5x7-r3-knn9-bf16"),
         pytest.param((1, 33, 17, 2, 32), torch.float32, id="R1-K33x17-r2-knn32-fp32"),
         pytest.param((4, 1, 6, 1, 1), torch.float32, id="R4-K1x6-r1-knn1-fp32"),
         pytest.param((1, 16, 16, 2, 256), torch.bfloat16, id="R1-K16x16-all-bf16")]


def random_inputs(tokens, k1, k2, rank, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, k1, rank, generator=g).to(dtype),
            torch.randn(tokens, k2, rank, generator=g).to(dtype), torch.randn(rank, rank, generator=g))


def every_cell(rows, cols, core):
    """[R, K1, K2] float64: sum_p sum_q rows[t, a, p] core[p, q] cols[t, b, q] for every cell, as one sum over the
    r^2 outer products (not the two matrix products of tucker_grid)."""
    rows, cols, core = rows.double(), cols.double(), core.double()
    return sum(core[p, q] * rows[:, :, p, None] * cols[:, None, :, q] for p in range(core.shape[0])
               for q in range(core.shape[1]))


@pytest.mark.parametrize("shape, dtype", CASES)
def test_grid_and_top_cells_match_a_brute_force_over_every_cell(shape, dtype, device):
    tokens, k1, k2, rank, knn = shape
    rows, cols, core = random_inputs(tokens, k1, k2, rank, dtype, seed=sum(shape))
    grid = every_cell(rows, cols, core)
    torch.testing.assert_close(tucker_grid(rows.double(), cols.double(), core.double()), grid, rtol=1e-12,
                               atol=1e-12)
    best = grid.flatten(1).topk(knn, dim=1)
    for impl in ("naive", "triton"):
        row_pos, col_pos = tucker_topk(rows.to(device), cols.to(device), core.to(device), knn, impl=impl)
        assert row_pos.dtype == col_pos.dtype == torch.int64 and row_pos.shape == (tokens, knn)
        # the same cells in the same order (random scores: no ties at fp32; fp32 sums of r^2 products rank them
        # as float64 does unless two cells are within a few ulps, which these draws avoid)
        assert torch.equal((row_pos * k2 + col_pos).cpu(), best.indices), impl


def test_kernel_ranks_the_lower_cell_first_on_equal_scores(device):
    rows, cols, _ = random_inputs(2, 3, 5, 2, torch.float32, seed=1)
    row_pos, col_pos = tucker_topk(rows.to(device), cols.to(device), torch.zeros(2, 2, device=device), 7,
                                   impl="triton")  # every cell scores 0
    assert (row_pos * 5 + col_pos).tolist() == [list(range(7))] * 2


def test_empty_batch_and_bad_inputs(device):
    rows = torch.zeros(0, 4, 2, device=device)
    row_pos, _ = tucker_topk(rows, rows, torch.eye(2, device=device), 3, impl="triton")
    assert row_pos.shape == (0, 3)
    rows, cols, core = random_inputs(2, 3, 4, 2, torch.float32, seed=0)
    for bad in [dict(knn=13), dict(core=torch.eye(3)), dict(cols=cols[:, :, :1]), dict(impl="cuda")]:
        args = {**dict(rows=rows, cols=cols, core=core, knn=2), **bad}
        with pytest.raises(ValueError):
            tucker_topk(**args)
