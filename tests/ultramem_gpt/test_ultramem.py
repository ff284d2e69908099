"""The UltraMemV2 layer against brute force: its key scores by hand, its TDQKR scores against the dense grid
S_row^T C S_col over all n_keys^2 cells, its top-k against a brute-force top-k over all cells where the rank-one
search is exact (rank 1, non-negative scores) and against the best of the candidate cells otherwise, its output
against a loop over the chosen values, gradcheck in float64, and the Triton path against the reference path."""

import math

import numpy as np
import pytest
import torch

from projects.ultramem_gpt.ultramem import UltraMemV2, tdqkr_search, ultramem_layer
from tests.memory_gpt import assert_runs_close, reference_and_triton_runs

# 7 keys a side (49 values), 4 read per token, queries of 6, values of 5, rank 2, width 9: odd sizes
SIZES = dict(n_keys=7, knn=4, k_dim=6, value_dim=5, rank=2)
D = 9


def layer_and_input(seed=0, dtype=torch.float64, rows=(2, 3), **options):
    torch.manual_seed(seed)
    layer = UltraMemV2(D, **{**SIZES, **options}).to(dtype)
    for p in layer.parameters():  # larger than the init, so that every part moves the output visibly
        torch.nn.init.normal_(p, std=0.5)
    return layer, torch.randn(*rows, D, dtype=dtype)


def normalised(z, norm):
    return (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + norm.eps) \
        * norm.weight + norm.bias


def gelu_tanh(z):
    return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def dense_grid(row_scores, col_scores, core):
    """[R, n, n]: S_row[i]^T C S_col[j] for every cell, one (p, q) term of the core at a time."""
    rank = core.shape[0]
    return sum(core[p, q] * row_scores[:, :, p, None] * col_scores[:, None, :, q] for p in range(rank)
               for q in range(rank))


def test_key_scores_are_the_normalised_queries_dot_the_normalised_keys():
    layer, x = layer_and_input()
    tokens = x.flatten(0, -2)
    row_scores, col_scores = layer.key_scores(tokens)
    query = tokens @ layer.query_proj.weight.T
    k = SIZES["k_dim"]
    for half, scores in enumerate((row_scores, col_scores)):
        q = normalised(query[:, half * k:(half + 1) * k], layer.query_norm)
        for p in range(SIZES["rank"]):
            keys = normalised(layer.keys[half, p], layer.key_norm)  # [n_keys, k_dim]
            torch.testing.assert_close(scores[:, :, p], q @ keys.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("triton", [False, True], ids=["naive", "triton"])
def test_rank_one_search_with_non_negative_scores_is_the_top_k_over_all_cells(triton, device):
    g = torch.Generator().manual_seed(1)
    rows, n, knn = 3, 9, 5
    row_scores, col_scores = torch.rand(rows, n, 1, generator=g), torch.rand(rows, n, 1, generator=g)
    core = torch.tensor([[0.7]])
    indices, scores = tdqkr_search(row_scores.to(device), col_scores.to(device), core.to(device), knn, triton=triton)
    best = dense_grid(row_scores.double(), col_scores.double(), core.double()).flatten(1).topk(knn, dim=1)
    assert torch.equal(indices.cpu(), best.indices)
    torch.testing.assert_close(scores.cpu().double(), best.values, rtol=1e-6, atol=1e-7)


def first_singular_directions(core):
    """(u, v) by numpy's SVD in float64, u's entry of largest magnitude positive."""
    left, _, right_t = np.linalg.svd(core.detach().double().numpy())
    sign = np.sign(left[np.abs(left[:, 0]).argmax(), 0])
    return torch.from_numpy(left[:, 0] * sign), torch.from_numpy(right_t[0] * sign)


@pytest.mark.parametrize("triton", [False, True], ids=["naive", "triton"])
def test_rank_two_search_reads_the_best_candidate_cells_with_their_dense_grid_scores(triton, device):
    g = torch.Generator().manual_seed(2)
    rows, n, knn, rank = 4, 11, 4, 2
    row_scores, col_scores = torch.randn(rows, n, rank, generator=g), torch.randn(rows, n, rank, generator=g)
    core = torch.randn(rank, rank, generator=g)
    indices, scores = tdqkr_search(row_scores.to(device), col_scores.to(device), core.to(device), knn, triton=triton)
    grid = dense_grid(row_scores.double(), col_scores.double(), core.double())  # [R, n, n]
    torch.testing.assert_close(scores.cpu().double(), grid.flatten(1).gather(1, indices.cpu()), rtol=1e-5,
                               atol=1e-6)
    # the candidates: the knn best rows by S_row u and columns by S_col v (u, v: C's first singular vectors)
    u, v = first_singular_directions(core)
    for t in range(rows):
        cand_rows = (row_scores[t].double() @ u).topk(knn).indices
        cand_cols = (col_scores[t].double() @ v).topk(knn).indices
        cells = [(grid[t, i, j].item(), i.item() * n + j.item()) for i in cand_rows for j in cand_cols]
        expected = [cell for _, cell in sorted(cells, reverse=True)[:knn]]
        assert indices[t].tolist() == expected


def test_output_is_a_loop_over_the_chosen_values():
    layer, x = layer_and_input()
    tokens = x.flatten(0, -2)
    indices, scores = layer.lookup(tokens)
    pre = tokens @ layer.pre_proj.weight.T
    expected = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        read = torch.zeros(SIZES["value_dim"], dtype=x.dtype)
        for j, i in enumerate(indices[t].tolist()):
            read = read + scores[t, j] * gelu_tanh(layer.pre_values[i] @ pre[t]) * layer.values[i]
        expected[t] = layer.out_proj.weight @ read
    torch.testing.assert_close(layer(x), expected.unflatten(0, x.shape[:-1]), rtol=1e-12, atol=1e-12)


def test_gradients_of_input_and_every_parameter_pass_gradcheck_in_float64():
    layer, x = layer_and_input(rows=(1, 2), n_keys=4, knn=3)
    names = [name for name, _ in layer.named_parameters()]

    def output(x, *params):
        return torch.func.functional_call(layer, dict(zip(names, params)), (x,))

    inputs = [x.requires_grad_(), *[p.detach().clone().requires_grad_() for p in layer.parameters()]]
    # the top-k and the core's singular vectors choose the values (no gradient); the scores and values are smooth.
    # fast_mode: the Jacobian along random directions (about 500 inputs one at a time take 20 s)
    assert torch.autograd.gradcheck(output, inputs, eps=1e-7, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_triton_path_gives_the_reference_output_and_gradients(sparse, device):
    layer, x = layer_and_input(dtype=torch.float32, sparse_values=sparse)
    reference, triton = reference_and_triton_runs(layer, x, device)
    assert layer.values.grad.layout == (torch.sparse_coo if sparse else torch.strided)
    assert_runs_close(reference, triton, tol=1e-5)  # fp32 sums of a few dozen terms of order 1-10


def test_the_width_and_size_constructor():
    layer = ultramem_layer(16, 1000)
    assert layer.n_keys == 32 and layer.num_values == 1024 and layer.k_dim == layer.value_dim == 4
    assert layer(torch.randn(2, 16)).shape == (2, 16)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="knn"):
        UltraMemV2(8, n_keys=4, knn=5)
    with pytest.raises(ValueError, match="rank"):
        UltraMemV2(8, n_keys=4, knn=2, rank=0)
