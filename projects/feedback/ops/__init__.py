"""The Triton ops of feedback (window_attention/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ as the model does (compile_kernels.py):
    a forward and backward of the model's segment through the kernel, bf16 autocast and fp32, head width 64 (the
    Languini sizes') and 32 (mini), a memory window of 40 slots (two blocks of 32, the second partial); 1 layer (the
    backward adds the window's key and value gradients per layer) and 2 (it writes the weights, and one launch per
    step adds all layers' gradients: triton.ONE_PASS_MIN_LAYERS)."""
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

    for n_layers in (1, 2):
        for d_head in (64, 32):
            for autocast in (True, False):
                yield (f"feedback window attention, {n_layers} layer(s), head width {d_head}, "
                       f"{'bf16 autocast' if autocast else 'fp32'}",
                       lambda d_head=d_head, autocast=autocast, n_layers=n_layers:
                       forward_backward(d_head, autocast, n_layers))
