"""What the memory layers of the projects (lram_gpt, pkm_gpt) share: one vocabulary, row-sparse gradients, the
placement of memory layers, the Memory+ gate and the read of a value table split over processes.

value_grad: how a Triton backward reduces the value gradient, "atomic" (atomic adds per entry) or "segment"
(entries sorted by memory row, each run of one row summed without per-entry atomics).
query_norm: "layer" (each token on its own: causal), "batch" (statistics over batch and time: later tokens
change earlier outputs of a causal LM) or "none".
memory_layers: the blocks whose MLP a memory replaces, "2,4" (from 0), read by memory_layer_indices.
gate: "none" or "silu", Memory+ (Berges et al. 2024, "Memory Layers at Scale"): the read times silu(W_g x) before
the output projection.
A value table split by columns over a model-parallel group (languini/model_parallel.py) is read by sharded_bag.
"""
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from languini import model_parallel

VALUE_GRADS = ("atomic", "segment")
QUERY_NORMS = ("layer", "batch", "none")
# Names older configs used, and the new ones: a saved config with an old name fails with this message.
RENAMED = {"pkm_value_grad": "memory_value_grad", "pkm_query_norm": "memory_query_norm",
           "memory_layer": "memory_layers"}
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


def check_renamed(fields: dict, config_cls):
    """Raise ValueError naming the new names where a saved config of `config_cls` (a ModelConfig class) uses the
    memory layers' old names: a field it no longer has, or an old value. A field of that name the class still has
    is another project's own (the Feedback Transformer's memory_layer)."""
    current = {f.name for f in dataclasses.fields(config_cls)}
    old = []
    for key, value in fields.items():
        if key in RENAMED and key not in current:
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


GATES = ("none", "silu")


def table_optimizer_groups(model: nn.Module, tables: list, lr: float, table_lr: float, sparse: bool) -> list[dict]:
    """Two optimiser groups: every parameter of the model but the memory tables at lr, the tables at table_lr,
    marked "sparse" when their gradients are row-sparse (the trainer gives that group a lazy SparseAdam)."""
    ids = {id(p) for p in tables}
    table_group = {"params": list(tables), "lr": table_lr}
    if sparse:
        table_group["sparse"] = True
    return [{"params": [p for p in model.parameters() if id(p) not in ids], "lr": lr}, table_group]


def memory_layer_indices(memory_layers: str | None, n_layers: int) -> list[int]:
    """The blocks (from 0) a memory replaces the MLP of: memory_layers as "2,4" (rising after sorting, each
    once), or by default the last block of the first two thirds, (2 * n_layers - 1) // 3 (the LRAM paper's 4th
    of 6 layers)."""
    if memory_layers is None:
        return [(2 * n_layers - 1) // 3]
    try:
        indices = sorted(int(part) for part in str(memory_layers).split(","))
    except ValueError:
        raise ValueError(f"memory_layers must be block indices separated by commas (e.g. 2,4), got "
                         f"{memory_layers!r}") from None
    if not indices or len(set(indices)) != len(indices) or not all(0 <= i < n_layers for i in indices):
        raise ValueError(f"memory_layers must name distinct blocks in [0, n_layers={n_layers}), got "
                         f"{memory_layers!r}; use --memory_layers 2,4 counting blocks from 0.")
    return indices


def memory_gpt_blocks(cfg, memory_blocks: list[int], make_memory):
    """make_block(i) for languini.transformer.GPT: the GPT's pre-LN block whose feed-forward part `ff` is
    make_memory(values) in the blocks `memory_blocks` (values: the first memory's table when cfg.share_memory, for
    the later ones to read; else None) and the GPT's MLP elsewhere."""
    from languini.transformer import MLP, Block  # the transformer does not import this module: no cycle either way

    memories = []

    def make_block(i):
        if i not in memory_blocks:
            return Block(cfg, MLP(cfg.d_model, cfg.mlp_ratio), ff_name="ff")
        memories.append(make_memory(memories[0].values if cfg.share_memory and memories else None))
        return Block(cfg, memories[-1], ff_name="ff")

    return make_block


def gate_layer(gate: str, d_model: int, read_width: int) -> nn.Linear | None:
    """W_g of the Memory+ gate (the read times silu(W_g x)), or None for gate "none"."""
    if gate not in GATES:
        raise ValueError(f"memory_gate must be one of {GATES}, got {gate!r}")
    return nn.Linear(d_model, read_width) if gate == "silu" else None


def gated(read: torch.Tensor, gate: nn.Linear | None, x: torch.Tensor) -> torch.Tensor:
    """read * silu(W_g x) (Memory+), or the read itself without a gate."""
    return read if gate is None else read * F.silu(gate(x))


def sharded_bag(index: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, bag) -> torch.Tensor:
    """bag(index, weight, table), the weighted sum of table rows of each bag, [B, r] -> [B, m], for a table that
    may hold only this process's columns of a value table split by columns over a model-parallel group
    (model_parallel.parameter(..., dim=1)): every process passes its own bags and gets all m columns of them.

    The split along the value dimension keeps every lookup's rows on every process: each process gathers the
    (index, weight) pairs of the whole group (the counts exchanged first, so processes may hold different numbers
    of bags), reads its m / S columns of every bag with `bag`, and an all-to-all returns the columns to the bag's
    process. Per bag of r pairs a process sends its pairs to the S - 1 others (int32 index + fp32 weight: 8 r bytes
    each) and receives (S - 1) / S of its m columns (4 bytes each in fp32); the backward sends the columns'
    gradients back and the weights' gradients (4 r bytes, summed over the processes) home. Every process does
    1/S of the reads of the group's tokens, however unevenly the rows are read."""
    s = model_parallel.sharding(table)
    if s is None:
        return bag(index, weight, table)
    return _split_bag(index, weight, table, bag, s.shards)


@torch.compiler.disable  # collectives with counts known only at run time: nothing for torch.compile to trace
def _split_bag(index, weight, table, bag, shards):
    n = index.shape[0]
    weights, counts = model_parallel.gather_rows(weight, shards)
    copies = index.to(torch.int32).repeat(shards.size, 1)  # int32: every memory of this codebase has < 2^31 rows
    indices = model_parallel.all_to_all(copies, [n] * shards.size, counts, shards.group).long()
    columns = bag(indices, weights, table)  # this process's columns of every bag of the group
    back = model_parallel.all_to_all(columns, counts, [n] * shards.size, shards.group)
    return back.view(shards.size, n, table.shape[1]).permute(1, 0, 2).reshape(n, shards.size * table.shape[1])
