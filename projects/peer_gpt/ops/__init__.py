"""The Triton ops of peer_gpt (peer_experts/; the product-key search is the core's, languini/ops/product_keys);
kernel_scenarios() launches their kernels as the model does (scripts/compile_kernels.py)."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.peer_gpt.peer import PEER

    # Every width >= 128 launches with BLOCK_D = 128 and 16 experts per head with BLOCK_M = 32, as this one does.
    # The search is the core's (its scenarios: languini/ops/__init__.py).
    for table_dtype in (torch.float32, torch.bfloat16):
        for sparse in (False, True):
            layer = PEER(128, heads=2, k_dim=128, n_keys=181, knn=16, use_triton=True, sparse_experts=sparse,
                         triton_search=False)
            layer.down.data, layer.up.data = layer.down.data.to(table_dtype), layer.up.data.to(table_dtype)
            x = torch.randn(1, 1, 128)
            yield (f"experts {table_dtype}, sparse={sparse}",
                   lambda layer=layer, x=x: forward_backward(layer, x, autocast=True))
