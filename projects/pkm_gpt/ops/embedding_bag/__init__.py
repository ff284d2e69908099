"""Weighted embedding bag, out[r] = sum_j weights[r, j] * values[indices[r, j]]: naive.py (reference, CPU path)
and triton.py (kernels), chosen by `embedding_bag`."""

from projects.pkm_gpt.ops.embedding_bag.naive import check_inputs, embedding_bag_reference


def embedding_bag(values, indices, weights, use_triton=None, value_grad="atomic", sparse_values=False):
    """Weighted embedding bag; Triton when `use_triton` (default: when values are on a GPU).

    Args and Returns: see triton.embedding_bag_triton (value_grad matters only on the Triton path).
    """
    if use_triton is None:
        use_triton = values.is_cuda
    if use_triton:
        from projects.pkm_gpt.ops.embedding_bag.triton import embedding_bag_triton  # the reference needs no Triton

        return embedding_bag_triton(values, indices, weights, value_grad, sparse_values)
    check_inputs(values, indices, weights)
    return embedding_bag_reference(values, indices, weights, sparse_values)
