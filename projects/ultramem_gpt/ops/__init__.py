"""The Triton ops of ultramem_gpt (tucker_topk/; the value read is the core's, languini/ops/peer_experts);
kernel_scenarios() launches their kernels as the model does (scripts/compile_kernels.py)."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    from projects.ultramem_gpt.ops.tucker_topk import kernel_scenarios as tucker_topk_scenarios

    # The value read is the core's (its scenarios: languini/ops/__init__.py).
    yield from tucker_topk_scenarios()
