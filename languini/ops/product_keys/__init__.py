"""The product-key search (the best knn of n_keys^2 product keys per query and head; Lample et al. 2019), read by
pkm_gpt's memory and peer_gpt's expert retrieval: naive.py (reference, CPU path) and triton.py (kernels), chosen by
`product_key_topk`."""

import torch

from languini.ops.product_keys.naive import check_inputs, product_key_topk_reference


def product_key_topk(queries, sub_keys, knn, use_triton=None):
    """scores [R, heads, knn] (descending, fp32 or wider) and indices int64 [R, heads, knn] = i1 * n_keys + i2.

    queries [R, heads, k_dim], sub_keys [heads, 2, n_keys, k_dim / 2]; differentiable in both. Triton when
    `use_triton` (default: when the queries are on a GPU); float64 always takes the reference.
    """
    if use_triton is None:
        use_triton = queries.is_cuda
    if use_triton and torch.float64 not in (queries.dtype, sub_keys.dtype):
        from languini.ops.product_keys.triton import product_key_topk_triton  # the reference needs no Triton

        return product_key_topk_triton(queries, sub_keys, knn)
    check_inputs(queries, sub_keys, knn)
    return product_key_topk_reference(queries, sub_keys, knn)
