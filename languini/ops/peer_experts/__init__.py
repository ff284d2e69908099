"""PEER's expert computation, out[r] = sum_j weights[r, j] * gelu(down[i_rj] . x[r]) * up[i_rj]: naive.py (reference,
CPU path) and triton.py (kernels), chosen by `peer_experts`. In the core because two projects read it: peer_gpt's
experts (down and up vectors, router scores) and ultramem_gpt's PEER-style value read (down the pre-values, up the
values, weights the TDQKR scores)."""

import torch

from languini.memory_layers import gather_rows
from languini.ops.peer_experts.naive import check_inputs, peer_experts_reference


def peer_experts(x, down, up, indices, weights, use_triton=None, sparse_experts=False):
    """The weighted sum of the chosen single-neuron experts' outputs; Triton when `use_triton` (default: when x is
    on a GPU).

    Args:
        x: [R, d]; down, up: [N, d]; indices: int64 [R, M]; weights: [R, M] (see naive.peer_experts_reference).
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
        from languini.ops.peer_experts.triton import peer_experts_triton  # the reference needs no Triton

        return peer_experts_triton(x, down, up, indices, weights)
    return peer_experts_reference(x, down, up, indices, weights)


@torch.compiler.disable  # a data-dependent row count and a sparse gradient: torch.compile cannot trace them
def _with_sparse_expert_grads(x, down, up, indices, weights, use_triton):
    # The experts read form two small tables (one row per expert read, shared by down and up), whose dense
    # gradients become the sparse rows of the full tables' gradients.
    rows_read, positions = torch.unique(indices, sorted=True, return_inverse=True)
    return _dense(x, gather_rows(down, rows_read), gather_rows(up, rows_read), positions, weights, use_triton)
