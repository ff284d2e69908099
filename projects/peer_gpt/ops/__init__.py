"""The Triton ops of peer_gpt (peer_experts/, product_keys/); kernel_scenarios() launches their kernels as the model
does (scripts/compile_kernels.py)."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.peer_gpt.ops.product_keys.triton import product_key_topk_triton
    from projects.peer_gpt.peer import PEER

    # Every width >= 128 launches with BLOCK_D = 128 and 16 experts per head with BLOCK_M = 32, as this one does.
    # The search is launched on its own below (one head: the interpreter takes seconds per program of it).
    for table_dtype in (torch.float32, torch.bfloat16):
        for sparse in (False, True):
            layer = PEER(128, heads=2, k_dim=128, n_keys=181, knn=16, use_triton=True, sparse_experts=sparse,
                         triton_search=False)
            layer.down.data, layer.up.data = layer.down.data.to(table_dtype), layer.up.data.to(table_dtype)
            x = torch.randn(1, 1, 128)
            yield (f"experts {table_dtype}, sparse={sparse}",
                   lambda layer=layer, x=x: forward_backward(layer, x, autocast=True))
    # the model's queries come out of a layer norm in fp32 (also under autocast); the sub-keys are fp32
    queries = torch.randn(1, 1, 128, requires_grad=True)
    sub_keys = torch.randn(1, 2, 181, 64, requires_grad=True)

    def search():
        scores, _ = product_key_topk_triton(queries, sub_keys, 16)
        scores.sum().backward()

    yield "product-key search, 181 keys a half, query width 128, knn 16", search
