"""The Hebbian Softmax (J. Rae's thesis, chapter 4; Algorithm 1): after each optimiser step, the output-layer row
of every class seen in the step is mixed with the mean of the activations that predicted it.

For class i seen n_i > 0 times among the step's targets (all processes' together):

    lambda_i      = max(1 / c_i, gamma) * [c_i < T]                              (4.3)
    theta[i]     <- lambda_i * mean(h_j : y_j = i) + (1 - lambda_i) * theta_hat[i]   (4.2, batched as Algorithm 1)
    c_i          <- c_i + n_i                                                    (after the update)

theta_hat is the row after the optimiser step (eq. 4.1, here Adam), h are the output layer's inputs of the step's
training forwards (fp32), c the counters of class occurrences in training so far, which start at 0: at c_i = 0
the thesis's 1 / c_i is infinite and lambda_i is clipped to 1 (a mixing weight), so a class's first sighting
replaces its row with the mean activation, the lambda = 1 case of section 4.2.1. T (--hebbian_limit) is the
number of occurrences after which a class learns by gradient descent alone, gamma (--hebbian_min_mix) the least
mixing weight. Rows of classes not seen, or past T, keep the optimiser's values bit for bit.

--hebbian_scale rows is this kitchen's adaptation, not the thesis's rule: the memorised activation takes the
mean norm of the layer's rows before it mixes (w* = mean(h) * mean_k |theta_hat[k]| / |mean(h)|). The thesis
finds the activations' norm "not too large or small, in comparison to the model parameters" (section 4.3.4) for
its LSTM; the final LayerNorm of a small, briefly trained model gives activations about 20 times the norm of its
trained rows, so a row set to an activation outscores every trained row (languini/README.md measures both).

Under data parallelism every process applies the same update: the per-class counts and the sums of the
activations are summed over the processes first. A tied input embedding is the same tensor, so it moves too.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from languini import model_contract

# The thesis's settings for books (section 4.3.2, Gutenberg: T in {100, 500}, gamma = 0.1; WikiText-103's best
# was T = 500, gamma = 0.25).
DEFAULT_LIMIT = 500
DEFAULT_MIN_MIX = 0.1
# what a class's row mixes with: the mean activation as it is (the thesis's w* = h) or rescaled to the rows' norm
SCALES = ("activation", "rows")


def mixing_weights(counts: torch.Tensor, limit: int, min_mix: float) -> torch.Tensor:
    """lambda = max(1 / c, gamma) * [c < T] for counters c (eq. 4.3), clipped to 1 (so c = 0 gives 1), in fp32."""
    c = counts.float()
    return torch.where(c < limit, torch.clamp(torch.maximum(1 / c, torch.tensor(min_mix)), max=1.0), 0.0)


class HebbianSoftmax:
    """The update of one output-layer weight (vocab, width) and its class counters, which checkpoints keep."""

    def __init__(self, weight: torch.nn.Parameter, limit: int = DEFAULT_LIMIT, min_mix: float = DEFAULT_MIN_MIX,
                 world_size: int = 1, scale: str = "activation"):
        if limit < 0 or not 0 <= min_mix <= 1:
            raise ValueError(f"--hebbian_limit must be at least 0 and --hebbian_min_mix in [0, 1], got {limit} and "
                             f"{min_mix}.")
        if scale not in SCALES:
            raise ValueError(f"--hebbian_scale must be one of {', '.join(SCALES)}, got {scale!r}.")
        self.weight, self.limit, self.min_mix, self.world_size, self.scale = weight, limit, min_mix, world_size, scale
        self.counts = torch.zeros(weight.shape[0], dtype=torch.int64, device=weight.device)

    @torch.no_grad()
    def update(self, hidden: torch.Tensor, targets: torch.Tensor) -> None:
        """Algorithm 1 for one step: hidden (..., width) the output layer's inputs, targets (...) their classes."""
        hidden, targets = hidden.reshape(-1, hidden.shape[-1]).float(), targets.reshape(-1)
        step_counts = torch.bincount(targets, minlength=self.counts.numel())
        if self.world_size > 1:
            dist.all_reduce(step_counts)
        # the classes that mix: seen in this step and still under the limit (the same on every process)
        mixing = ((step_counts > 0) & (self.counts < self.limit)).nonzero().squeeze(1)
        if mixing.numel():
            # sums of the activations of these classes only: slot k holds class mixing[k]
            slot = torch.full_like(self.counts, -1)
            slot[mixing] = torch.arange(mixing.numel(), device=slot.device)
            mine = slot[targets]
            keep = mine >= 0
            sums = torch.zeros(mixing.numel(), hidden.shape[1], device=hidden.device)
            sums.index_add_(0, mine[keep], hidden[keep])
            if self.world_size > 1:
                dist.all_reduce(sums)
            mean = sums / step_counts[mixing].unsqueeze(1)
            if self.scale == "rows":  # the rows' mean norm after the optimiser step (a zero mean stays zero)
                norm = mean.norm(dim=1, keepdim=True)
                mean = mean * (self.weight.float().norm(dim=1).mean() / torch.where(norm > 0, norm, 1.0))
            lam = mixing_weights(self.counts[mixing], self.limit, self.min_mix).unsqueeze(1)
            rows = lam * mean + (1 - lam) * self.weight[mixing].float()
            # into the parameter itself: an in-place op on `weight[mask]` would change a copy and leave the layer
            self.weight.index_copy_(0, mixing, rows.to(self.weight.dtype))
        self.counts += step_counts

    def state_dict(self) -> dict:
        return {"counts": self.counts.cpu(), "limit": self.limit, "min_mix": self.min_mix, "scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        saved = (state["limit"], state["min_mix"], state.get("scale", "activation"))
        if saved != (self.limit, self.min_mix, self.scale):
            raise ValueError(f"The checkpoint's Hebbian Softmax has --hebbian_limit {saved[0]}, --hebbian_min_mix "
                             f"{saved[1]} and --hebbian_scale {saved[2]}; resume with the same flags.")
        self.counts.copy_(state["counts"])

    def summary(self) -> dict:
        """For results.json: the settings and how many classes mix still, have stopped, were never seen."""
        seen = self.counts > 0
        return {"limit": self.limit, "min_mix": self.min_mix, "scale": self.scale, "classes": self.counts.numel(),
                "classes_seen": int(seen.sum()), "classes_mixing": int((seen & (self.counts < self.limit)).sum()),
                "classes_past_limit": int((self.counts >= self.limit).sum())}


def settings(tcfg) -> dict:
    """The Hebbian flags of a TrainConfig when it is on (they change the training step, so its throughput row),
    else {}: what a run's ModelSpec adds to its model's fields."""
    if not tcfg.hebbian_softmax:
        return {}
    flags = {"hebbian_softmax": True, "hebbian_limit": tcfg.hebbian_limit, "hebbian_min_mix": tcfg.hebbian_min_mix}
    if tcfg.hebbian_scale != "activation":  # the thesis's rule keeps the rows it was timed with
        flags["hebbian_scale"] = tcfg.hebbian_scale
    return flags


def for_run(model: torch.nn.Module, tcfg, world_size: int = 1) -> HebbianSoftmax | None:
    """The Hebbian Softmax of the model's output layer `head` when --hebbian_softmax is on, else None."""
    if not tcfg.hebbian_softmax:
        return None
    head = model_contract.output_head(model, "--hebbian_softmax")
    return HebbianSoftmax(head.weight, tcfg.hebbian_limit, tcfg.hebbian_min_mix, world_size, tcfg.hebbian_scale)
