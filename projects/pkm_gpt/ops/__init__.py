"""The Triton ops of pkm_gpt (embedding_bag/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import dataclasses

    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, ProductKeyMemory

    # Every value width >= 128 launches with BLOCK_DIM = 128, as this one does.
    for values_dtype in (torch.float32, torch.bfloat16):
        for value_grad, sparse in (("atomic", False), ("segment", False), ("segment", True)):
            config = dataclasses.replace(LRAM_PAPER_PKM, value_grad=value_grad, sparse_values=sparse)
            layer = ProductKeyMemory.from_config(128, config, use_triton=True)
            layer.values.data = layer.values.data.to(values_dtype)
            x = torch.randn(1, 1, 128)
            yield (f"values {values_dtype}, {value_grad}, sparse={sparse}",
                   lambda layer=layer, x=x: forward_backward(layer, x, autocast=True))
