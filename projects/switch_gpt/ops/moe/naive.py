"""The experts of a Switch layer as a plain loop over experts: the reference of the grouped Triton kernel, and
the CPU path."""
import torch
import torch.nn.functional as F


def experts_naive(x: torch.Tensor, expert_index: torch.Tensor, gates: torch.Tensor, fc_weight: torch.Tensor,
                  fc_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> torch.Tensor:
    """Each token through the experts it is routed to, weighted by its router gates.

    Args:
        x: (N, d) tokens.
        expert_index: (N, k) int64, the expert of each of a token's k choices; -1 where the choice was dropped.
        gates: (N, k) router weights of the choices.
        fc_weight, fc_bias: (E, d, h), (E, h): each expert's first linear map (x @ W + b).
        proj_weight, proj_bias: (E, h, d), (E, d): its second.
    Returns:
        (N, d) in x's dtype: sum over choices j of gates[n, j] * proj(gelu_tanh(fc(x[n]))) of expert
        expert_index[n, j]; zero for a token with every choice dropped.
    """
    out = torch.zeros_like(x)
    # unbind, not indexing per expert: its backward stacks the experts' gradients once, where each index's
    # backward would write a gradient the size of all experts
    experts = zip(fc_weight.unbind(0), fc_bias.unbind(0), proj_weight.unbind(0), proj_bias.unbind(0))
    for e, (w1, b1, w2, b2) in enumerate(experts):
        token, choice = (expert_index == e).nonzero(as_tuple=True)
        h = F.gelu(x[token] @ w1 + b1, approximate="tanh")
        y = (h @ w2 + b2) * gates[token, choice, None]
        out = out.index_add(0, token, y.to(out.dtype))
    return out
