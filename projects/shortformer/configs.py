"""Shortformer sizes: the GPT's Languini widths (Languini paper, Table 4) with position-infused attention and a
cache (Press et al., "Shortformer", as in the slides "LM again?", 003_*.txt), and the staged-training schedules
of the slides as named schedules (`--stages best_perplexity`)."""
from dataclasses import dataclass, replace

from languini.flags import arg


@dataclass
class ModelConfig:
    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "segment length: tokens per forward (the final stage's when training is staged)")
    cache_len: int = arg(512, "previous-segment tokens each layer attends to (the slides' best: equal to the "
                              "segment, 512); 0: PIA only, no cache (then the model is stateless and its slow "
                              "evaluation slides a window)")
    d_model: int = arg(768, "width of the residual stream")
    n_layers: int = arg(12, "transformer blocks")
    n_heads: int = arg(12, "attention heads")
    d_head: int = arg(64, "width of each head")
    mlp_ratio: int = arg(4, "MLP hidden width over d_model")
    attention: str = arg("math", "math: an explicit masked softmax, as the GPT's default; sdpa: "
                                 "F.scaled_dot_product_attention with the same explicit mask (the cache makes the "
                                 "causal mask lower-right aligned, which is_causal is not)", choices=("math", "sdpa"))


SIZES = {
    "mini": ModelConfig(d_model=512, n_layers=4, n_heads=8, d_head=32),
    "tiny": ModelConfig(d_model=768, n_layers=4, n_heads=12, d_head=64),
    "small": ModelConfig(d_model=768, n_layers=12, n_heads=12, d_head=64),
    "medium": ModelConfig(d_model=1024, n_layers=24, n_heads=16, d_head=64),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus (as the GPT's); not a paper config.
    "cpu": ModelConfig(vocab_size=2048, seq_len=128, cache_len=128, d_model=128, n_layers=2, n_heads=4, d_head=32),
}

# The slides' staged training ("Staged Training - results", "PIA with Staged Training"): a first stage at 128
# tokens for 50 of 205 epochs gave the best final perplexity (17.52, PIA+cache+stages 17.47), 125 of 205 epochs
# reached the baseline's perplexity in the least time (37%). Fractions here are of the run's tokens.
STAGES = {
    "best_perplexity": "128:0.25,512",  # 50/205 = 0.24 of the epochs, rounded to a quarter
    "fastest_to_baseline": "128:0.6,512",  # 125/205 = 0.61 of the epochs
    # the 'cpu' config's segment is 128: the same schedule with every length a quarter (first stage 32)
    "cpu_best_perplexity": "32:0.25,128",
}

# As the GPT's Table 6 settings (the best GPT run per class); the Shortformer has no published Languini runs.
COMPUTE_CLASSES = {
    "6h": {"config": "small", "batch_size": 128},
    "12h": {"config": "small", "batch_size": 128},
    "24h": {"config": "small", "batch_size": 256},
    "48h": {"config": "medium", "batch_size": 256},
    "96h": {"config": "medium", "batch_size": 256},
}


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown Shortformer config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
