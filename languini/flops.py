"""Forward FLOPs of a model, device peak FLOP/s, and model FLOPs utilisation (MFU).

FLOPs follow the Languini paper (Tables 4, 6, 8): DeepSpeed's flops profiler on one
forward pass at batch 1, and a training step counted as 3 forward passes (the backward
pass as two, as in Kaplan et al., 2020).
"""

from dataclasses import dataclass

import torch

from languini import model_contract
from languini.throughput import normalise_hardware


def forward_flops(model: torch.nn.Module, seq_len: int, vocab_size: int, device: torch.device | str = "cpu") -> int:
    """FLOPs of one forward pass on one random sequence of `seq_len` tokens.

    DeepSpeed's profiler count plus `model.extra_flops(seq_len)` where the model defines it
    (for operations the profiler cannot see: Triton kernels, embedding bags, custom scans).
    Runs with gradients enabled: under no_grad PyTorch takes fused fast paths (e.g.
    nn.MultiheadAttention's) that bypass the functions the profiler patches.
    """
    # Imported here because deepspeed is slow to import and logs on import.
    from deepspeed.profiling.flops_profiler import FlopsProfiler, profiler as ds_profiler

    tokens = torch.randint(vocab_size, (1, seq_len), device=device)
    profiler = FlopsProfiler(model)
    wrap = ds_profiler.wrapFunc
    ds_profiler.wrapFunc = _outermost_only(wrap)
    try:
        with torch.enable_grad():
            profiler.start_profile()
            model(tokens)
            flops = profiler.get_total_flops()
    finally:
        profiler.end_profile()
        ds_profiler.wrapFunc = wrap
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


@dataclass(frozen=True)
class DevicePeak:
    name: str
    flops_per_second: float
    precision: str  # the number type the peak is for
    source: str  # vendor spec sheet; spec values, not measured here


# Dense (no 2:4 sparsity) tensor-core peaks from vendor spec sheets, bf16 with fp32
# accumulation where the device has bf16, else fp16. An entry naming a form factor only
# matches devices that name it; the first matching entry wins, so those come first
# (torch reports an H100 SXM as "NVIDIA H100 80GB HBM3", a PCIe one as "NVIDIA H100 PCIe").
PEAKS = (
    DevicePeak("RTX 3090", 71e12, "bf16", "spec: NVIDIA Ampere GA102 whitepaper (fp32 accumulate)"),
    DevicePeak("RTX 4090", 165.2e12, "bf16", "spec: NVIDIA Ada Lovelace whitepaper (fp32 accumulate)"),
    DevicePeak("A100", 312e12, "bf16", "spec: NVIDIA A100 datasheet"),
    DevicePeak("H100 PCIe", 756e12, "bf16", "spec: NVIDIA H100 datasheet (1513 TFLOPS with sparsity)"),
    DevicePeak("H100", 989.4e12, "bf16", "spec: NVIDIA H100 SXM datasheet (1979 TFLOPS with sparsity)"),
    DevicePeak("H200", 989.4e12, "bf16", "spec: NVIDIA H200 SXM datasheet (1979 TFLOPS with sparsity)"),
    DevicePeak("A40", 149.7e12, "bf16", "spec: NVIDIA A40 datasheet"),
    DevicePeak("A10", 125e12, "bf16", "spec: NVIDIA A10 datasheet"),
    DevicePeak("L4", 121e12, "bf16", "spec: NVIDIA L4 datasheet"),
    DevicePeak("L40S", 362.05e12, "bf16", "spec: NVIDIA L40S datasheet"),
    DevicePeak("V100 PCIe", 112e12, "fp16", "spec: NVIDIA V100 datasheet (no bf16)"),
    DevicePeak("V100", 125e12, "fp16", "spec: NVIDIA V100 SXM2 datasheet (no bf16)"),
    DevicePeak("T4", 65e12, "fp16", "spec: NVIDIA T4 datasheet (no bf16)"),
    DevicePeak("P100 PCIe", 18.7e12, "fp16", "spec: NVIDIA P100 PCIe datasheet (no tensor cores, no bf16)"),
    DevicePeak("P100", 21.2e12, "fp16", "spec: NVIDIA P100 SXM2 datasheet (no tensor cores, no bf16)"),
)


def device_peak(hardware: str) -> DevicePeak | None:
    """Spec peak FLOP/s for a device name as torch reports it; None when unknown (e.g. 'cpu')."""
    device = normalise_hardware(hardware)
    for peak in PEAKS:
        entry = normalise_hardware(peak.name)
        if entry.model == device.model and entry.form_factor in (None, device.form_factor):
            return peak
    return None


def mfu(flops_per_forward: float, seq_len: int, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: 3 x forward FLOPs per token x tokens/s / peak FLOP/s."""
    return train_flops_per_token(flops_per_forward, seq_len) * tokens_per_second / peak_flops_per_second
