"""The Triton ops of lram_gpt (lookup/); kernel_scenarios() launches their kernels as the model does, and
kernel_cost_spec() tells scripts/kernel_cost.py what a launch costs per lookup."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ at model widths (compile_kernels.py)."""
    import torch

    from languini.kernel_scenarios import forward_backward
    from projects.lram_gpt.memory import LRAMBlock
    from projects.lram_gpt.ops.lookup.triton import interpolate_triton

    for values_dtype in (torch.float32, torch.bfloat16):
        for value_grad, sparse in (("atomic", False), ("segment", False), ("segment", True)):
            block = LRAMBlock(32, memory_size=2 ** 16, use_triton=True, value_grad=value_grad, sparse_values=sparse)
            block.values.data = block.values.data.to(values_dtype)
            x = torch.randn(1, 3, 32)
            yield (f"values {values_dtype}, {value_grad}, sparse={sparse}",
                   lambda block=block, x=x: forward_backward(block, x, autocast=True))
    block = LRAMBlock(32, memory_size=2 ** 16, use_triton=True)
    yield "read_locations", lambda: block.read_locations(torch.randn(1, 5, 32))
    yield "fp32 without autocast", lambda: forward_backward(block, torch.randn(1, 3, 32), autocast=False)

    def lookup_from_coordinates():  # phi(q) and its gradients: the kernels without the torus query
        q = (torch.randn(3, 8) * 8).requires_grad_()
        interpolate_triton(q, block.values, block.K).square().sum().backward()

    yield "interpolate_triton", lookup_from_coordinates


def kernel_cost_spec(kernel, constants, signature, spec):
    """Lookups per program, loop trip counts and bytes per lookup of a launch (see lookup/triton.py)."""
    from projects.lram_gpt.ops.lookup.triton import cost_spec

    return cost_spec(kernel, constants, signature, spec)
