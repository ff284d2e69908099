"""The Triton ops of pkm_gpt (embedding_bag/; the product-key search is the core's, languini/ops/product_keys);
kernel_scenarios() launches their kernels as the model does, and kernel_cost_spec() tells scripts/kernel_cost.py
what a launch costs per lookup."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import dataclasses

    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, ProductKeyMemory

    # Every value width >= 128 launches with BLOCK_DIM = 128, as this one does. The search is the core's (its
    # scenarios: languini/ops/__init__.py).
    for values_dtype in (torch.float32, torch.bfloat16):
        for value_grad, sparse in (("atomic", False), ("segment", False), ("segment", True)):
            config = dataclasses.replace(LRAM_PAPER_PKM, value_grad=value_grad, sparse_values=sparse)
            layer = ProductKeyMemory.from_config(128, config, use_triton=True)
            layer.triton_search = False
            layer.values.data = layer.values.data.to(values_dtype)
            x = torch.randn(1, 1, 128)
            yield (f"values {values_dtype}, {value_grad}, sparse={sparse}",
                   lambda layer=layer, x=x: forward_backward(layer, x, autocast=True))


# What scripts/kernel_cost.py counts as one lookup: one head of one token reading its knn value rows, as LRAM's
# lookup is one head reading its 32 rows; at the LRAM paper's PKM (8 heads, knn 32) and a width of 768.
COST_HEADS, COST_KNN, COST_WIDTH = 8, 32, 768


def kernel_cost_spec(kernel, constants, signature, spec):
    """Lookups per program, loop trip counts and HBM bytes per lookup of a launch (scripts/kernel_cost.py)."""
    value_bytes = {"*bf16": 2, "*fp16": 2}.get(signature.get("values_ptr"), 4)
    rows_bytes = COST_KNN * COST_WIDTH * value_bytes  # a lookup's knn rows of the value table
    entries = COST_HEADS * COST_KNN  # one token's bag: every head's knn rows
    if kernel in ("pkm_bag_fwd_kernel", "pkm_bag_value_grad_atomic_kernel"):
        # a program: one token's bag (all heads) x BLOCK_DIM columns, its loop BLOCK_BAG rows per trip
        lookups = COST_HEADS * constants["BLOCK_DIM"] / COST_WIDTH
        moved = rows_bytes * (1 if kernel == "pkm_bag_fwd_kernel" else 2 * 4 / value_bytes)  # atomics: read + write fp32
        moved += COST_KNN * 12 + COST_WIDTH * 4 / COST_HEADS  # indices and weights in, its share of the output row
        return spec(lookups, [entries // constants["BLOCK_BAG"]], moved,
                    f"a lookup: one head's {COST_KNN} rows at width {COST_WIDTH} (LRAM paper's PKM: "
                    f"{COST_HEADS} heads)")
    if kernel == "pkm_bag_weight_grad_kernel":  # a program: BLOCK_BAG slots x every column, BLOCK_DIM per trip
        return spec(constants["BLOCK_BAG"] / COST_KNN, [COST_WIDTH // constants["BLOCK_DIM"]],
                    rows_bytes + COST_KNN * 12 + COST_WIDTH * 4 / COST_HEADS)
    if kernel == "pkm_bag_value_grad_segment_kernel":
        # a program: one table row's entries x BLOCK_DIM columns; about BLOCK_ENTRIES entries per row read (2^16
        # rows, 8,192 tokens x 256 entries), so one loop trip; each entry reads its token's gradient row
        lookups = constants["BLOCK_ENTRIES"] / COST_KNN * constants["BLOCK_DIM"] / COST_WIDTH
        moved = COST_KNN * COST_WIDTH * 4 + COST_WIDTH * 4 + COST_KNN * 16  # gradient rows in; a table row out
        return spec(lookups, [1], moved, "about 32 entries per table row read (8,192 tokens, 2^16 rows), each "
                                         "reading its token's gradient row")
    return None
