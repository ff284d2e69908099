"""The Triton ops of compressive (rel_attention/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ as the model does (compile_kernels.py):
    bf16 autocast and fp32, head width 64 (the Languini sizes') and 32 (mini), a memory prefix, forward and
    backward."""
    import torch

    from projects.compressive.ops.rel_attention.triton import relative_attention_triton

    def forward_backward(d_head, autocast):
        g = torch.Generator().manual_seed(0)
        B, H, T, P = 1, 2, 24, 40
        q = torch.randn(B, H, T, d_head, generator=g, requires_grad=True)
        k, v = (torch.randn(B, H, P + T, d_head, generator=g, requires_grad=True) for _ in range(2))
        r = torch.randn(H, P + T, d_head, generator=g, requires_grad=True)
        u, w = (torch.zeros(H, d_head, requires_grad=True) for _ in range(2))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = relative_attention_triton(q, k, v, r, u, w, d_head ** -0.5)
        out.float().square().sum().backward()

    for d_head in (64, 32):
        for autocast in (True, False):
            yield (f"relative attention, head width {d_head}, {'bf16 autocast' if autocast else 'fp32'}",
                   lambda d_head=d_head, autocast=autocast: forward_backward(d_head, autocast))
