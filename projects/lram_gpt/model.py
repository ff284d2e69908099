"""The GPT of projects/gpt (copied) with one block's MLP replaced by the E8 lattice memory (Goucher & Troll, 3.1).

The memory sub-network (memory.LRAMBlock: affine w -> w, query norm, theta with w/16 heads of 64 values,
affine 4w -> w) writes to the residual stream as the MLP it replaces. Its value table keeps its own init and
trains at `value_lr_multiplier` x the learning rate (optimizer_groups), as in the LRAM paper (3.2).
--memory_layers 2,4 puts a memory in several blocks, each with its own table or, with --share_memory, all
reading one (the paper's section 6); --memory_gate silu gates each read (Memory+); --memory_shards splits each
table's columns over processes (languini/model_parallel.py).

FLOPs: DeepSpeed's profiler sees the memory's two affine maps and its query norm, but nothing of theta
(the lookup is elementwise torch ops or a Triton kernel; the weighted sum an embedding bag or the kernel),
so extra_flops adds theta analytically, per token and head:
    64                  the torus query: 8 x (re^2 + im^2, sqrt, 1/|z|, atan2, x K_i/(2 pi)) + the harmonic sum
  + 232 * 8 * 3         squared distances to the 232 candidate points near the fundamental region
  + 4 * topk            kernel weights (1 - d^2/8)^4 of the points kept
  + 2 * topk * m        the weighted sum of the topk value rows
  + m                   the harmonic scale times the read
with 1 FLOP per elementary function; rounding, comparisons, the sort and the top-k selection count none.
For topk = 32 and m = 64: 9920 FLOPs per token and head. With the Memory+ gate the profiler sees W_g and the
silu, not the product of read and gate: h * m more per token. Every memory layer counts its reads; a shared table's
parameters count once.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from languini import model_parallel
from languini.memory_layers import memory_layer_indices
from languini.memory_stats import MemoryStats
from projects.lram_gpt.configs import ModelConfig
from projects.lram_gpt.lattice import DIM, FUNDAMENTAL_POINTS
from projects.lram_gpt.memory import VALUE_DTYPES, LRAMBlock

TORUS_QUERY_FLOPS = DIM * 7 + DIM


def theta_flops(tokens: int, heads: int, topk: int, value_dim: int) -> int:
    """Forward FLOPs of theta for `tokens` tokens of `heads` heads (the formula in the module docstring)."""
    candidates = FUNDAMENTAL_POINTS.shape[0]
    per_head = TORUS_QUERY_FLOPS + candidates * DIM * 3 + 4 * topk + 2 * topk * value_dim + value_dim
    return tokens * heads * per_head


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
    """Pre-LayerNorm block; its feed-forward part `ff` is an MLP or the lattice memory."""

    def __init__(self, cfg: ModelConfig, ff: nn.Module):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.ff = nn.LayerNorm(cfg.d_model), ff

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ff(self.ln2(x))


def lram_block(cfg: ModelConfig, values: nn.Parameter | None = None) -> LRAMBlock:
    """A memory layer of the config, reading `values` (another layer's table) or a table of its own."""
    if cfg.memory_value_dtype not in VALUE_DTYPES:
        raise ValueError(f"memory_value_dtype must be one of {list(VALUE_DTYPES)}, got {cfg.memory_value_dtype!r}")
    return LRAMBlock(cfg.d_model, memory_size=cfg.memory_size, value_dim=cfg.memory_value_dim, topk=cfg.memory_topk,
                     query_norm=cfg.memory_query_norm, value_grad=cfg.memory_value_grad,
                     sparse_values=cfg.sparse_values, value_dtype=VALUE_DTYPES[cfg.memory_value_dtype], values=values,
                     gate=cfg.memory_gate, shards=model_parallel.shard_group(cfg.memory_shards, "--memory_shards"))


class Model(nn.Module):
    stateful = False  # every window starts afresh (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.memory_blocks = memory_layer_indices(cfg.memory_layers, cfg.n_layers)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        blocks, first = [], None
        for i in range(cfg.n_layers):
            if i in self.memory_blocks:  # with share_memory, later memory layers read the first one's table
                memory = lram_block(cfg, first.values if cfg.share_memory and first is not None else None)
                first = first or memory
                blocks.append(Block(cfg, memory))
            else:
                blocks.append(Block(cfg, MLP(cfg)))
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: the feed-forward residual write is scaled down with depth
            residual_write = block.ff.out if isinstance(block.ff, LRAMBlock) else block.ff.proj
            nn.init.normal_(residual_write.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
        for memory in self.memories:  # the memory's own value init, not the GPT's
            if memory.owns_values:
                memory.reset_values()

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    @property
    def memories(self) -> list[LRAMBlock]:
        """The memory layers, in block order."""
        return [self.blocks[i].ff for i in self.memory_blocks]

    @property
    def memory(self) -> LRAMBlock:
        """The first memory layer."""
        return self.memories[0]

    def value_tables(self) -> list[nn.Parameter]:
        """Each value table once (a shared one is read by several memory layers)."""
        return list({id(p): p for m in self.memories for p in m.value_parameters()}.values())

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
        values = self.value_tables()
        value_ids = {id(p) for p in values}
        rest = [p for p in self.parameters() if id(p) not in value_ids]
        value_group = {"params": values, "lr": lr * self.cfg.value_lr_multiplier}
        if self.cfg.sparse_values:
            value_group["sparse"] = True
        return [{"params": rest, "lr": lr}, value_group]

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs at batch 1 that DeepSpeed's profiler misses: theta of every memory layer, and the
        product of read and gate (see the module docstring)."""
        return sum(theta_flops(seq_len, m.n_heads, m.topk, m.value_dim)
                   + (seq_len * m.n_heads * m.value_dim if m.gate is not None else 0) for m in self.memories)

    # -- memory statistics (LRAM paper, Table 5) ---------------------------------------------------------
    def reset_memory_stats(self) -> None:
        """Start recording each memory layer's reads in every forward until the next reset."""
        for memory in self.memories:
            memory.stats = MemoryStats(memory.memory_size)

    def memory_stats(self) -> dict:
        """languini.memory_stats.MemoryStats.result() of the reads since reset_memory_stats; when running
        distributed, over all processes, so every process must call it. With several memory layers, each
        layer's under "layers" ("block_<i>"), and a shared table's (all its layers' reads) at the top."""
        if any(m.stats is None for m in self.memories):
            raise ValueError("memory_stats() needs reset_memory_stats() and a forward pass first.")
        device = self.memory.values.device
        merged = [m.stats.all_processes(device) for m in self.memories]
        if len(merged) == 1:
            return merged[0].result()
        stats = {"layers": {f"block_{i}": s.result() for i, s in zip(self.memory_blocks, merged)}}
        if self.cfg.share_memory:
            table = MemoryStats(self.memory.memory_size)
            table.weight = sum(s.weight for s in merged)
            stats.update(table.result())
        return stats
