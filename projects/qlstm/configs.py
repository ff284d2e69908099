"""Quasi-LSTM sizes (Languini paper, Table 8) and the best run of each compute class (Table 10)."""
from dataclasses import dataclass, replace

from languini.flags import arg

CELLS = ("qlstm", "lstm")


@dataclass
class ModelConfig:
    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "training sequence length (backpropagation span); there is no position table")
    d_model: int = arg(768, "width of the residual stream")
    n_layers: int = arg(12, "recurrent blocks")
    n_heads: int = arg(12, "recurrent heads")
    d_head: int = arg(64, "width of each head; the recurrent width is n_heads * d_head")
    mlp_ratio: int = arg(4, "MLP hidden width over d_model")
    tie_embeddings: bool = arg(False, "one matrix for the input embedding and the output layer (the Hebbian "
                                      "Softmax's language models tie them, Rae's thesis 4.3.2); false: two, as the "
                                      "Languini paper")
    cell: str = arg("qlstm", "qlstm (eq. 18-24) or the classic multi-head lstm (eq. 11-17), for Table 7",
                    choices=("qlstm", "lstm"))
    impl: str | None = arg(None, "the qLSTM recurrence: loop, block or triton; none: triton on CUDA, block on CPU",
                           choices=("loop", "block", "triton"))
    block_len: int = arg(16, "steps per block of the block-parallel recurrence (eq. 34)")


SIZES = {
    "mini": ModelConfig(d_model=512, n_layers=4, n_heads=8, d_head=32, block_len=16),
    "tiny": ModelConfig(d_model=768, n_layers=4, n_heads=12, d_head=64, block_len=8),
    "small": ModelConfig(d_model=768, n_layers=12, n_heads=12, d_head=64, block_len=16),
    # Table 8 prints 12 layers for medium, but its 361.1M parameters (and the official config) need 24.
    "medium": ModelConfig(d_model=1024, n_layers=24, n_heads=16, d_head=64, block_len=16),
    "large": ModelConfig(d_model=1536, n_layers=24, n_heads=16, d_head=96, block_len=16),
    "XL": ModelConfig(d_model=2048, n_layers=24, n_heads=24, d_head=128, block_len=16),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config. Short blocks:
    # the block-parallel work per token grows with the block length, and a CPU gains little from the parallelism.
    "cpu": ModelConfig(vocab_size=2048, seq_len=128, d_model=128, n_layers=2, n_heads=4, d_head=32, block_len=4),
}

# Table 10: the best qLSTM run per compute class (slow eval, RTX 3090 hours).
COMPUTE_CLASSES = {
    "6h": {"config": "mini", "batch_size": 80},
    "12h": {"config": "tiny", "batch_size": 80},
    "24h": {"config": "small", "batch_size": 84},
    "48h": {"config": "small", "batch_size": 80},
    "96h": {"config": "small", "batch_size": 160},
}


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown qLSTM config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
