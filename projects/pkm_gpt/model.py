"""The GPT of projects/gpt (copied) with one block's MLP replaced by a product-key memory (Lample et al. 2019).

The memory maps d_model -> d_model and writes to the residual stream as the MLP it replaces. Its value table
trains at `value_lr_multiplier` x the learning rate (see `optimizer_groups`), as in the LRAM paper; with
`sparse_values` its gradient holds only the rows read and its group is marked for a lazy SparseAdam.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from languini.memory_stats import MemoryStats
from projects.pkm_gpt.configs import ModelConfig
from projects.pkm_gpt.pkm import ProductKeyMemory, pkm_flops


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
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # GPT-2's GELU


class Block(nn.Module):
    """Pre-LayerNorm block; its feed-forward part `ff` is an MLP or the product-key memory."""

    def __init__(self, cfg: ModelConfig, ff: nn.Module):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.ff = nn.LayerNorm(cfg.d_model), ff

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ff(self.ln2(x))


def memory_layer_index(cfg: ModelConfig) -> int:
    """The block holding the memory: cfg.memory_layer, or by default the last of the first two thirds."""
    index = (2 * cfg.n_layers - 1) // 3 if cfg.memory_layer is None else cfg.memory_layer
    if not 0 <= index < cfg.n_layers:
        raise ValueError(f"memory_layer must be in [0, n_layers={cfg.n_layers}), got {index}; "
                         f"use --memory_layer N counting blocks from 0.")
    return index


class Model(nn.Module):
    stateful = False  # every window starts afresh (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.memory_layer = memory_layer_index(cfg)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(cfg, ProductKeyMemory(cfg.d_model, heads=cfg.pkm_heads, k_dim=cfg.pkm_k_dim,
                                        n_keys=cfg.pkm_n_keys, knn=cfg.pkm_knn, query_norm=cfg.memory_query_norm,
                                        value_grad=cfg.memory_value_grad, sparse_values=cfg.sparse_values)
                  if i == self.memory_layer else MLP(cfg))
            for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: the MLP's residual write is scaled down with depth
            if isinstance(block.ff, MLP):
                nn.init.normal_(block.ff.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
        self.memory.reset_memory_parameters()  # XLM's sub-key and value init, not the GPT's

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    @property
    def memory(self) -> ProductKeyMemory:
        return self.blocks[self.memory_layer].ff

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

    def optimizer_groups(self, lr: float) -> list[dict]:
        """The value table at value_lr_multiplier x lr, everything else at lr; with sparse_values the value
        group is marked "sparse" for a lazy optimiser (torch.optim.SparseAdam: only rows read are updated)."""
        values = self.memory.value_parameters()
        value_ids = {id(p) for p in values}
        rest = [p for p in self.parameters() if id(p) not in value_ids]
        value_group = {"params": values, "lr": lr * self.cfg.value_lr_multiplier}
        if self.cfg.sparse_values:
            value_group["sparse"] = True
        return [{"params": rest, "lr": lr}, value_group]

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs at batch 1 that DeepSpeed's profiler misses: the candidate-score sums and the
        embedding bag (the query projection and the half-key scores are matmuls it counts)."""
        cfg = self.cfg
        parts = pkm_flops(seq_len, cfg.d_model, heads=cfg.pkm_heads, k_dim=cfg.pkm_k_dim, n_keys=cfg.pkm_n_keys,
                          knn=cfg.pkm_knn)
        return parts["candidate_sums"] + parts["embedding_bag"]

    def reset_memory_stats(self) -> None:
        """Start recording the memory's reads in every forward until the next reset."""
        self.memory.stats = MemoryStats(self.memory.num_values)

    def memory_stats(self) -> dict:
        """languini.memory_stats.MemoryStats.result() of the reads since reset_memory_stats (LRAM paper Table 5);
        when running distributed, over all processes, so every process must call it."""
        if self.memory.stats is None:
            raise ValueError("memory_stats() needs reset_memory_stats() and a forward pass first.")
        return self.memory.stats.all_processes(self.memory.values.device).result()
