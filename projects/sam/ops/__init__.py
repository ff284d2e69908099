"""The Triton ops of sam (topk/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at the widths the model uses
    (compile_kernels.py): words of 32 (the thesis's A.2) and 64, K = 4 and 8."""
    import torch

    from projects.sam.ops.topk.triton import cosine_topk_triton

    for width, k in ((32, 4), (64, 8)):
        g = torch.Generator().manual_seed(0)
        query, memory = torch.randn(2, 4, width, generator=g), torch.randn(2, 300, width, generator=g)
        yield f"top-{k} of 300 words of width {width}", lambda q=query, m=memory, k=k: cosine_topk_triton(q, m, k)
