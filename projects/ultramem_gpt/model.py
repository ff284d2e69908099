"""The GPT of languini/transformer.py (pre-LayerNorm, learned positions, untied embeddings, tied with --tie_embeddings)
with an UltraMemV2 memory layer beside the FFN of every block (Huang et al. 2025; ultramem.py, README.md).

A block is x + attn(ln1(x)), then + FFN(h) + memory(h) with h = ln2(x): the memory reads the FFN's input and writes to
the residual stream beside it. The FFN's hidden width is `ffn_hidden` (the sizes cut it to keep the GPT's FLOPs);
otherwise attention, MLP, block and init are the GPT's. The value tables train at value_lr_multiplier x the learning
rate (`optimizer_groups`).
"""
import torch
import torch.nn as nn

from languini import transformer
from languini.memory_layers import memory_layer_indices, table_optimizer_groups
from languini.memory_stats import MemoryStats, layers_result
from projects.ultramem_gpt.configs import ModelConfig
from projects.ultramem_gpt.ultramem import UltraMemV2, ultramem_flops


class Block(transformer.Block):
    """The GPT's pre-LayerNorm block whose `memory` (an UltraMemV2 layer or None) reads the FFN's input and adds
    beside it: x + attn(ln1(x)), then + mlp(h) + memory(h) with h = ln2(x)."""

    def __init__(self, cfg: ModelConfig, memory: nn.Module | None = None):
        super().__init__(cfg, transformer.MLP(cfg.d_model, cfg.mlp_ratio, cfg.ffn_hidden))
        self.memory = memory

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = self.ln2(x)
        if self.memory is None:
            return x + self.mlp(h)
        return x + self.mlp(h) + self.memory(h)


def memory_blocks(cfg: ModelConfig) -> list[int]:
    """The blocks (from 0) with a memory: memory_layers, or every block (UltraMemV2: "integrating memory layers into
    every transformer block")."""
    layers = ",".join(map(str, range(cfg.n_layers))) if cfg.memory_layers is None else cfg.memory_layers
    return memory_layer_indices(layers, cfg.n_layers)


def memory_layer(cfg: ModelConfig) -> UltraMemV2:
    return UltraMemV2(cfg.d_model, n_keys=cfg.ultramem_n_keys, knn=cfg.ultramem_knn, k_dim=cfg.ultramem_k_dim,
                      value_dim=cfg.ultramem_value_dim, rank=cfg.ultramem_rank, sparse_values=cfg.sparse_values)


# Rows of unit-normal inputs (a layer norm's output at init) on which each memory's output std is matched to the FFN's.
INIT_MATCH_ROWS = 256


class Model(transformer.GPT):
    def __init__(self, cfg: ModelConfig):
        memory_indices = memory_blocks(cfg)
        super().__init__(cfg, lambda i: Block(cfg, memory_layer(cfg) if i in memory_indices else None))
        self.memory_blocks = memory_indices
        if cfg.tie_embeddings:  # one tensor: what trains or rewrites a row of the output layer moves the input too
            self.head.weight = self.tok_emb.weight
        for layer in self.memories:
            layer.reset_memory_parameters()
        if not self.head.weight.is_meta:  # a meta model (FLOP counts) has no numbers to match
            self.match_memories_to_ffns()

    @torch.no_grad()
    def match_memories_to_ffns(self, seed=0):
        """Scale each memory's output projection so that, on unit-normal inputs (a layer norm's output at init), its
        output std is that of the FFN beside it (the v2 paper's initialisation matched to the FFN, as README.md
        reads it)."""
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randn(INIT_MATCH_ROWS, self.cfg.d_model, generator=g).to(self.head.weight.device)
        for block in self.blocks:
            if block.memory is not None:
                block.memory.match_output_std(block.mlp(tokens).std(), tokens)

    @property
    def memories(self) -> list[UltraMemV2]:
        """The memory layers, in block order."""
        return [self.blocks[i].memory for i in self.memory_blocks]

    def optimizer_groups(self, lr: float) -> list[dict]:
        """The value tables at value_lr_multiplier x lr, everything else at lr; with sparse_values the value group is
        marked "sparse" for a lazy optimiser (torch.optim.SparseAdam: only rows read are updated)."""
        values = [p for layer in self.memories for p in layer.value_parameters()]
        return table_optimizer_groups(self, values, lr, lr * self.cfg.value_lr_multiplier, self.cfg.sparse_values)

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs at batch 1 that DeepSpeed's profiler misses, per memory layer: the candidate grid, the chosen
        cells' scores and the value read (pre-values' dots and the weighted sum of values); it counts the
        projections, the key scores and the rank-one ranking (matmuls)."""
        cfg = self.cfg
        parts = ultramem_flops(cfg.d_model, cfg.ultramem_n_keys, knn=cfg.ultramem_knn, k_dim=cfg.ultramem_k_dim,
                               value_dim=cfg.ultramem_value_dim, rank=cfg.ultramem_rank)
        per_token = parts["candidate_grid"] + parts["chosen_scores"] + parts["values"]
        return len(self.memory_blocks) * seq_len * per_token

    def reset_memory_stats(self) -> None:
        """Start recording each memory's value reads in every forward until the next reset."""
        for layer in self.memories:
            layer.stats = MemoryStats(layer.num_values)

    def memory_stats(self) -> dict:
        """languini.memory_stats.MemoryStats.result() of the values read since reset_memory_stats, weighted by the
        magnitudes of their scores; when running distributed, over all processes, so every process must call it.
        With several memories, each layer's under "layers" ("block_<i>")."""
        return layers_result(self.memories, self.memory_blocks, self.head.weight.device)
