"""GPT sizes with one MLP replaced by a product-key memory, and the compute classes of the GPT baseline.

Every GPT size (Languini paper, Table 4) carries the LRAM paper's PKM (8 heads, N = 2^16 values of the
model width, key dimension 64, knn 32); "<size>_xlm" carries XLM's defaults (4 heads, k_dim 256, knn 32,
N = 512^2) instead; "<size>_memory_plus" (and "memory_plus_cpu") is Memory+ (Berges et al. 2024, "Memory Layers at
Scale") with the defaults of Meta's code: three memory layers reading one shared table of N = 1024^2 values, 4 heads,
k_dim 512, knn 32, the SiLU gate, no query normalisation, Meta's initialisation and a fixed value learning rate of
1e-3 (README.md: what is aligned and what departs).
"""
from dataclasses import dataclass, replace
from typing import ClassVar

from languini import transformer
from languini.flags import arg
from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, MEMORY_INITS, MEMORY_PLUS_PKM, XLM_PKM


@dataclass
class ModelConfig(transformer.GPTConfig):
    memory_layers: str | None = arg(None, "blocks (from 0) whose MLP a memory replaces, comma-separated (\"2,4\"); "
                                          "none: (2 * n_layers - 1) // 3, the last block of the first two thirds, "
                                          "which is the LRAM paper's 4th of 6 layers")
    share_memory: bool = arg(False, "the memory layers read one value table (each its own queries and sub-keys)")
    memory_gate: str = arg("none", "silu: Memory+ (Berges et al. 2024), out = W_o(read * silu(W_g x)), both maps "
                                   "added; none: the read itself", choices=("none", "silu"))
    pkm_heads: int = arg(LRAM_PAPER_PKM.heads, "memory heads (queries per token)")
    pkm_k_dim: int = arg(LRAM_PAPER_PKM.k_dim, "width of a query, split in two halves for the product keys")
    pkm_n_keys: int = arg(LRAM_PAPER_PKM.n_keys, "sub-keys per half: the memory has pkm_n_keys ** 2 values of "
                                                 "width d_model")
    pkm_knn: int = arg(LRAM_PAPER_PKM.knn, "values read per head (top-k of the product keys)")
    memory_query_norm: str = arg(LRAM_PAPER_PKM.query_norm, "layer (causal), batch (not causal) or none",
                                 choices=("layer", "batch", "none"))
    memory_value_grad: str = arg(LRAM_PAPER_PKM.value_grad, "the Triton value-gradient reduction",
                                 choices=("atomic", "segment"))
    value_lr_multiplier: float = arg(10.0, "the value table's learning rate over the rest's (LRAM paper: 10x)")
    value_lr: float | None = arg(None, "a fixed peak learning rate of the value table, following the schedule as the "
                                       "rest (Memory+: 1e-3); none: value_lr_multiplier x the model's")
    memory_init: str = arg("xlm", "xlm: sub-keys uniform with bound 1/sqrt(pkm_k_dim / 2) (XLM), the query, gate "
                                  "and output maps as the GPT's linear maps (std 0.02, the output 0.02 / "
                                  "sqrt(2 n_layers)); meta: as Meta's memory layer code (Memory+): sub-keys bound "
                                  "1/sqrt(pkm_k_dim), query Xavier-uniform, gate and output std d_model^-0.5",
                           choices=MEMORY_INITS)
    memory_sigmoid_gate: bool = arg(False, "the memory's output times sigmoid(w . x + b), one scalar per token "
                                           "(Meta's optional gated memory, off in its Memory+ configs)")
    sparse_values: bool = arg(False, "the value gradient as sparse rows read, for a lazy (SparseAdam) optimiser "
                                     "group")
    memory_shards: int = arg(1, "under torchrun, each value table split by columns over groups of this many "
                                "processes (1: every process holds it whole); a layout, not a model: "
                                "languini.model_parallel")

    LAYOUT_FIELDS: ClassVar[tuple[str, ...]] = ("memory_shards",)


_XLM = dict(pkm_heads=XLM_PKM.heads, pkm_k_dim=XLM_PKM.k_dim, pkm_n_keys=XLM_PKM.n_keys, pkm_knn=XLM_PKM.knn)

_GPT_SIZES = transformer.sizes(ModelConfig)

# Memory+ as Meta's code runs it (its ProductKeyArgs defaults and apps/main/configs/pkplus_373m_1024k.yaml):
# what does not depend on the memory's size.
_MEMORY_PLUS_RECIPE = dict(share_memory=True, memory_gate="silu", memory_query_norm=MEMORY_PLUS_PKM.query_norm,
                           memory_init="meta", value_lr=1e-3)
_MEMORY_PLUS = dict(_MEMORY_PLUS_RECIPE, pkm_heads=MEMORY_PLUS_PKM.heads, pkm_k_dim=MEMORY_PLUS_PKM.k_dim,
                    pkm_n_keys=MEMORY_PLUS_PKM.n_keys, pkm_knn=MEMORY_PLUS_PKM.knn)
# Meta's 24-block config puts its three memory layers in blocks 4, 12 and 20 (every 8th from the 4th); 12 blocks the
# same spacing, 4 blocks two (our choice: the paper names no placement for so few blocks).
MEMORY_PLUS_LAYERS = {24: "4,12,20", 12: "2,6,10", 4: "1,3", 2: "0,1"}

_CPU = ModelConfig(**transformer.CPU_SIZE, pkm_heads=4, pkm_k_dim=32, pkm_n_keys=32, pkm_knn=8)

SIZES = {
    **_GPT_SIZES,
    **{f"{name}_xlm": replace(cfg, **_XLM) for name, cfg in _GPT_SIZES.items()},
    **{f"{name}_memory_plus": replace(cfg, **_MEMORY_PLUS, memory_layers=MEMORY_PLUS_LAYERS[cfg.n_layers])
       for name, cfg in _GPT_SIZES.items()},
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config.
    "cpu": _CPU,
    # The cpu config's small memory with Memory+'s recipe, both blocks reading the table (no MLP is left); named
    # *_cpu, so that a machine without a GPU takes it as CPU-sized (languini.plan.cpu_sized).
    "memory_plus_cpu": replace(_CPU, **_MEMORY_PLUS_RECIPE, memory_layers=MEMORY_PLUS_LAYERS[_CPU.n_layers]),
}

# The GPT baseline's best model size and batch per compute class (Languini paper, Table 6), so that the
# memory is compared with the GPT at equal reference-hardware time.
COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown pkm_gpt config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
