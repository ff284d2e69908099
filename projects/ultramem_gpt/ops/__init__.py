"""The Triton ops of ultramem_gpt (tucker_topk/, memory_values/); kernel_scenarios() launches their kernels as the
model does (scripts/compile_kernels.py)."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.ultramem_gpt.ops.tucker_topk import kernel_scenarios as tucker_topk_scenarios
    from projects.ultramem_gpt.ultramem import UltraMemV2

    yield from tucker_topk_scenarios()
    # value width 128 (every width >= 128 launches BLOCK_D = 128) and 32 values a token (BLOCK_M = 32), as the model
    # at d_model 512; the layer also launches the candidate top-k
    for table_dtype in (torch.float32, torch.bfloat16):
        for sparse in (False, True):
            layer = UltraMemV2(512, n_keys=181, knn=32, use_triton=True, sparse_values=sparse)
            layer.pre_values.data, layer.values.data = (layer.pre_values.data.to(table_dtype),
                                                        layer.values.data.to(table_dtype))
            x = torch.randn(1, 1, 512)
            yield (f"layer, values {table_dtype}, sparse={sparse}",
                   lambda layer=layer, x=x: forward_backward(layer, x, autocast=True))
