"""Shortformer sizes: the GPT's Languini widths (Languini paper, Table 4) with position-infused attention and a
cache (Press et al., "Shortformer", as in the slides "LM again?", 003_*.txt), and the staged-training schedules
of the slides as named schedules (`--stages best_perplexity`)."""
from dataclasses import dataclass, replace

from languini import transformer
from languini.flags import arg


@dataclass
class ModelConfig(transformer.GPTConfig):
    seq_len: int = arg(512, "segment length: tokens per forward (the final stage's when training is staged)")
    d_head: int = arg(64, "width of each head")
    attention: str = arg("math", "math: an explicit masked softmax, as the GPT's default; sdpa: "
                                 "F.scaled_dot_product_attention with the same explicit mask (the cache makes the "
                                 "causal mask lower-right aligned, which is_causal is not)", choices=("math", "sdpa"))
    cache_len: int = arg(512, "previous-segment tokens each layer attends to (the slides' best: equal to the "
                              "segment, 512); 0: PIA only, no cache (then the model is stateless and its slow "
                              "evaluation slides a window)")


SIZES = {
    **transformer.sizes(ModelConfig, ("mini", "tiny", "small", "medium")),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus (as the GPT's); not a paper config.
    "cpu": ModelConfig(**transformer.CPU_SIZE, cache_len=128),
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
COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown Shortformer config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
