"""GPT sizes (Languini paper, Table 4) with Switch mixture-of-experts MLPs, and the GPT's compute classes.

"<size>" has E = 8 experts, "<size>_e32" and "<size>_e64" 32 and 64, for mini, tiny and small; "cpu" is a
smoke-test size. `python -m projects.switch_gpt.model` prints every config's parameter count.
"""
from dataclasses import dataclass, replace
from typing import ClassVar

from languini import transformer
from languini.flags import arg

MOE_LAYERS = ("every_other", "every")  # or a block index (from 0) as a string: one MoE block, as memory layers
ROUTING = ("top1", "top2")
EXPERTS_IMPL = ("auto", "naive", "triton")


@dataclass
class ModelConfig(transformer.GPTConfig):
    mlp_ratio: int = arg(4, "each expert is a GPT MLP: d_model -> mlp_ratio * d_model -> d_model")
    n_experts: int = arg(8, "experts per MoE layer")
    moe_layers: str = arg("every_other", "which blocks' MLPs are MoE layers: every_other (blocks 1, 3, 5, ...: "
                                         "Switch, GShard), every (all blocks), or a block index I")
    routing: str = arg("top1", "top1 (Switch) or top2 (GShard: gates renormalised over the two)",
                       choices=("top1", "top2"))
    capacity_factor: float = arg(1.25, "training only: capacity = capacity_factor x k x tokens / E per expert")
    load_balance_coef: float = arg(0.01, "alpha of the load-balancing loss alpha x E x sum_i f_i P_i")
    router_z_coef: float = arg(0.0, "router z-loss mean(logsumexp(logits)^2) coefficient (ST-MoE: 1e-3); 0: off")
    init_scale: float = arg(0.1, "Switch's s: router and expert weights ~ truncated normal, std sqrt(s / fan_in)")
    experts_impl: str = arg("auto", "auto: the Triton kernel on GPU, the per-expert loop on CPU",
                            choices=("auto", "naive", "triton"))
    expert_attention: bool = arg(False, "Switch for attention: in the MoE blocks the q and the shared k/v "
                                        "projections are Switch layers too, one router each (the Switch paper saw it "
                                        "diverge in bf16, fine in fp32: train it with --precision fp32)")
    expert_parallel: int = arg(1, "under torchrun, each MoE layer's experts split over groups of this many "
                                  "processes (n_experts / N each), tokens sent to their expert's process and back "
                                  "(1: every process holds every expert); a layout, not a model: "
                                  "languini.model_parallel")

    LAYOUT_FIELDS: ClassVar[tuple[str, ...]] = ("expert_parallel",)


_GPT_SIZES = transformer.sizes(ModelConfig, ("mini", "tiny", "small"))

SIZES = {
    **_GPT_SIZES,
    **{f"{name}_e{e}": replace(cfg, n_experts=e) for name, cfg in _GPT_SIZES.items() for e in (32, 64)},
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config.
    "cpu": ModelConfig(**transformer.CPU_SIZE, n_experts=4),
}

# The GPT baseline's best size and batch per compute class (Languini paper, Table 6) where it is small, so that
# the experts are compared with the GPT (and the memory layers) at equal reference-hardware time. 48h and 96h
# used medium, which has no Switch config here.
COMPUTE_CLASSES = transformer.compute_classes(_GPT_SIZES)


def moe_blocks(cfg: ModelConfig) -> list[int]:
    """The indices of the blocks whose MLP is a mixture of experts."""
    if cfg.moe_layers == "every_other":
        return list(range(1, cfg.n_layers, 2))
    if cfg.moe_layers == "every":
        return list(range(cfg.n_layers))
    if cfg.moe_layers.isdigit() and int(cfg.moe_layers) < cfg.n_layers:
        return [int(cfg.moe_layers)]
    raise ValueError(f"moe_layers must be one of {', '.join(MOE_LAYERS)} or a block index below n_layers "
                     f"({cfg.n_layers}), not {cfg.moe_layers!r}")


def check(cfg: ModelConfig) -> None:
    """Clear errors for bad values, before any model is built."""
    moe_blocks(cfg)
    if cfg.routing not in ROUTING:
        raise ValueError(f"routing must be one of {', '.join(ROUTING)}, not {cfg.routing!r}")
    if cfg.experts_impl not in EXPERTS_IMPL:
        raise ValueError(f"experts_impl must be one of {', '.join(EXPERTS_IMPL)}, not {cfg.experts_impl!r}")
    if cfg.n_experts < 1 or (cfg.routing == "top2" and cfg.n_experts < 2):
        raise ValueError(f"n_experts must be at least 1 (2 for top2), not {cfg.n_experts}")
    if cfg.capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be positive, not {cfg.capacity_factor}")
    if cfg.expert_parallel < 1 or cfg.n_experts % cfg.expert_parallel:
        raise ValueError(f"expert_parallel must be at least 1 and divide n_experts ({cfg.n_experts}), not "
                         f"{cfg.expert_parallel}")


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown switch_gpt config '{name}'; choose one of {', '.join(SIZES)}.")
    cfg = replace(SIZES[name], **overrides)
    check(cfg)
    return cfg

