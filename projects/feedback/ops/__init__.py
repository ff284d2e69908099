"""The Triton ops of feedback (window_attention/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ as the model does (compile_kernels.py):
    a forward and backward of the model's segment through the kernel, bf16 autocast and fp32, head width 64 (the
    Languini sizes') and 32 (mini), a memory window of 40 slots (two blocks of 32, the second partial), 2 layers (the
    backward writes the weights, and one launch per step adds all layers' key and value gradients:
    triton.ONE_PASS_MIN_LAYERS); and 1 layer (the backward adds them itself) at head width 64 only: every config
    has 4 layers or more, so only a one-layer model (tests) launches that variant."""
    import torch

    from projects.feedback import configs
    from projects.feedback.model import Model

    def forward_backward(d_head, autocast, n_layers):
        torch.manual_seed(0)
        model = Model(configs.get("cpu", d_model=64, n_layers=n_layers, n_heads=2, d_head=d_head, mem_len=40,
                                  vocab_size=64, attention_impl="triton"))
        tokens = torch.randint(64, (2, 5))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, _ = model(tokens)
        logits.float().square().sum().backward()

    for n_layers, d_heads in ((2, (64, 32)), (1, (64,))):
        for d_head in d_heads:
            for autocast in (True, False):
                yield (f"feedback window attention, {n_layers} layer(s), head width {d_head}, "
                       f"{'bf16 autocast' if autocast else 'fp32'}",
                       lambda d_head=d_head, autocast=autocast, n_layers=n_layers:
                       forward_backward(d_head, autocast, n_layers))
