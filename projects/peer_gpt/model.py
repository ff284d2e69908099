"""The GPT of languini/transformer.py with the MLP of the middle block replaced by a PEER layer (He 2024, section 3.1).

The layer maps d_model -> d_model and writes to the residual stream as the MLP it replaces. Its expert tables train
at `expert_lr_multiplier` x the learning rate (see `optimizer_groups`); with `sparse_experts` their gradients hold
only the rows read and their group is marked for a lazy SparseAdam. --memory_layers 1,3 puts a PEER layer, each
with its own experts, in several blocks.
"""
from languini.memory_layers import memory_layer_indices, table_optimizer_groups
from languini.memory_stats import MemoryStats, layers_result
from languini.transformer import GPT, MLP, Block, init_residual_, residual_std
from projects.peer_gpt.configs import ModelConfig
from projects.peer_gpt.peer import PEER, peer_flops


def peer_blocks(cfg: ModelConfig) -> list[int]:
    """The blocks (from 0) whose MLP a PEER layer replaces: memory_layers, or the middle block (n_layers - 1) // 2,
    the paper's "block 6" of 12 (section 3.1)."""
    layers = str((cfg.n_layers - 1) // 2) if cfg.memory_layers is None else cfg.memory_layers
    return memory_layer_indices(layers, cfg.n_layers)


class Model(GPT):
    """The GPT of languini/transformer.py whose PEER blocks' feed-forward part `ff` is a PEER layer."""

    def __init__(self, cfg: ModelConfig):
        memory_blocks = peer_blocks(cfg)

        def make_block(i):
            if i not in memory_blocks:
                return Block(cfg, MLP(cfg.d_model, cfg.mlp_ratio), ff_name="ff")
            return Block(cfg, PEER(cfg.d_model, heads=cfg.peer_heads, k_dim=cfg.peer_k_dim, n_keys=cfg.peer_n_keys,
                                   knn=cfg.peer_knn, query_norm=cfg.memory_query_norm,
                                   sparse_experts=cfg.sparse_experts), ff_name="ff")

        super().__init__(cfg, make_block)
        self.memory_blocks = memory_blocks
        for layer in self.memories:  # the experts' up vectors are residual writes
            layer.reset_expert_parameters(up_std=residual_std(cfg.n_layers))

    def init_block(self, block: Block) -> None:
        """GPT-2: the MLPs' residual writes are scaled down with depth (a PEER layer's, its up vectors, above)."""
        if isinstance(block.ff, MLP):
            init_residual_(block.ff.proj, self.cfg.n_layers)

    @property
    def memories(self) -> list[PEER]:
        """The PEER layers, in block order."""
        return [self.blocks[i].ff for i in self.memory_blocks]

    @property
    def memory(self) -> PEER:
        """The first PEER layer."""
        return self.memories[0]

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
