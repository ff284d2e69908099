"""GPT sizes with one MLP replaced by the E8 lattice memory (LRAM), crossed with memory sizes; compute classes.

"<size>_m<e>" is a GPT size (Languini paper, Table 4) whose memory holds 2^e locations of 64 values each,
for e in MEMORY_EXPONENTS; the plain "<size>" has DEFAULT_MEMORY_SIZE = 2^20 locations, the memory of the
LRAM paper's LRAM-medium (Table 2), its smallest memory that beat the baseline. The torus periods K follow
from the size (lattice.torus_for_memory_size).
"""
from dataclasses import dataclass, replace
from typing import ClassVar

from languini import transformer
from languini.flags import arg

DEFAULT_MEMORY_SIZE = 2 ** 20
MEMORY_EXPONENTS = range(16, 27)  # the 2^16 .. 2^24 and beyond; the paper's largest is 2^22


@dataclass
class ModelConfig(transformer.GPTConfig):
    d_model: int = arg(768, "width of the residual stream; a multiple of 16: the memory reads one head per 16 features")
    memory_layers: str | None = arg(None, "blocks (from 0) whose MLP a memory replaces, comma-separated (\"2,4\"); "
                                          "none: (2 * n_layers - 1) // 3, the last block of the first two thirds, "
                                          "which is the LRAM paper's 4th of 6 layers")
    share_memory: bool = arg(False, "the memory layers read one value table (LRAM paper, section 6)")
    memory_gate: str = arg("none", "silu: Memory+ (Berges et al. 2024), the read times silu(W_g x) before the output "
                                   "map; none: the read itself", choices=("none", "silu"))
    memory_size: int = arg(DEFAULT_MEMORY_SIZE, "memory locations N, a power of two >= 256")
    memory_value_dim: int = arg(64, "m, values per location; the paper's 64 gives the 4w read of section 3.1")
    memory_topk: int = arg(32, "lattice points read per head (paper 2.6)")
    memory_query_norm: str = arg("layer", "layer (causal), batch (the paper's; not causal) or none",
                                 choices=("layer", "batch", "none"))
    memory_value_grad: str = arg("atomic", "the Triton value-gradient reduction", choices=("atomic", "segment"))
    sparse_values: bool = arg(False, "the value gradient as sparse rows, for a lazy (SparseAdam) optimiser group")
    memory_value_dtype: str = arg("float32", "the value table's dtype (bfloat16: half the bytes per lookup)",
                                  choices=("float32", "bfloat16"))
    value_lr_multiplier: float = arg(10.0, "the value table's learning rate over the rest's (LRAM paper 3.2)")
    memory_shards: int = arg(1, "under torchrun, each value table split by columns over groups of this many "
                                "processes (1: every process holds it whole); a layout, not a model: "
                                "languini.model_parallel")

    LAYOUT_FIELDS: ClassVar[tuple[str, ...]] = ("memory_shards",)


_GPT_SIZES = transformer.sizes(ModelConfig)

SIZES = {
    **_GPT_SIZES,
    **{f"{name}_m{e}": replace(cfg, memory_size=2 ** e) for name, cfg in _GPT_SIZES.items() for e in MEMORY_EXPONENTS},
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config.
    "cpu": ModelConfig(**transformer.CPU_SIZE, memory_size=2 ** 12),
}

# The GPT baseline's best model size and batch per compute class (Languini paper, Table 6), with the default
# memory, so that the memory is compared with the GPT at equal reference-hardware time.
COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown lram_gpt config '{name}'; choose one of {', '.join(_GPT_SIZES)} or cpu, or a "
                         f"size with 2^e memory locations as <size>_m<e>, e from {MEMORY_EXPONENTS.start} to "
                         f"{MEMORY_EXPONENTS.stop - 1} (e.g. small_m22).")
    return replace(SIZES[name], **overrides)
