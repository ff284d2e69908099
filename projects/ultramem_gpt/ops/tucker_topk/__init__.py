"""The top-k cells of the TDQKR candidate grid: `tucker_topk(rows, cols, core, knn, impl)`; impl "naive" (naive.py,
PyTorch: the reference and the CPU path) or "triton" (triton.py; None picks it for CUDA tensors).

A selection without a gradient (as projects/sam/ops/topk): the model recomputes the chosen cells' scores from the
gathered row and column scores and the core, differentiably and without the [R, K1, K2] grid.
"""
import torch

from languini.triton_utils import interpreting
from projects.ultramem_gpt.ops.tucker_topk.naive import check_inputs, tucker_grid, tucker_topk_naive

IMPLS = ("naive", "triton")


def tucker_topk(rows: torch.Tensor, cols: torch.Tensor, core: torch.Tensor, knn: int, impl: str | None = None):
    """The knn best cells (a, b) of each token's grid rows[t, a]^T core cols[t, b], best first.

    Args:
        rows: [R, K1, r] the row candidates' rank-r scores; cols: [R, K2, r] the column candidates'; core: [r, r].
        knn: cells to keep, at most K1 x K2.
        impl: "naive", "triton", or None for "triton" on CUDA tensors and "naive" otherwise.
    Returns:
        (row positions, column positions): int64 [R, knn] indices into K1 and K2. Equal scores: the naive path
        follows torch.topk, the kernel ranks the lower a * K2 + b first.
    """
    check_inputs(rows, cols, core, knn)
    impl = impl or ("triton" if rows.is_cuda else "naive")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, not {impl!r}")
    if impl == "naive":
        return tucker_topk_naive(rows, cols, core, knn)
    if not rows.is_cuda and not interpreting():
        raise ValueError("impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported; "
                         "use impl='naive' on CPU")
    from projects.ultramem_gpt.ops.tucker_topk.triton import tucker_topk_triton  # the PyTorch path needs no Triton

    return tucker_topk_triton(rows, cols, core, knn)


def kernel_scenarios():
    """Yield (description, callable) pairs launching the kernel as the model does (compile_kernels.py): 32 row and
    32 column candidates of rank 2 (the authors' knn and rank), fp32 and bf16 row scores."""
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        # one token: the interpreter runs a program per token, and the count (like the model's, not a multiple of
        # 16) is specialised alike
        rows, cols = (torch.randn(1, 32, 2, generator=g).to(dtype) for _ in range(2))
        core = torch.rand(2, 2, generator=g)
        yield f"{dtype}", lambda rows=rows, cols=cols, core=core: tucker_topk(rows, cols, core, 32, impl="triton")


__all__ = ["IMPLS", "tucker_grid", "tucker_topk", "tucker_topk_naive"]
