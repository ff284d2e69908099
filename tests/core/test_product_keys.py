"""The product-key search of languini/ops/product_keys (pkm_gpt's memory and peer_gpt's expert retrieval): the Triton
kernels (interpreter on CPU) and the reference against a brute-force search over all n_keys^2 product keys in float64,
with the gradients by their formula."""

import pytest
import torch

from languini.ops.product_keys import product_key_topk
from languini.ops.product_keys.triton import candidate_pairs

# (rows R, heads, k_dim, n_keys, knn): odd sizes everywhere; n_keys above one chunk of 128 and not a power of two
SHAPES = [pytest.param((23, 3, 6, 7, 4), id="R23-h3-k6-n7-knn4"),
          pytest.param((5, 1, 10, 131, 5), id="R5-h1-k10-n131-knn5"),
          pytest.param((3, 1, 34, 9, 9), id="R3-h1-k34-n9-knn9")]


def full_scores(queries, sub_keys):
    """[R, heads, n_keys^2] float64 scores of every product key i1 * n_keys + i2 (brute force)."""
    halves = queries.double().unflatten(-1, (2, -1))
    half = torch.einsum("rhsd,hsnd->rhsn", halves, sub_keys.double())
    return (half[:, :, 0, :, None] + half[:, :, 1, None, :]).flatten(-2)


def check_is_top_k(scores, indices, queries, sub_keys, knn, tolerance):
    """scores are the knn best of all product keys, descending; each index is distinct, in range, with its score."""
    every = full_scores(queries, sub_keys)
    n = every.shape[-1]
    assert indices.dtype == torch.int64 and ((indices >= 0) & (indices < n)).all()
    assert (indices.sort(-1).values.diff(dim=-1) != 0).all()
    assert (scores.diff(dim=-1) <= 0).all()
    expected = every.topk(knn, dim=-1).values
    torch.testing.assert_close(scores.double(), expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(every.gather(-1, indices), expected, atol=tolerance, rtol=tolerance)


def gradients_by_formula(queries, sub_keys, indices, grad_scores):
    """score_k = q_1 . key1[a_k] + q_2 . key2[b_k]: its gradients to the queries and the sub-keys, float64."""
    n_keys, half = sub_keys.shape[2], sub_keys.shape[3]
    heads = torch.arange(queries.shape[1])[None, :, None]
    a, b = indices // n_keys, indices % n_keys
    keys = sub_keys.double()
    g = grad_scores.double()[..., None]
    grad_q = torch.cat([(g * keys[heads, 0, a]).sum(2), (g * keys[heads, 1, b]).sum(2)], dim=-1)
    grad_keys = torch.zeros(sub_keys.shape, dtype=torch.float64)
    q = queries.double()
    grad_keys[:, 0].index_put_((heads.expand_as(a), a), g * q[:, :, None, :half], accumulate=True)
    grad_keys[:, 1].index_put_((heads.expand_as(b), b), g * q[:, :, None, half:], accumulate=True)
    return grad_q, grad_keys


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("use_triton", [True, False], ids=["triton", "reference"])
@pytest.mark.parametrize("shape", SHAPES)
def test_search_finds_the_best_product_keys_with_their_gradients(shape, use_triton, dtype, device):
    rows, heads, k_dim, n_keys, knn = shape
    g = torch.Generator().manual_seed(sum(shape))
    queries = torch.randn(rows, heads, k_dim, generator=g).to(dtype)  # bf16 inputs: loaded, converted at once
    sub_keys = torch.randn(heads, 2, n_keys, k_dim // 2, generator=g).to(dtype)
    q, k = queries.to(device).requires_grad_(), sub_keys.to(device).requires_grad_()
    scores, indices = product_key_topk(q, k, knn, use_triton=use_triton)
    assert scores.dtype == torch.float32 and scores.shape == indices.shape == (rows, heads, knn)
    check_is_top_k(scores.cpu(), indices.cpu(), queries, sub_keys, knn, tolerance=1e-5)
    grad_scores = torch.randn(scores.shape, generator=g)
    scores.backward(grad_scores.to(device))
    expected_q, expected_keys = gradients_by_formula(queries, sub_keys, indices.cpu(), grad_scores)
    assert q.grad.dtype == dtype and k.grad.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # a bf16 gradient is rounded once
    torch.testing.assert_close(q.grad.cpu().double(), expected_q, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(k.grad.cpu().double(), expected_keys, atol=tolerance, rtol=tolerance)


def test_ties_still_give_the_best_scores(device):
    """Sub-keys and queries of small integers: many product keys share a score, also at the knn-th place."""
    g = torch.Generator().manual_seed(3)
    queries = torch.randint(-1, 2, (19, 2, 8), generator=g).float()
    sub_keys = torch.randint(-1, 2, (2, 2, 11, 4), generator=g).float()
    queries[0] = 0.0  # every product key scores 0
    scores, indices = product_key_topk(queries.to(device), sub_keys.to(device), 6, use_triton=True)
    check_is_top_k(scores.cpu(), indices.cpu(), queries, sub_keys, 6, tolerance=0)  # small integers: exact sums
    # equal scores rank the lower memory index first: a zero query ties all 121 product keys
    for head in (0, 1):
        assert torch.equal(indices[0, head].cpu(), torch.arange(6))


def test_nan_queries_read_in_range(device):
    g = torch.Generator().manual_seed(4)
    queries = torch.randn(5, 2, 6, generator=g)
    queries[1, 0, 2] = float("nan")
    queries[3, 1] = float("inf")
    sub_keys = torch.randn(2, 2, 7, 3, generator=g)
    for use_triton in (True, False):
        scores, indices = product_key_topk(queries.to(device), sub_keys.to(device), 4, use_triton=use_triton)
        assert ((indices >= 0) & (indices < 49)).all()
        assert scores[1, 0].isnan().any() and scores[0].isfinite().all()


def test_only_pairs_within_the_hyperbola_can_win():
    """(i + 1)(j + 1) <= knn: pair (i, j) is beaten by every pair at or above it in both halves."""
    first, second = candidate_pairs(32)
    assert len(first) == sum(32 // (i + 1) for i in range(32))  # 119
    assert all(j < 32 // (i + 1) for i, j in zip(first, second))
    # the brute force agrees: over random sorted halves, the knn best of all knn^2 sums lie among the pairs
    g = torch.Generator().manual_seed(5)
    s1 = torch.randn(200, 32, generator=g).sort(-1, descending=True).values
    s2 = torch.randn(200, 32, generator=g).sort(-1, descending=True).values
    best = (s1[:, :, None] + s2[:, None, :]).flatten(1).topk(32, -1).indices
    allowed = set(zip(first, second))
    assert all((i // 32, i % 32) in allowed for i in best.flatten().tolist())
