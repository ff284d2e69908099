"""GPT sizes with one MLP replaced by a product-key memory, and the compute classes of the GPT baseline.

Every GPT size (Languini paper, Table 4) carries the LRAM paper's PKM (8 heads, N = 2^16 values of the
model width, key dimension 64, knn 32); "<size>_xlm" carries XLM's defaults (4 heads, k_dim 256, knn 32,
N = 512^2) instead.
"""
from dataclasses import dataclass, replace
from typing import ClassVar

from languini.flags import arg
from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, XLM_PKM


@dataclass
class ModelConfig:
    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "tokens per sequence, the length of the learned position table")
    d_model: int = arg(768, "width of the residual stream")
    n_layers: int = arg(12, "transformer blocks")
    n_heads: int = arg(12, "attention heads")
    d_head: int = arg(64, "width of each head; attention width is n_heads * d_head, which differs from d_model for "
                          "mini")
    mlp_ratio: int = arg(4, "MLP hidden width over d_model")
    attention: str = arg("math", "math: an explicit masked softmax, as the official Languini code (whose use_flash is off: "
                                 "the paper saw gradient spikes with flash attention on its RTX 3090); sdpa: "
                                 "F.scaled_dot_product_attention (flash kernels)", choices=("math", "sdpa"))
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
    sparse_values: bool = arg(False, "the value gradient as sparse rows read, for a lazy (SparseAdam) optimiser "
                                     "group")
    memory_shards: int = arg(1, "under torchrun, each value table split by columns over groups of this many "
                                "processes (1: every process holds it whole); a layout, not a model: "
                                "languini.model_parallel")

    LAYOUT_FIELDS: ClassVar[tuple[str, ...]] = ("memory_shards",)


_XLM = dict(pkm_heads=XLM_PKM.heads, pkm_k_dim=XLM_PKM.k_dim, pkm_n_keys=XLM_PKM.n_keys, pkm_knn=XLM_PKM.knn)

_GPT_SIZES = {
    "mini": ModelConfig(d_model=512, n_layers=4, n_heads=8, d_head=32),
    "tiny": ModelConfig(d_model=768, n_layers=4, n_heads=12, d_head=64),
    "small": ModelConfig(d_model=768, n_layers=12, n_heads=12, d_head=64),
    # Table 4 prints 12 layers for medium, but its 336.4M parameters (and GPT-2 medium) need 24.
    "medium": ModelConfig(d_model=1024, n_layers=24, n_heads=16, d_head=64),
    "large": ModelConfig(d_model=1536, n_layers=24, n_heads=16, d_head=96),
    "XL": ModelConfig(d_model=2048, n_layers=24, n_heads=24, d_head=128),
}

SIZES = {
    **_GPT_SIZES,
    **{f"{name}_xlm": replace(cfg, **_XLM) for name, cfg in _GPT_SIZES.items()},
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config.
    "cpu": ModelConfig(vocab_size=2048, seq_len=128, d_model=128, n_layers=2, n_heads=4, d_head=32,
                       pkm_heads=4, pkm_k_dim=32, pkm_n_keys=32, pkm_knn=8),
}

# The GPT baseline's best model size and batch per compute class (Languini paper, Table 6), so that the
# memory is compared with the GPT at equal reference-hardware time.
COMPUTE_CLASSES = {
    "6h": {"config": "small", "batch_size": 128},
    "12h": {"config": "small", "batch_size": 128},
    "24h": {"config": "small", "batch_size": 256},
    "48h": {"config": "medium", "batch_size": 256},
    "96h": {"config": "medium", "batch_size": 256},
}


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown pkm_gpt config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
