"""Forward FLOPs of a model, device peak FLOP/s, and model FLOPs utilisation (MFU).

FLOPs follow the Languini paper (Tables 4, 6, 8): DeepSpeed's flops profiler on one
forward pass at batch 1, and a training step counted as 3 forward passes (the backward
pass as two, as in Kaplan et al., 2020).
"""

import os

import torch

from languini import model_contract
from languini.hardware import DeviceSpec, device_spec


def forward_flops(model: torch.nn.Module, seq_len: int, vocab_size: int, device: torch.device | str = "cpu") -> int:
    """FLOPs of one forward pass on one random sequence of `seq_len` tokens (the same sequence every call).

    DeepSpeed's profiler count plus `model.extra_flops(seq_len)` where the model defines it
    (for operations the profiler cannot see: Triton kernels, embedding bags, custom scans).
    Counted in eval mode, the nominal count: work a model drops in training (Switch's choices over an
    expert's capacity) would make the count depend on the tokens and the weights. Runs with gradients
    enabled: under no_grad PyTorch takes fused fast paths (e.g. nn.MultiheadAttention's) that bypass the
    functions the profiler patches.
    """
    # Imported here because deepspeed is slow to import. Naming its accelerator spares every command the warning
    # its detection prints on a machine without a GPU (it picks the same one).
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    from deepspeed.profiling.flops_profiler import FlopsProfiler
    from deepspeed.profiling.flops_profiler import profiler as ds_profiler

    tokens = torch.randint(vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    profiler = FlopsProfiler(model)
    wrap = ds_profiler.wrapFunc
    ds_profiler.wrapFunc = _outermost_only(wrap)
    training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            profiler.start_profile()
            model(tokens)
            flops = profiler.get_total_flops()
    finally:
        profiler.end_profile()
        ds_profiler.wrapFunc = wrap
        model.train(training)
    extra = model.extra_flops(seq_len) if isinstance(model, model_contract.WithExtraFlops) else 0
    return int(flops) + int(extra)


def _outermost_only(wrap):
    """Count a patched function only when no other patched function is running.

    On the meta device (how big models are profiled without memory) PyTorch runs Python decompositions that
    call patched functions again, e.g. F.linear -> addmm -> torch.mm, which DeepSpeed would count twice.
    """
    depth = [0]

    def wrap_outermost(func, flop_compute):
        counted = wrap(func, flop_compute)

        def call(*args, **kwargs):
            if depth[0]:
                return func(*args, **kwargs)
            depth[0] += 1
            try:
                return counted(*args, **kwargs)
            finally:
                depth[0] -= 1

        call.__str__ = func.__str__  # DeepSpeed restores the originals by this key
        return call

    return wrap_outermost


def train_flops_per_token(flops_per_forward: float, seq_len: int) -> float:
    """FLOPs one training token costs: forward + backward = 3 x forward."""
    return 3 * flops_per_forward / seq_len


def device_peak(hardware: str) -> DeviceSpec | None:
    """Spec peak FLOP/s (.flops_per_second) of a device name as torch reports it, from languini.hardware's one
    table; None when unknown (e.g. 'cpu')."""
    return device_spec(hardware)


def mfu(flops_per_forward: float, seq_len: int, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: 3 x forward FLOPs per token x tokens/s / peak FLOP/s."""
    return train_flops_per_token(flops_per_forward, seq_len) * tokens_per_second / peak_flops_per_second
