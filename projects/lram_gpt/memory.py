"""The LRAM layer (Goucher & Troll, 2.3 and 3.1): the theta activation and the memory sub-network.

theta(z) = (sum_i 1/|z_i|)^-1 * phi(K_1/(2 pi) arg z_1, ..., K_8/(2 pi) arg z_8) for z in C^8; each head reads
16 reals as (re_1..re_8, im_1..im_8), and all heads share one memory of N rows of m values. The harmonic
scale makes theta(lambda z) = lambda theta(z) for lambda >= 0 and keeps theta continuous at z_i = 0.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from languini import model_parallel
from languini.memory_layers import check_value_grad, gate_layer, gated, query_norm_layer, sharded_bag
from languini.memory_stats import MemoryStats
from projects.lram_gpt import lattice
from projects.lram_gpt.lattice import DEFAULT_TOPK, check_torus
from projects.lram_gpt.ops.lookup import naive
from projects.lram_gpt.ops.lookup.naive import HEAD_INPUTS, torus_query

# The value table's dtype: bf16 halves the bytes a lookup reads (both paths sum in fp32; the optimiser then
# updates bf16 values, so small steps round away: an option to measure, not the default).
VALUE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def theta(z: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK, use_triton: bool | None = None,
          value_grad: str = "atomic", sparse_values: bool = False) -> torch.Tensor:
    """theta for heads z [..., 16] reading values [N, m] on the torus K: [..., m] in float32 (float64 for float64 z;
    on the Triton path the autocast dtype where autocast is on).

    use_triton: None picks the Triton kernel exactly when the values are on CUDA; True forces it (on CPU it
    runs under TRITON_INTERPRET=1; float64 z always takes the reference); False forces the PyTorch reference.
    value_grad: see ops.lookup.triton.interpolate_triton.
    sparse_values: the value gradient is a coalesced sparse COO tensor of the rows read, on either path.
    """
    if _triton_path(values, use_triton) and z.dtype != torch.float64:
        from projects.lram_gpt.ops.lookup.triton import theta_triton  # the reference path needs no Triton

        # one kernel: torus query, lookup, harmonic scale, and the output in the autocast dtype where it is on
        return theta_triton(z, values, K, topk, value_grad, sparse_values)
    return naive.theta(z, values, K, topk, sparse_values)


def _triton_path(tensor: torch.Tensor, use_triton: bool | None) -> bool:
    return tensor.is_cuda if use_triton is None else use_triton


class LRAMBlock(nn.Module):
    """The memory sub-network of section 3.1, a drop-in for the MLP: [B, T, w] -> [B, T, w].

    dense affine w -> w, query normalisation, theta with (n, m, h) = (8, value_dim, w/16), dense affine
    h*value_dim -> w (4w for the paper's value_dim = 64). Give the memory as memory_size (a power of two)
    or as the torus periods K. The value table is `values` [N, value_dim]; value_parameters() hands it to
    a trainer's own optimiser group (the paper trains it with 10x the learning rate).

    values: another LRAMBlock's table to read instead of a table of its own (one memory read by several layers,
    the paper's section 6), of the same size. gate: "silu" multiplies the read by silu(W_g x) before the output
    affine map (Memory+), "none" does not. shards: the model-parallel group the table's columns are split over
    (languini.model_parallel.shard_group); a split table is read by languini.memory_layers.sharded_bag, its
    pairs from the PyTorch lookup on any device (the fused Triton kernel reads whole rows).

    query_norm: "layer" (default) normalises each token over its own features, so no token sees another
    and the block stays causal; "batch" is the paper's batch norm (statistics over the batch and time, so
    later tokens change earlier outputs in a causal LM); "none" skips it. value_grad: "atomic" or "segment"
    (languini.memory_layers).

    value_dtype: torch.float32 (default) or torch.bfloat16 for the value table (VALUE_DTYPES).

    sparse_values: the gradient of `values` is a coalesced sparse COO tensor holding only the rows read
    (as nn.Embedding(sparse=True)), for a lazy optimiser such as torch.optim.SparseAdam. On the Triton
    path it is always gathered by the segment sums, whatever value_grad says.

    While `stats` holds a MemoryStats, every forward records its reads (read_locations) there.
    """

    def __init__(self, d_model: int, memory_size: int | None = None, K=None, value_dim: int = 64,
                 topk: int = DEFAULT_TOPK, query_norm: str = "layer", use_triton: bool | None = None,
                 value_grad: str = "atomic", sparse_values: bool = False, value_dtype: torch.dtype = torch.float32,
                 values: nn.Parameter | None = None, gate: str = "none",
                 shards: model_parallel.ShardGroup = model_parallel.WHOLE):
        super().__init__()
        if d_model % HEAD_INPUTS:
            raise ValueError(f"d_model must be a multiple of 16 (16 inputs per head), got {d_model}")
        if (memory_size is None) == (K is None):
            raise ValueError("give exactly one of memory_size (a power of two) and K (8 torus periods)")
        check_value_grad(value_grad)
        self.K = check_torus(K) if K is not None else lattice.torus_for_memory_size(memory_size)
        self.n_heads, self.value_dim, self.topk = d_model // HEAD_INPUTS, value_dim, topk
        self.use_triton, self.value_grad, self.sparse_values = use_triton, value_grad, sparse_values
        self.query = nn.Linear(d_model, d_model)
        self.query_norm = query_norm_layer(query_norm, d_model)
        if value_dtype not in VALUE_DTYPES.values():
            raise ValueError(f"value_dtype must be one of {list(VALUE_DTYPES)}, got {value_dtype}")
        if sparse_values and shards.size > 1:
            raise ValueError("sparse_values is single-process only; a value table split over processes "
                             "(--memory_shards) takes dense gradients")
        self.gate = gate_layer(gate, d_model, self.n_heads * value_dim)
        self.out = nn.Linear(self.n_heads * value_dim, d_model)
        self.stats: MemoryStats | None = None  # set (evaluation) to record the reads of every forward
        self.owns_values = values is None
        if values is None:
            self.values = model_parallel.parameter((self.memory_size, value_dim), shards, dim=1, dtype=value_dtype,
                                                   what="the memory's value_dim")
            self.reset_values()
        else:
            s = model_parallel.sharding(values)
            shape = s.full_shape if s else tuple(values.shape)
            if shape != (self.memory_size, value_dim):
                raise ValueError(f"a shared value table must be [memory_size, value_dim] = "
                                 f"{[self.memory_size, value_dim]}, got {list(shape)}")
            self.values = values

    @property
    def memory_size(self) -> int:
        return lattice.memory_size(self.K)

    def reset_values(self):
        """Values ~ N(0, 1/value_dim), as product-key memories initialise theirs (Lample et al., 2019); the same
        numbers however the table is split (languini.model_parallel.init_)."""
        model_parallel.init_(self.values, lambda t: nn.init.normal_(t, std=self.value_dim ** -0.5))

    def value_parameters(self) -> list[nn.Parameter]:
        """The memory values, for an optimiser group of their own."""
        return [self.values]

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised queries of x [B, T, w] split into heads: [B, T, h, 16]."""
        z = self.query(x)
        if isinstance(self.query_norm, nn.BatchNorm1d):
            z = self.query_norm(z.reshape(-1, z.shape[-1])).view_as(z)
        else:
            z = self.query_norm(z)
        return z.view(*z.shape[:-1], self.n_heads, HEAD_INPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats is not None:
            self.stats.update(*self.read_locations(x))
        if model_parallel.sharding(self.values):
            read = self.theta_sharded(self.heads(x))
        else:
            read = theta(self.heads(x), self.values, self.K, self.topk, self.use_triton, self.value_grad,
                         self.sparse_values)
        read = read.flatten(-2)
        # the kernel already wrote the autocast dtype (bf16, fp16), which the output layer takes as it is
        read = read if read.dtype in (torch.bfloat16, torch.float16) else read.to(x.dtype)
        return self.out(gated(read, self.gate, x))

    def theta_sharded(self, z: torch.Tensor) -> torch.Tensor:
        """theta of heads z [..., 16] from a table split by columns: the lookup here, the harmonic scale folded
        into its weights, the weighted read of every process's pairs by languini.memory_layers.sharded_bag."""
        scale, q = torus_query(z, self.K)
        index, weight = naive.lookup(q, self.K, self.topk)
        pairs = index.reshape(-1, self.topk), (weight * scale).reshape(-1, self.topk)
        read = sharded_bag(*pairs, self.values, lambda i, w, table: naive.weighted_read(i, w, table.float()))
        return read.view(*z.shape[:-1], self.value_dim)

    @torch.no_grad()
    def read_locations(self, x: torch.Tensor):
        """The memory reads of x [B, T, w]: (index [B, T, h, topk], weight [B, T, h, topk]) for MemoryStats."""
        _, q = torus_query(self.heads(x), self.K)
        if _triton_path(self.values, self.use_triton):
            from projects.lram_gpt.ops.lookup.triton import lookup_triton

            return lookup_triton(q, self.K, self.topk)
        return naive.lookup(q, self.K, self.topk)
