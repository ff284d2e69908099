"""The GPT of languini/transformer.py with one block's MLP replaced by a product-key memory (Lample et al. 2019).

The memory maps d_model -> d_model and writes to the residual stream as the MLP it replaces. Its value table
trains at `value_lr_multiplier` x the learning rate (see `optimizer_groups`), as in the LRAM paper; with
`sparse_values` its gradient holds only the rows read and its group is marked for a lazy SparseAdam.
--memory_layers 2,4 puts a memory in several blocks, each with its own table or, with --share_memory, all reading
one (each with its own queries and sub-keys); --memory_gate silu is Memory+ (W_o(read * silu(W_g x))), the
profiler counting W_g, W_o and the silu, extra_flops the product; --memory_shards splits each table's columns over
processes (languini/model_parallel.py).
"""
import torch.nn as nn

from languini import model_parallel
from languini.memory_layers import memory_gpt_blocks, memory_layer_indices, table_optimizer_groups
from languini.memory_stats import MemoryStats, layers_result
from languini.transformer import GPT, MLP, Block, init_residual_
from projects.pkm_gpt.configs import ModelConfig
from projects.pkm_gpt.pkm import ProductKeyMemory, pkm_flops


def product_key_memory(cfg: ModelConfig, values: nn.Parameter | None = None) -> ProductKeyMemory:
    """A memory layer of the config, reading `values` (another layer's table) or a table of its own."""
    return ProductKeyMemory(cfg.d_model, heads=cfg.pkm_heads, k_dim=cfg.pkm_k_dim, n_keys=cfg.pkm_n_keys,
                            knn=cfg.pkm_knn, query_norm=cfg.memory_query_norm, value_grad=cfg.memory_value_grad,
                            sparse_values=cfg.sparse_values, values=values, gate=cfg.memory_gate,
                            shards=model_parallel.shard_group(cfg.memory_shards, "--memory_shards"),
                            init=cfg.memory_init, sigmoid_gate=cfg.memory_sigmoid_gate)


class Model(GPT):
    """The GPT of languini/transformer.py whose memory blocks' feed-forward part `ff` is a product-key memory."""

    def __init__(self, cfg: ModelConfig):
        memory_blocks = memory_layer_indices(cfg.memory_layers, cfg.n_layers)
        # with share_memory, later memory layers read the first one's table
        super().__init__(cfg, memory_gpt_blocks(cfg, memory_blocks, lambda values: product_key_memory(cfg, values)))
        self.memory_blocks = memory_blocks
        for memory in self.memories:
            memory.reset_memory_parameters()  # the memory's own init (memory_init), not the GPT's

    def init_block(self, block: Block) -> None:
        """GPT-2: the residual writes of MLPs (and of gated memories) are scaled with depth."""
        residual_write = block.ff.proj if isinstance(block.ff, MLP) else block.ff.out
        if residual_write is not None:
            init_residual_(residual_write, self.cfg.n_layers)

    @property
    def memories(self) -> list[ProductKeyMemory]:
        """The memory layers, in block order."""
        return [self.blocks[i].ff for i in self.memory_blocks]

    @property
    def memory(self) -> ProductKeyMemory:
        """The first memory layer."""
        return self.memories[0]

    def value_tables(self) -> list[nn.Parameter]:
        """Each value table once (a shared one is read by several memory layers)."""
        return list({id(p): p for m in self.memories for p in m.value_parameters()}.values())

    def optimizer_groups(self, lr: float) -> list[dict]:
        """The value table at value_lr (fixed) or value_lr_multiplier x lr, everything else at lr (the schedule
        scales both alike); with sparse_values the value group is marked "sparse" for a lazy optimiser
        (torch.optim.SparseAdam: only rows read are updated)."""
        value_lr = self.cfg.value_lr if self.cfg.value_lr is not None else lr * self.cfg.value_lr_multiplier
        return table_optimizer_groups(self, self.value_tables(), lr, value_lr, self.cfg.sparse_values)

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs at batch 1 that DeepSpeed's profiler misses, per memory layer: the candidate-score sums
        and the embedding bag (the query projection and the half-key scores are matmuls it counts), with the
        Memory+ gate the product of read and gate (it counts W_g, W_o and the silu), and with the sigmoid gate the
        output times its scalar (it counts the gate's map and the sigmoid)."""
        cfg = self.cfg
        parts = pkm_flops(seq_len, cfg.d_model, heads=cfg.pkm_heads, k_dim=cfg.pkm_k_dim, n_keys=cfg.pkm_n_keys,
                          knn=cfg.pkm_knn)
        per_layer = parts["candidate_sums"] + parts["embedding_bag"]
        return sum(per_layer + (seq_len * m.v_dim if m.gate is not None else 0)
                   + (seq_len * cfg.d_model if m.sigmoid_gate is not None else 0) for m in self.memories)

    def reset_memory_stats(self) -> None:
        """Start recording each memory layer's reads in every forward until the next reset."""
        for memory in self.memories:
            memory.stats = MemoryStats(memory.num_values)

    def memory_stats(self) -> dict:
        """languini.memory_stats.MemoryStats.result() of the reads since reset_memory_stats (LRAM paper Table 5);
        when running distributed, over all processes, so every process must call it. With several memory
        layers, each layer's under "layers" ("block_<i>"), and a shared table's (all its layers' reads) at the top."""
        return layers_result(self.memories, self.memory_blocks, self.memory.values.device, self.cfg.share_memory)
