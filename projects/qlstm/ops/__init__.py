"""The Triton ops of qlstm (scan/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.qlstm.cell import QuasiLSTM

    # Every width of Table 8 has >= 64 channels, so its launches have BLOCK_C = 64 as this one has.
    cell = QuasiLSTM(64, n_heads=1, d_head=64, impl="triton")
    for autocast in (False, True):
        x = torch.randn(1, 37, 64)
        yield f"autocast={autocast}", lambda x=x, autocast=autocast: forward_backward(cell, x, autocast)
