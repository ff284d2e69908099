"""The experts of a Switch layer as a plain loop over experts: the reference of the grouped Triton kernel, and
the CPU path; and the check of their inputs that every path makes."""
import torch
import torch.nn.functional as F


def check_expert_inputs(x: torch.Tensor, expert_index: torch.Tensor, gates: torch.Tensor, fc_weight: torch.Tensor,
                        fc_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> None:
    """One clear error, the same on every path, for inputs the experts cannot take (shapes as experts_naive's).
    No tokens is not an error: every path returns an empty (0, d) result. Reading the index range waits for
    the device once per call."""
    if fc_weight.dim() != 3 or fc_weight.shape[0] == 0:
        raise ValueError(f"fc_weight must be (E, d, h) with at least one expert, got shape {tuple(fc_weight.shape)}")
    E, d, h = fc_weight.shape
    for name, tensor, shape in (("fc_bias", fc_bias, (E, h)), ("proj_weight", proj_weight, (E, h, d)),
                                ("proj_bias", proj_bias, (E, d))):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (E = {E}, d = {d}, h = {h}), got {tuple(tensor.shape)}")
    if x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"x must be (N, d) tokens with d = {d}, got shape {tuple(x.shape)}")
    if expert_index.dim() != 2 or expert_index.shape[0] != x.shape[0]:
        raise ValueError(f"expert_index must be (N, k) with N = {x.shape[0]} tokens, got {tuple(expert_index.shape)}")
    if expert_index.dtype.is_floating_point or expert_index.dtype == torch.bool:
        raise ValueError(f"expert_index must hold integers, got {expert_index.dtype}")
    if tuple(gates.shape) != tuple(expert_index.shape):
        raise ValueError(f"gates must have the shape of expert_index {tuple(expert_index.shape)}, got "
                         f"{tuple(gates.shape)}")
    if expert_index.numel():
        low, high = torch.stack(torch.aminmax(expert_index)).tolist()
        if low < -1 or high >= E:
            raise ValueError(f"expert_index must lie in [-1, {E}) (an expert, or -1 for a dropped choice); it holds "
                             f"values from {low} to {high}")


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
    Raises:
        ValueError (check_expert_inputs): no experts, an index outside [-1, E), shapes that do not fit.
    """
    check_expert_inputs(x, expert_index, gates, fc_weight, fc_bias, proj_weight, proj_bias)
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
