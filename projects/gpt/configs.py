"""GPT sizes (Languini paper, Table 4) and the best run of each compute class (Table 6)."""
from dataclasses import dataclass, replace

from languini.flags import arg


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
    tie_embeddings: bool = arg(False, "one matrix for the input embedding and the output layer (the Hebbian "
                                      "Softmax's language models tie them, Rae's thesis 4.3.2); false: two, as the "
                                      "Languini paper")
    attention: str = arg("math", "math: an explicit masked softmax, as the official Languini code (whose use_flash is off: "
                                 "the paper saw gradient spikes with flash attention on its RTX 3090); sdpa: "
                                 "F.scaled_dot_product_attention (flash kernels)", choices=("math", "sdpa"))


SIZES = {
    "mini": ModelConfig(d_model=512, n_layers=4, n_heads=8, d_head=32),
    "tiny": ModelConfig(d_model=768, n_layers=4, n_heads=12, d_head=64),
    "small": ModelConfig(d_model=768, n_layers=12, n_heads=12, d_head=64),
    # Table 4 prints 12 layers for medium, but its 336.4M parameters (and GPT-2 medium) need 24.
    "medium": ModelConfig(d_model=1024, n_layers=24, n_heads=16, d_head=64),
    "large": ModelConfig(d_model=1536, n_layers=24, n_heads=16, d_head=96),
    "XL": ModelConfig(d_model=2048, n_layers=24, n_heads=24, d_head=128),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config.
    "cpu": ModelConfig(vocab_size=2048, seq_len=128, d_model=128, n_layers=2, n_heads=4, d_head=32),
}

# Table 6: the best GPT run per compute class (slow eval, RTX 3090 hours).
COMPUTE_CLASSES = {
    "6h": {"config": "small", "batch_size": 128},
    "12h": {"config": "small", "batch_size": 128},
    "24h": {"config": "small", "batch_size": 256},
    "48h": {"config": "medium", "batch_size": 256},
    "96h": {"config": "medium", "batch_size": 256},
}


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown GPT config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
