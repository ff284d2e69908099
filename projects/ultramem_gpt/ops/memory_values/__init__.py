"""UltraMemV2's value read, PEER-style (v2 paper: "FFN-based value processing from PEER"):
out[r] = sum_j weights[r, j] * gelu(down[i_rj] . x[r]) * up[i_rj], x the pre-projected token, down the pre-values,
up the values, weights the TDQKR scores; naive.py (reference, CPU path) and triton.py (kernels), chosen by
`memory_values`. Copied from projects/peer_gpt/ops/peer_experts (projects never import each other), kernels
renamed."""

import torch

from languini.memory_layers import gather_rows
from projects.ultramem_gpt.ops.memory_values.naive import check_inputs, memory_values_reference


def memory_values(x, down, up, indices, weights, use_triton=None, sparse_experts=False):
    """The weighted sum of the chosen single-neuron experts' outputs; Triton when `use_triton` (default: when x is
    on a GPU).

    Args:
        x: [R, d]; down, up: [N, d]; indices: int64 [R, M]; weights: [R, M] (see naive.memory_values_reference).
        sparse_experts: the gradients of down and up are coalesced sparse COO tensors of the rows read (for a lazy
            SparseAdam), instead of dense tables that are zero on the rows not read.
    Returns:
        [R, d] in the promoted dtype of the inputs, accumulated in fp32; differentiable in x, down, up and weights.
    """
    check_inputs(x, down, up, indices, weights)
    if use_triton is None:
        use_triton = x.is_cuda
    if sparse_experts:
        return _with_sparse_expert_grads(x, down, up, indices, weights, use_triton)
    return _dense(x, down, up, indices, weights, use_triton)


def _dense(x, down, up, indices, weights, use_triton):
    if use_triton:
        from projects.ultramem_gpt.ops.memory_values.triton import memory_values_triton  # the reference needs no Triton

        return memory_values_triton(x, down, up, indices, weights)
    return memory_values_reference(x, down, up, indices, weights)


@torch.compiler.disable  # a data-dependent row count and a sparse gradient: torch.compile cannot trace them
def _with_sparse_expert_grads(x, down, up, indices, weights, use_triton):
    # The experts read form two small tables (one row per expert read, shared by down and up), whose dense
    # gradients become the sparse rows of the full tables' gradients.
    rows_read, positions = torch.unique(indices, sorted=True, return_inverse=True)
    return _dense(x, gather_rows(down, rows_read), gather_rows(up, rows_read), positions, weights, use_triton)
