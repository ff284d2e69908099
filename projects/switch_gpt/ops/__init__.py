"""The Triton ops of switch_gpt (moe/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ as the model does (compile_kernels.py):
    bf16 autocast and fp32, top-1 and top-2 with a dropped choice, forward and backward."""
    import torch

    from projects.switch_gpt.ops.moe.triton import experts_grouped

    def forward_backward(k, autocast):
        g = torch.Generator().manual_seed(0)
        N, d, h, E = 7, 32, 64, 4
        x = torch.randn(N, d, generator=g, requires_grad=True)
        weights = [torch.randn(E, d, h, generator=g), torch.zeros(E, h), torch.randn(E, h, d, generator=g),
                   torch.zeros(E, d)]
        weights = [w.requires_grad_() for w in weights]
        gates = torch.rand(N, k, generator=g, requires_grad=True)
        choice = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])
        choice[0, 0] = -1  # a dropped choice
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = experts_grouped(x, choice, gates, *weights)
        out.float().square().sum().backward()

    for autocast in (True, False):
        for k in (1, 2):
            yield (f"experts top-{k}, {'bf16 autocast' if autocast else 'fp32'}",
                   lambda k=k, autocast=autocast: forward_backward(k, autocast))
