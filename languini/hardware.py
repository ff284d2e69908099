"""One table of devices: dense tensor-core peak FLOP/s and HBM bandwidth, from vendor spec sheets (not measured).

A device name as torch reports it is matched by languini.throughput.normalise_hardware: same model; an entry
naming a memory size matches devices of that size only; an entry's form factors list those it matches (None in
it: a name without one), or None for any. The first matching entry wins, so specific entries come first.
"""
from dataclasses import dataclass

from languini.throughput import normalise_hardware


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    flops_per_second: float  # dense (no 2:4 sparsity) tensor-core peak
    precision: str  # the number type the peak is for: bf16 with fp32 accumulation, else fp16
    source: str  # vendor spec sheet; spec values, not measured here
    hbm_bytes_per_second: float | None = None  # spec memory bandwidth, where recorded
    form_factors: tuple | None = None  # the form factors this entry matches (None in it: none named); None: any


# torch reports an H100 SXM as "NVIDIA H100 80GB HBM3" (no form factor), a PCIe one as "NVIDIA H100 PCIe".
DEVICES = (
    DeviceSpec("RTX 3090", 71e12, "bf16", "spec: NVIDIA Ampere GA102 whitepaper (fp32 accumulate)", 936e9),
    DeviceSpec("RTX 4090", 165.2e12, "bf16", "spec: NVIDIA Ada Lovelace whitepaper (fp32 accumulate)", 1008e9),
    DeviceSpec("A100 40GB", 312e12, "bf16", "spec: NVIDIA A100 datasheet", 1555e9),
    DeviceSpec("A100 80GB", 312e12, "bf16", "spec: NVIDIA A100 datasheet", 2000e9),
    DeviceSpec("A100", 312e12, "bf16", "spec: NVIDIA A100 datasheet"),
    DeviceSpec("H100 PCIe", 756e12, "bf16", "spec: NVIDIA H100 datasheet (1513 TFLOPS with sparsity)", 2000e9),
    DeviceSpec("H100", 989.4e12, "bf16", "spec: NVIDIA H100 SXM datasheet (1979 TFLOPS with sparsity)", 3350e9,
               form_factors=(None, "sxm")),
    DeviceSpec("H200", 989.4e12, "bf16", "spec: NVIDIA H200 SXM datasheet (1979 TFLOPS with sparsity)", 4800e9),
    DeviceSpec("A40", 149.7e12, "bf16", "spec: NVIDIA A40 datasheet"),
    DeviceSpec("A10", 125e12, "bf16", "spec: NVIDIA A10 datasheet"),
    DeviceSpec("L4", 121e12, "bf16", "spec: NVIDIA L4 datasheet"),
    DeviceSpec("L40S", 362.05e12, "bf16", "spec: NVIDIA L40S datasheet"),
    DeviceSpec("V100 PCIe", 112e12, "fp16", "spec: NVIDIA V100 datasheet (no bf16)"),
    DeviceSpec("V100", 125e12, "fp16", "spec: NVIDIA V100 SXM2 datasheet (no bf16)"),
    DeviceSpec("T4", 65e12, "fp16", "spec: NVIDIA T4 datasheet (no bf16)"),
    DeviceSpec("P100 PCIe", 18.7e12, "fp16", "spec: NVIDIA P100 PCIe datasheet (no tensor cores, no bf16)"),
    DeviceSpec("P100", 21.2e12, "fp16", "spec: NVIDIA P100 SXM2 datasheet (no tensor cores, no bf16)"),
)


def device_spec(hardware: str) -> DeviceSpec | None:
    """The table's entry for a device name as torch reports it; None when unknown (e.g. 'cpu')."""
    device = normalise_hardware(hardware)
    for spec in DEVICES:
        entry = normalise_hardware(spec.name)
        if spec.form_factors is None:
            form_ok = entry.form_factor in (None, device.form_factor)
        else:
            form_ok = device.form_factor in spec.form_factors
        if entry.model == device.model and entry.memory_gb in (None, device.memory_gb) and form_ok:
            return spec
    return None
