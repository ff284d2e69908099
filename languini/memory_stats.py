"""Memory-layer read statistics over a split (LRAM paper Table 5; XLM's usage, KL, Gini and top-row shares).

A memory layer holding a MemoryStats in its `stats` attribute records every lookup's (row index, read weight)
in its forward; result() then describes how evenly the split's read weight spreads over the memory's rows.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

TOP_SHARES = (0.5, 0.9, 0.99)


class MemoryStats:
    """Total read weight per row of a memory of `memory_size` rows: update(index, weight) per lookup, result()."""

    def __init__(self, memory_size: int):
        self.memory_size = memory_size
        self.weight = torch.zeros(memory_size, dtype=torch.float64)

    @torch.no_grad()
    def update(self, index: torch.Tensor, weight: torch.Tensor):
        if index.shape != weight.shape:
            raise ValueError(f"index {tuple(index.shape)} and weight {tuple(weight.shape)} must match")
        self.weight = self.weight.to(index.device)  # accumulate where the lookups are
        self.weight.index_add_(0, index.reshape(-1), weight.reshape(-1).to(torch.float64))

    def all_processes(self, device: torch.device) -> MemoryStats:
        """The reads of every process summed (itself when not distributed); every process must call it."""
        if not (dist.is_available() and dist.is_initialized()):
            return self
        merged = MemoryStats(self.memory_size)
        # a copy, so that asking twice does not sum twice; a process that saw no tokens holds it on the CPU
        merged.weight = self.weight.to(device, copy=True)
        dist.all_reduce(merged.weight)
        return merged

    def result(self) -> dict[str, float]:
        """memory_usage: share of rows read with positive weight; kl_from_uniform: KL (nats) of the normalised
        read weight from uniform over all rows; gini: its Gini coefficient (0 even, 1 all on one row);
        rows_for_50/90/99: the smallest share of rows that holds 50/90/99% of the read weight."""
        total = self.weight.sum()
        if total <= 0:
            raise ValueError("no memory reads recorded; call update(index, weight) first")
        p = self.weight / total
        used = p > 0
        kl = (p[used] * torch.log(p[used] * self.memory_size)).sum()
        n = self.memory_size
        rising = torch.sort(p).values
        rank = torch.arange(1, n + 1, dtype=torch.float64, device=p.device)
        gini = ((2 * rank - n - 1) * rising).sum() / n  # p sums to 1
        held = torch.cumsum(rising.flip(0), 0)
        result = {"memory_usage": used.double().mean().item(), "kl_from_uniform": kl.item(), "gini": gini.item()}
        for share in TOP_SHARES:
            # rows in falling order of weight until they hold the share (a hair of slack for rounding)
            rows = int(torch.searchsorted(held, torch.tensor(share * (1 - 1e-12), dtype=held.dtype,
                                                                     device=held.device)).item()) + 1
            result[f"rows_for_{round(share * 100)}"] = rows / n
        return result


def layers_result(layers, blocks, device: torch.device, shared_table: bool = False) -> dict:
    """MemoryStats.result() of the reads the memory layers recorded in their `stats` since those were set, over all
    processes (every process must call it): one layer's at the top; several layers' each under "layers"
    ("block_<i>", i from `blocks`), and with shared_table (all read one table) the table's, all their reads, at the
    top."""
    if any(layer.stats is None for layer in layers):
        raise ValueError("memory_stats() needs reset_memory_stats() and a forward pass first.")
    merged = [layer.stats.all_processes(device) for layer in layers]
    if len(merged) == 1:
        return merged[0].result()
    stats = {"layers": {f"block_{i}": s.result() for i, s in zip(blocks, merged)}}
    if shared_table:
        table = MemoryStats(merged[0].memory_size)
        table.weight = sum(s.weight for s in merged)
        stats.update(table.result())
    return stats
