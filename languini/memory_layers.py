"""What the memory layers of the projects (lram_gpt, pkm_gpt) share: one vocabulary and row-sparse gradients.

value_grad: how a Triton backward reduces the value gradient, "atomic" (atomic adds per entry) or "segment"
(entries sorted by memory row, each run of one row summed without per-entry atomics).
query_norm: "layer" (each token on its own: causal), "batch" (statistics over batch and time: later tokens
change earlier outputs of a causal LM) or "none".
"""
import torch
from torch import nn

VALUE_GRADS = ("atomic", "segment")
QUERY_NORMS = ("layer", "batch", "none")
# Names older configs used, and the new ones: a saved config with an old name fails with this message.
RENAMED = {"pkm_value_grad": "memory_value_grad", "pkm_query_norm": "memory_query_norm"}
RENAMED_VALUES = {"sorted": "segment", "layernorm": "layer", "batchnorm": "batch"}


def check_value_grad(value_grad: str):
    if value_grad not in VALUE_GRADS:
        hint = f" (renamed to {RENAMED_VALUES[value_grad]!r})" if value_grad in RENAMED_VALUES else ""
        raise ValueError(f"value_grad must be one of {VALUE_GRADS}, got {value_grad!r}{hint}")


def query_norm_layer(query_norm: str, width: int) -> nn.Module:
    """The query normalisation named by query_norm over `width` features."""
    if query_norm not in QUERY_NORMS:
        hint = f" (renamed to {RENAMED_VALUES[query_norm]!r})" if query_norm in RENAMED_VALUES else ""
        raise ValueError(f"query_norm must be one of {QUERY_NORMS}, got {query_norm!r}{hint}")
    return {"layer": nn.LayerNorm, "batch": nn.BatchNorm1d}.get(query_norm, lambda _: nn.Identity())(width)


def check_renamed(fields: dict):
    """Raise ValueError naming the new names where a saved config uses the memory layers' old names."""
    old = []
    for key, value in fields.items():
        if key in RENAMED:
            old.append(f"{key} -> {RENAMED[key]}")
        if ("value_grad" in key or "query_norm" in key) and isinstance(value, str) and value in RENAMED_VALUES:
            old.append(f"{key}={value!r} -> {RENAMED_VALUES[value]!r}")
    if old:
        raise ValueError("this config uses names the memory layers no longer have; rename " + ", ".join(old))


def sparse_rows(rows: torch.Tensor, row_grads: torch.Tensor, shape) -> torch.Tensor:
    """The coalesced sparse COO gradient whose only non-zero rows are row_grads at the distinct rising rows."""
    return torch.sparse_coo_tensor(rows[None], row_grads, shape, is_coalesced=True, check_invariants=False)


class GatherRows(torch.autograd.Function):
    """values[rows] for distinct rising rows; the gradient is the sparse COO tensor of those rows only."""

    @staticmethod
    def forward(ctx, values, rows):
        ctx.save_for_backward(rows)
        ctx.values_shape = values.shape
        return values.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad_rows):
        (rows,) = ctx.saved_tensors
        return sparse_rows(rows, grad_rows, ctx.values_shape), None


def gather_rows(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """values[rows] (rows distinct and rising) whose gradient reaches `values` as the sparse rows read."""
    return GatherRows.apply(values, rows)
