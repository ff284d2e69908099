"""The GPT of projects/gpt (copied: pre-LayerNorm, learned positions, untied embeddings, tied with --tie_embeddings)
with an UltraMemV2 memory layer beside the FFN of every block (Huang et al. 2025; ultramem.py, README.md).

A block is x + attn(ln1(x)), then + FFN(h) + memory(h) with h = ln2(x): the memory reads the FFN's input and writes to
the residual stream beside it. The FFN's hidden width is `ffn_hidden` (the sizes cut it to keep the GPT's FLOPs);
otherwise attention, MLP, block and init are the GPT's. The value tables train at value_lr_multiplier x the learning
rate (`optimizer_groups`).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from languini.memory_layers import memory_layer_indices
from languini.memory_stats import MemoryStats
from projects.ultramem_gpt.configs import ModelConfig
from projects.ultramem_gpt.ultramem import UltraMemV2, ultramem_flops


ATTENTION = ("math", "sdpa")


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {cfg.attention!r}")
        self.n_heads, self.d_head, self.impl = cfg.n_heads, cfg.d_head, cfg.attention
        inner = cfg.n_heads * cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * inner)
        self.proj = nn.Linear(inner, cfg.d_model)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        if self.impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # as the official code: under autocast the softmax runs in fp32, the products in half precision
            scores = torch.einsum("bhid,bhjd->bhij", q, k) * self.d_head ** -0.5
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.einsum("bhij,bhjd->bhid", F.softmax(scores.masked_fill(future, float("-inf")), dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model if cfg.ffn_hidden is None else cfg.ffn_hidden
        self.fc = nn.Linear(cfg.d_model, hidden)
        self.proj = nn.Linear(hidden, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # GPT-2's GELU


class Block(nn.Module):
    """Pre-LayerNorm block; `memory` (an UltraMemV2 layer or None) reads the FFN's input and adds beside it."""

    def __init__(self, cfg: ModelConfig, memory: nn.Module | None = None):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)
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


class Model(nn.Module):
    stateful = False  # every window starts afresh (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.memory_blocks = memory_blocks(cfg)
        self.blocks = nn.ModuleList(Block(cfg, memory_layer(cfg) if i in self.memory_blocks else None)
                                    for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tie_embeddings:  # one tensor: what trains or rewrites a row of the output layer moves the input too
            self.head.weight = self.tok_emb.weight
        for block in self.blocks:  # GPT-2: the MLP's residual write is scaled down with depth
            nn.init.normal_(block.mlp.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
        for block in self.blocks:
            if block.memory is not None:
                block.memory.reset_memory_parameters()
        if not self.head.weight.is_meta:  # a meta model (FLOP counts) has no numbers to match
            self.match_memories_to_ffns()

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, x, state=None):
        T = x.shape[1]
        if T > self.cfg.seq_len:
            raise ValueError(f"Sequence length {T} exceeds the position table ({self.cfg.seq_len}); "
                             f"use --seq_len {T} or shorter sequences.")
        # Token embeddings scaled by sqrt(d_model), as in the official Languini code the paper's numbers come from.
        h = self.tok_emb(x) * math.sqrt(self.cfg.d_model) + self.pos_emb(torch.arange(T, device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)), None

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
        value_ids = {id(p) for p in values}
        rest = [p for p in self.parameters() if id(p) not in value_ids]
        value_group = {"params": values, "lr": lr * self.cfg.value_lr_multiplier}
        if self.cfg.sparse_values:
            value_group["sparse"] = True
        return [{"params": rest, "lr": lr}, value_group]

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
        if any(m.stats is None for m in self.memories):
            raise ValueError("memory_stats() needs reset_memory_stats() and a forward pass first.")
        device = self.head.weight.device
        merged = [m.stats.all_processes(device) for m in self.memories]
        if len(merged) == 1:
            return merged[0].result()
        return {"layers": {f"block_{i}": s.result() for i, s in zip(self.memory_blocks, merged)}}
