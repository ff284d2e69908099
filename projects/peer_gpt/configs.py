"""GPT sizes with the MLP of the middle block replaced by a PEER layer, and the compute classes of the GPT baseline.

"<size>" (mini, tiny, small, medium): the GPT's widths and depths (Languini paper, Table 4) with a PEER layer of
N = 181^2 = 32,761 experts, whose 2 N d_model expert parameters are those of pkm_gpt's 2^16 values of width d_model
(ratio 0.9998), 16 experts per head (the paper's k), query width 128, and as many heads as make the model's forward
FLOPs those of the GPT of the same name (the ratios: README.md). "<size>_paper": the PEER of the paper's isoFLOP
study (section 3.1: 1024^2 experts, 8 heads, 16 experts per head), fewer FLOPs than the GPT.
"""
from dataclasses import dataclass, replace

from languini import transformer
from languini.flags import arg
from projects.peer_gpt.peer import PAPER_PEER

PARAMETER_MATCHED_N_KEYS = 181  # 181^2 experts of 2 d_model parameters ~ pkm_gpt's 2^16 values of d_model
EXPERTS_PER_HEAD = PAPER_PEER.knn


@dataclass
class ModelConfig(transformer.GPTConfig):
    memory_layers: str | None = arg(None, "blocks (from 0) whose MLP a PEER layer replaces, comma-separated (\"2,4\"); "
                                          "none: (n_layers - 1) // 2, the middle block (PEER paper 3.1: block 6 of 12)")
    peer_heads: int = arg(33, "retrieval heads h (query networks), sharing the experts and the product keys")
    peer_k_dim: int = arg(PAPER_PEER.k_dim, "width of a head's query, split in two halves for the product keys")
    peer_n_keys: int = arg(PARAMETER_MATCHED_N_KEYS, "sub-keys per half: the layer has peer_n_keys ** 2 experts, each "
                                                     "a down and an up vector of width d_model")
    peer_knn: int = arg(EXPERTS_PER_HEAD, "experts per head k (top-k of the product keys)")
    memory_query_norm: str = arg("layer", "layer (causal), batch (the paper's query BatchNorm; not causal in "
                                          "training) or none", choices=("layer", "batch", "none"))
    expert_lr_multiplier: float = arg(1.0, "the expert tables' learning rate over the rest's (the paper names none)")
    sparse_experts: bool = arg(False, "the expert tables' gradients as sparse rows read, for a lazy (SparseAdam) "
                                      "optimiser group")


# Heads per size: the fewest whose forward FLOPs at batch 1 and seq_len 512 (DeepSpeed + extra_flops, vocabulary
# 16,384) reach the GPT's of the same name (the ratios: README.md, tests/peer_gpt/test_model.py).
_GPT_SIZES = {
    "mini": ModelConfig(**transformer.GPT_SIZES["mini"], peer_heads=20),
    "tiny": ModelConfig(**transformer.GPT_SIZES["tiny"], peer_heads=33),
    "small": ModelConfig(**transformer.GPT_SIZES["small"], peer_heads=33),
    "medium": ModelConfig(**transformer.GPT_SIZES["medium"], peer_heads=45),
}

_PAPER = dict(peer_heads=PAPER_PEER.heads, peer_k_dim=PAPER_PEER.k_dim, peer_n_keys=PAPER_PEER.n_keys,
              peer_knn=PAPER_PEER.knn)

SIZES = {
    **_GPT_SIZES,
    **{f"{name}_paper": replace(cfg, **_PAPER) for name, cfg in _GPT_SIZES.items()},
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config. 23^2 = 529
    # experts ~ pkm_gpt cpu's 32^2 values (ratio 1.03); heads as for the sizes above, against gpt's cpu config.
    "cpu": ModelConfig(**transformer.CPU_SIZE, peer_heads=6, peer_n_keys=23),
}

# The GPT baseline's best model size and batch per compute class (Languini paper, Table 6), so that PEER is
# compared with the GPT at equal reference-hardware time.
COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown peer_gpt config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
