"""The Triton ops of the core, those several projects read (product_keys/: pkm_gpt and peer_gpt; peer_experts/:
peer_gpt and ultramem_gpt); kernel_scenarios() launches their kernels as the projects' models do, and
kernel_cost_spec() tells scripts/kernel_cost.py what a launch costs per lookup (scripts/compile_kernels.py and
scripts/kernel_cost.py treat the core as one more project, "languini"; their tables here, Triton 3.9, 2026-11-29, no
GPU needed: compiled_kernels.csv from `python scripts/compile_kernels.py --project languini --csv ...`, and
kernel_cost.csv, of the product-key search alone, from `python scripts/kernel_cost.py --project languini --csv
...` before the expert read moved here)."""

# The searches the projects launch: (what, k_dim, n_keys, knn). pkm_gpt: the LRAM paper's PKM (XLM's k_dim 256 and
# n_keys 512 take a minute to record and compile, too long for CI); peer_gpt: its parameter-matched PEER.
SEARCHES = (("pkm_gpt, the LRAM paper's PKM", 64, 256, 32),
            ("peer_gpt, 181 keys a half, query width 128", 128, 181, 16))
# The expert reads the projects launch: width d and experts read per row M. Every width >= 128 launches with
# BLOCK_D = 128 and every M >= 32 with BLOCK_M = 32: peer_gpt's heads x 16 experts (2 heads or more) and
# ultramem_gpt's 32 values alike.
EXPERT_READ_WIDTH, EXPERTS_PER_ROW = 128, 32


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import torch

    from languini.ops.peer_experts import peer_experts
    from languini.ops.product_keys.triton import product_key_topk_triton

    # One head: the interpreter takes seconds per program of the search, and heads do not change its code. The
    # models' queries come out of a layer norm in fp32 (also under autocast); the sub-keys are fp32.
    for what, k_dim, n_keys, knn in SEARCHES:
        queries = torch.randn(1, 1, k_dim, requires_grad=True)
        sub_keys = torch.randn(1, 2, n_keys, k_dim // 2, requires_grad=True)

        def search(queries=queries, sub_keys=sub_keys, knn=knn):
            scores, _ = product_key_topk_triton(queries, sub_keys, knn)
            scores.sum().backward()

        yield f"product-key search, {what}", search

    # The tables in fp32 or bf16 (the models' value dtypes); x and the weights in fp32, as the layers pass them.
    d, m = EXPERT_READ_WIDTH, EXPERTS_PER_ROW
    for table_dtype in (torch.float32, torch.bfloat16):
        x, weights = torch.randn(1, d, requires_grad=True), torch.randn(1, m, requires_grad=True)
        down = torch.randn(181, d).to(table_dtype).requires_grad_()
        up = torch.randn(181, d).to(table_dtype).requires_grad_()
        indices = torch.randint(0, 181, (1, m))

        def read(x=x, down=down, up=up, indices=indices, weights=weights):
            peer_experts(x, down, up, indices, weights, use_triton=True).sum().backward()

        yield f"expert read, width {d}, {m} experts a row, tables {table_dtype}", read


def kernel_cost_spec(kernel, constants, signature, spec):
    """Lookups per program, loop trip counts and HBM bytes per lookup of a launch (scripts/kernel_cost.py); a
    lookup is one head of one token."""
    half, knn = constants.get("HALF"), constants.get("KNN")
    if kernel == "product_key_search_fwd_kernel":  # BLOCK queries of one head per program; a loop per half
        chunks_after_the_first = constants["N_PAD"] // constants["CHUNK"] - 1
        return spec(constants["BLOCK"], [chunks_after_the_first] * 2, 2 * half * 4 + knn * 12,
                    "HBM bytes: query in, scores and indices out; the sub-keys and the scratch stay in L2")
    if kernel == "product_key_search_bwd_kernel":
        return spec(constants["BLOCK"], [knn], 2 * half * 4 * 2 + knn * 12,
                    "HBM bytes: query, indices, score gradients in, query gradient out; the sub-keys' "
                    "gradient takes atomic adds in L2")
    return None
