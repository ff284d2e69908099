"""Compressive Transformer and Transformer-XL sizes: the GPT's Languini widths and depths (Languini paper, Table 4)
with the thesis's PG-19 recipe scaled down (Rae, thesis chapter 6.5.1: segment 512, memory and compressed memory
512, compression rate 2; the Transformer-XL baseline attends over 1024 memories at equal attention cost)."""
from dataclasses import dataclass, replace

from languini import transformer
from languini.flags import arg


@dataclass
class ModelConfig:
    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "n_s: tokens per segment (one forward)")
    mem_len: int = arg(512, "n_m: past layer inputs each layer keeps (the Transformer-XL memory)")
    cmem_len: int = arg(512, "n_cm: compressed memories each layer keeps; 0 is a plain Transformer-XL")
    compression_rate: int = arg(2, "c: kernel and stride of f_c")
    compression: str = arg("conv", "f_c (thesis 6.3.2): conv, a 1-D convolution trained by the attention-"
                                   "reconstruction loss (the thesis's best, Table 6.8); max or mean, pooling without "
                                   "parameters (the reconstruction loss is then only reported)",
                           choices=("conv", "max", "mean"))
    attention_impl: str = arg("auto", "the attention over [compressed; memory; segment] (ops/rel_attention): auto, "
                                      "the Triton kernel on GPU and the reference on CPU; naive, the reference "
                                      "(materialises (T, S) scores); triton; flex, FlexAttention (no CPU backward)",
                              choices=("auto", "naive", "triton", "flex"))
    d_model: int = arg(768, "width of the residual stream")
    n_layers: int = arg(12, "transformer blocks")
    n_heads: int = arg(12, "attention heads")
    d_head: int = arg(64, "width of each head")
    mlp_ratio: int = arg(4, "MLP hidden width over d_model")


def _txl(cfg: ModelConfig) -> ModelConfig:
    """The Transformer-XL baseline of a Compressive Transformer size: no compressed memory, the memory n_m + n_cm."""
    return replace(cfg, mem_len=cfg.mem_len + cfg.cmem_len, cmem_len=0)


_COMPRESSIVE = {
    **transformer.sizes(ModelConfig, ("mini", "tiny", "small", "medium")),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus (as the GPT's); not a paper config.
    "cpu": ModelConfig(**transformer.CPU_SIZE, mem_len=128, cmem_len=128),
}
SIZES = {**_COMPRESSIVE, **{f"txl_{name}": _txl(cfg) for name, cfg in _COMPRESSIVE.items()}}

# As the GPT's Table 6 settings (the best GPT run per class; no published Languini runs of these models), with the
# thesis's gradient clipping: "We clipped the gradients to have a norm of at most 0.1, which was crucial to
# successful optimisation" (section 6.5). Pass --grad_clip to change it; runs without a named class (the CPU
# default, e.g. --compute_class 2m) take the trainer's default instead.
COMPUTE_CLASSES = transformer.compute_classes(grad_clip=0.1)


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown Compressive Transformer config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
