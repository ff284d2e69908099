"""The GPT of projects/gpt (copied) with the MLP of the middle block replaced by a PEER layer (He 2024, section 3.1).

The layer maps d_model -> d_model and writes to the residual stream as the MLP it replaces. Its expert tables train
at `expert_lr_multiplier` x the learning rate (see `optimizer_groups`); with `sparse_experts` their gradients hold
only the rows read and their group is marked for a lazy SparseAdam. --memory_layers 1,3 puts a PEER layer, each
with its own experts, in several blocks.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from languini.memory_layers import memory_layer_indices, table_optimizer_groups
from languini.memory_stats import MemoryStats, layers_result
from projects.peer_gpt.configs import ModelConfig
from projects.peer_gpt.peer import PEER, peer_flops


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
        return self.proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # GPT-2's GELU


class Block(nn.Module):
    """Pre-LayerNorm block; its feed-forward part `ff` is an MLP or a PEER layer."""

    def __init__(self, cfg: ModelConfig, ff: nn.Module):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.ff = nn.LayerNorm(cfg.d_model), ff

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ff(self.ln2(x))


def peer_blocks(cfg: ModelConfig) -> list[int]:
    """The blocks (from 0) whose MLP a PEER layer replaces: memory_layers, or the middle block (n_layers - 1) // 2,
    the paper's "block 6" of 12 (section 3.1)."""
    layers = str((cfg.n_layers - 1) // 2) if cfg.memory_layers is None else cfg.memory_layers
    return memory_layer_indices(layers, cfg.n_layers)


class Model(nn.Module):
    stateful = False  # every window starts afresh (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.memory_blocks = peer_blocks(cfg)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(cfg, PEER(cfg.d_model, heads=cfg.peer_heads, k_dim=cfg.peer_k_dim, n_keys=cfg.peer_n_keys,
                            knn=cfg.peer_knn, query_norm=cfg.memory_query_norm, sparse_experts=cfg.sparse_experts)
                  if i in self.memory_blocks else MLP(cfg))
            for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        residual_std = 0.02 / math.sqrt(2 * cfg.n_layers)  # GPT-2: residual writes scaled down with depth
        for block in self.blocks:
            if isinstance(block.ff, MLP):
                nn.init.normal_(block.ff.proj.weight, std=residual_std)
        for layer in self.memories:
            layer.reset_expert_parameters(up_std=residual_std)  # the experts' up vectors are residual writes

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    @property
    def memories(self) -> list[PEER]:
        """The PEER layers, in block order."""
        return [self.blocks[i].ff for i in self.memory_blocks]

    @property
    def memory(self) -> PEER:
        """The first PEER layer."""
        return self.memories[0]

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
        """The expert tables at expert_lr_multiplier x lr, everything else at lr; with sparse_experts the expert
        group is marked "sparse" for a lazy optimiser (torch.optim.SparseAdam: only rows read are updated)."""
        experts = [p for layer in self.memories for p in layer.expert_parameters()]
        return table_optimizer_groups(self, experts, lr, lr * self.cfg.expert_lr_multiplier, self.cfg.sparse_experts)

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs at batch 1 that DeepSpeed's profiler misses, per PEER layer: the candidate-score sums and
        the experts (u_i . x and the weighted sum of the v_i); it counts the query projection, the half-key scores
        (matmuls) and, on the CPU path, the activation."""
        cfg = self.cfg
        parts = peer_flops(seq_len, cfg.d_model, heads=cfg.peer_heads, k_dim=cfg.peer_k_dim, n_keys=cfg.peer_n_keys,
                           knn=cfg.peer_knn)
        return len(self.memory_blocks) * (parts["candidate_sums"] + parts["experts"])

    def reset_memory_stats(self) -> None:
        """Start recording each PEER layer's expert reads in every forward until the next reset."""
        for layer in self.memories:
            layer.stats = MemoryStats(layer.num_experts)

    def memory_stats(self) -> dict:
        """languini.memory_stats.MemoryStats.result() of the experts read since reset_memory_stats, weighted by
        their router scores (the paper's expert usage and unevenness, section 3.3 and Table 2, are its
        memory_usage and kl_from_uniform); when running distributed, over all processes, so every process must
        call it. With several PEER layers, each layer's under "layers" ("block_<i>")."""
        return layers_result(self.memories, self.memory_blocks, self.memory.down.device)
