"""What the projects' kernel scenarios share (projects/<p>/ops/__init__.py: kernel_scenarios(), for
scripts/compile_kernels.py and scripts/kernel_cost.py)."""
import torch


def forward_backward(module: torch.nn.Module, x: torch.Tensor, autocast: bool):
    """One forward (under CPU bf16 autocast if asked) and a backward through the module, as training runs it."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out
    out.float().square().sum().backward()
