"""The GPT (languini/transformer.py) with one block's MLP replaced by the E8 lattice memory (Goucher & Troll, 3.1).

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
import torch.nn as nn

from languini import model_parallel
from languini.memory_layers import memory_gpt_blocks, memory_layer_indices, table_optimizer_groups
from languini.memory_stats import MemoryStats, layers_result
from languini.transformer import GPT, Block, init_residual_
from projects.lram_gpt.configs import ModelConfig
from projects.lram_gpt.lattice import DIM, FUNDAMENTAL_POINTS
from projects.lram_gpt.memory import VALUE_DTYPES, LRAMBlock

TORUS_QUERY_FLOPS = DIM * 7 + DIM


def theta_flops(tokens: int, heads: int, topk: int, value_dim: int) -> int:
    """Forward FLOPs of theta for `tokens` tokens of `heads` heads (the formula in the module docstring)."""
    candidates = FUNDAMENTAL_POINTS.shape[0]
    per_head = TORUS_QUERY_FLOPS + candidates * DIM * 3 + 4 * topk + 2 * topk * value_dim + value_dim
    return tokens * heads * per_head


def lram_block(cfg: ModelConfig, values: nn.Parameter | None = None) -> LRAMBlock:
    """A memory layer of the config, reading `values` (another layer's table) or a table of its own."""
    if cfg.memory_value_dtype not in VALUE_DTYPES:
        raise ValueError(f"memory_value_dtype must be one of {list(VALUE_DTYPES)}, got {cfg.memory_value_dtype!r}")
    return LRAMBlock(cfg.d_model, memory_size=cfg.memory_size, value_dim=cfg.memory_value_dim, topk=cfg.memory_topk,
                     query_norm=cfg.memory_query_norm, value_grad=cfg.memory_value_grad,
                     sparse_values=cfg.sparse_values, value_dtype=VALUE_DTYPES[cfg.memory_value_dtype], values=values,
                     gate=cfg.memory_gate, shards=model_parallel.shard_group(cfg.memory_shards, "--memory_shards"))


class Model(GPT):
    """The GPT of languini/transformer.py whose memory blocks' feed-forward part `ff` is the lattice memory."""

    def __init__(self, cfg: ModelConfig):
        memory_blocks = memory_layer_indices(cfg.memory_layers, cfg.n_layers)
        # with share_memory, later memory layers read the first one's table
        super().__init__(cfg, memory_gpt_blocks(cfg, memory_blocks, lambda values: lram_block(cfg, values)))
        self.memory_blocks = memory_blocks
        for memory in self.memories:  # the memory's own value init, not the GPT's
            if memory.owns_values:
                memory.reset_values()

    def init_block(self, block: Block) -> None:
        """GPT-2: the feed-forward residual write is scaled down with depth."""
        init_residual_(block.ff.out if isinstance(block.ff, LRAMBlock) else block.ff.proj, self.cfg.n_layers)

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

    def optimizer_groups(self, lr: float) -> list[dict]:
        """The value table at value_lr_multiplier x lr, everything else at lr; with sparse_values the value
        group is marked "sparse" for a lazy optimiser (torch.optim.SparseAdam: only rows read are updated)."""
        return table_optimizer_groups(self, self.value_tables(), lr, lr * self.cfg.value_lr_multiplier,
                                      self.cfg.sparse_values)

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
        return layers_result(self.memories, self.memory_blocks, self.memory.values.device, self.cfg.share_memory)
