"""GPT sizes with an UltraMemV2 memory layer beside the FFN of every block, and the GPT's compute classes.

"<size>" (mini, tiny, small, medium): the GPT's widths and depths (Languini paper, Table 4); each block's memory has
k_dim = value_dim = d_model / 4 (the authors' public 768-wide run: 192), rank 2, 32 values read per token (that
run's knn) and n_keys^2 values, n_keys the nearest to sqrt(2^17 / n_layers): the memories' 2 N value_dim x n_layers
value parameters are those of pkm_gpt's 2^16 values of width d_model (README.md). The FFN's hidden width is cut so
that the model's forward FLOPs are the GPT's of the same name (v2's rebalanced memory-to-FFN ratio; the ratios:
README.md).
"""
from dataclasses import dataclass, replace

from languini import transformer
from languini.flags import arg


@dataclass
class ModelConfig(transformer.GPTConfig):
    mlp_ratio: int = arg(4, "MLP hidden width over d_model (when ffn_hidden is not given)")
    ffn_hidden: int | None = arg(None, "hidden width of the FFN beside each memory (none: mlp_ratio * d_model); the "
                                       "sizes cut it to match the GPT's FLOPs")
    tie_embeddings: bool = arg(False, "one matrix for the input embedding and the output layer (the Hebbian "
                                      "Softmax's language models tie them, Rae's thesis 4.3.2); false: two, as the "
                                      "Languini paper")
    memory_layers: str | None = arg(None, "blocks (from 0) with a memory beside the FFN, comma-separated (\"2,4\"); "
                                          "none: every block (UltraMemV2)")
    ultramem_n_keys: int = arg(105, "row keys (and column keys): each memory holds ultramem_n_keys ** 2 values")
    ultramem_knn: int = arg(32, "values read per token (and row and column candidates kept before rescoring)")
    ultramem_k_dim: int | None = arg(None, "width of the row query and of the column query (none: d_model / 4)")
    ultramem_value_dim: int | None = arg(None, "width of a value and of a pre-value (none: d_model / 4)")
    ultramem_rank: int = arg(2, "Tucker rank r of the row and column scores (the core is r x r)")
    value_lr_multiplier: float = arg(4.0, "the value tables' learning rate over the rest's (the authors' public "
                                          "UltraMemV2 run: 4)")
    sparse_values: bool = arg(False, "the value tables' gradients as sparse rows read, for a lazy (SparseAdam) "
                                     "optimiser group")


# FFN hidden widths: the multiple of 8 whose forward FLOPs at batch 1 and seq_len 512 (DeepSpeed + extra_flops,
# vocabulary 16,384) come closest to the GPT's of the same name (README.md, tests/ultramem_gpt/test_model.py).
SIZES = {
    "mini": ModelConfig(**transformer.GPT_SIZES["mini"], ultramem_n_keys=181, ffn_hidden=1688),
    "tiny": ModelConfig(**transformer.GPT_SIZES["tiny"], ultramem_n_keys=181, ffn_hidden=2584),
    "small": ModelConfig(**transformer.GPT_SIZES["small"], ultramem_n_keys=105, ffn_hidden=2624),
    "medium": ModelConfig(**transformer.GPT_SIZES["medium"], ultramem_n_keys=74, ffn_hidden=3536),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config. 32^2 values of
    # 2 x 32 per block ~ pkm_gpt cpu's 32^2 values of width 128 over its 2 blocks; 16 read per token.
    "cpu": ModelConfig(**transformer.CPU_SIZE, ultramem_n_keys=32, ultramem_knn=16, ffn_hidden=424),
}

# The GPT baseline's best model size and batch per compute class (Languini paper, Table 6), so that UltraMemV2 is
# compared with the GPT at equal reference-hardware time.
COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown ultramem_gpt config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
