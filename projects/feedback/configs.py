"""Feedback Transformer sizes: the GPT's Languini widths and depths (Languini paper, Table 4) with a feedback memory
of tau = 512 steps (Fan et al. 2020, "Addressing some limitations of transformers with feedback memory"; the slides
in ../shared/papers/003_*.txt)."""
from dataclasses import dataclass, replace

from languini import transformer
from languini.flags import arg

MEMORY = ("weighted", "average", "layer")


@dataclass
class ModelConfig:
    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "tokens per segment (one forward, the backpropagation span); there is no position table")
    mem_len: int = arg(512, "tau: every layer at step t attends over the memory vectors m_{t-tau} .. m_{t-1}")
    d_model: int = arg(768, "width of the residual stream")
    n_layers: int = arg(12, "transformer blocks")
    n_heads: int = arg(12, "attention heads")
    d_head: int = arg(64, "width of each head")
    mlp_ratio: int = arg(4, "MLP hidden width over d_model")
    memory: str = arg("weighted", "what the memory m_t mixes (the slides' ablation): weighted, sum_l softmax(w)_l "
                                  "x_t^l over the embedding and every layer's output (the Feedback Transformer); "
                                  "average, their plain mean; layer, x_t^l of one layer", choices=MEMORY)
    memory_layer: int = arg(-1, "for --memory layer: which of x^0 (the embedding) .. x^L; -1 is the top layer x^L")
    attention_impl: str = arg("auto", "the attention of one query per head over the memory window "
                                      "(ops/window_attention): auto, the Triton kernel on GPU and the PyTorch "
                                      "reference on CPU; naive; triton", choices=("auto", "naive", "triton"))
    cuda_graphs: bool = arg(True, "on GPU, replay each segment's forward and backward loops from CUDA graphs (no "
                                  "launch overhead per step)")


SIZES = {
    **transformer.sizes(ModelConfig, ("mini", "tiny", "small", "medium")),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus (as the GPT's); not a paper config.
    "cpu": ModelConfig(**transformer.CPU_SIZE, mem_len=128),
}

# As the GPT's Table 6 settings (the best GPT run per class); the Feedback Transformer has no published Languini runs.
COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown Feedback Transformer config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
