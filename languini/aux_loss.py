"""Auxiliary losses: a model may return `(logits, state, aux)`, `aux` a dict name -> scalar tensor, each already
weighted by its coefficient (Switch's load balancing, a reconstruction loss). Training adds their sum to the
language-model loss; the reported loss and every perplexity leave them out."""
from __future__ import annotations

import torch


def unpack(output) -> tuple[torch.Tensor, object, dict[str, torch.Tensor]]:
    """(logits, state, aux) from a model's output of 2 or 3 items; aux is {} for a model without one."""
    if len(output) == 2:
        return output[0], output[1], {}
    if len(output) == 3 and isinstance(output[2], dict):
        return output
    raise ValueError("A model returns (logits, state) or (logits, state, aux) with aux a dict of scalar losses; "
                     f"got {len(output)} items")


def total(aux: dict[str, torch.Tensor]) -> torch.Tensor | float:
    """The sum of the auxiliary losses (0 without any)."""
    return sum(aux.values()) if aux else 0.0
