"""The LRAM layer (Goucher & Troll, 2.3 and 3.1): the theta activation, the memory sub-network, access statistics.

theta(z) = (sum_i 1/|z_i|)^-1 * phi(K_1/(2 pi) arg z_1, ..., K_8/(2 pi) arg z_8) for z in C^8; each head reads
16 reals as (re_1..re_8, im_1..im_8), and all heads share one memory of N rows of m values. The harmonic
scale makes theta(lambda z) = lambda theta(z) for lambda >= 0 and keeps theta continuous at z_i = 0.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from projects.lram_gpt import lattice
from projects.lram_gpt.lattice import DEFAULT_TOPK, DIM, check_torus

HEAD_INPUTS = 2 * DIM  # 16 reals per head: 8 real parts, then 8 imaginary parts
QUERY_NORMS = ("layer", "batch", "none")
# The value table's dtype: bf16 halves the bytes a lookup reads (both paths sum in fp32; the optimiser then
# updates bf16 values, so small steps round away: an option to measure, not the default).
VALUE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torus_query(z: torch.Tensor, K):
    """Harmonic scale [..., 1] and lattice coordinates q [..., 8] of heads z [..., 16] (float32 or wider).

    q_i = K_i / (2 pi) * arg z_i. A z_i that is exactly 0 gets arg 0 and modulus sqrt(tiny), so the scale
    (and theta) is ~0 there with finite gradients instead of NaN.
    """
    if z.shape[-1] != HEAD_INPUTS:
        raise ValueError(f"each head needs 16 inputs (re_1..re_8, im_1..im_8), got shape {tuple(z.shape)}")
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    real, imag = z[..., :DIM], z[..., DIM:]
    squared = real * real + imag * imag
    at_zero = squared == 0
    modulus = torch.sqrt(squared.clamp_min(torch.finfo(z.dtype).tiny))
    scale = 1 / (1 / modulus).sum(-1, keepdim=True)
    angle = torch.atan2(imag, torch.where(at_zero, torch.ones_like(real), real))
    periods = torch.tensor(check_torus(K), dtype=z.dtype, device=z.device)
    return scale, angle * (periods / (2 * math.pi))


def theta(z: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK, use_triton: bool | None = None,
          value_grad: str = "atomic", sparse_values: bool = False) -> torch.Tensor:
    """theta for heads z [..., 16] reading values [N, m] on the torus K: [..., m] in float32 (float64 for float64 z;
    on the Triton path the autocast dtype where autocast is on).

    use_triton: None picks the Triton kernel exactly when the values are on CUDA; True forces it (on CPU it
    runs under TRITON_INTERPRET=1; float64 z always takes the reference); False forces the PyTorch reference.
    value_grad: see lookup_triton.interpolate_triton.
    sparse_values: the value gradient is a coalesced sparse COO tensor of the rows read, on either path.
    """
    if _triton_path(values, use_triton) and z.dtype != torch.float64:
        from projects.lram_gpt.lookup_triton import theta_triton  # the reference path needs no Triton

        # one kernel: torus query, lookup, harmonic scale, and the output in the autocast dtype where it is on
        return theta_triton(z, values, K, topk, value_grad, sparse_values)
    scale, q = torus_query(z, K)
    if sparse_values:
        phi = interpolate_sparse_grad(q, values, K, topk)
    else:
        phi = lattice.interpolate(q, values, K, topk)
    return scale * phi.to(scale.dtype)


class _GatherRows(torch.autograd.Function):
    """values[rows] for unique rising rows; the gradient is the sparse COO tensor of those rows only."""

    @staticmethod
    def forward(ctx, values, rows):
        ctx.save_for_backward(rows)
        ctx.values_shape = values.shape
        return values.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad_rows):
        (rows,) = ctx.saved_tensors
        grad = torch.sparse_coo_tensor(rows[None], grad_rows, ctx.values_shape, is_coalesced=True,
                                       check_invariants=False)
        return grad, None


@torch.compiler.disable  # data-dependent shapes and a sparse gradient: nothing for torch.compile to gain
def interpolate_sparse_grad(q: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK) -> torch.Tensor:
    """lattice.interpolate whose value gradient is a coalesced sparse COO tensor of the rows read (reference).

    The rows read are gathered once into a small table and the weighted sum reads that table, so the
    table's (dense) gradient already holds one summed row per memory index read.
    """
    if values.shape[0] != lattice.memory_size(K):
        raise ValueError(f"values has {values.shape[0]} rows but the torus {tuple(K)} has {lattice.memory_size(K)}")
    index, weight = lattice.lookup(q, K, topk)
    rows_read, position = torch.unique(index, sorted=True, return_inverse=True)
    # the cast after the gather makes the summed row gradients accumulate in float32 or wider, not in bf16
    table = _GatherRows.apply(values, rows_read).to(torch.promote_types(q.dtype, torch.float32))
    return lattice.weighted_read(position, weight, table)


def _triton_path(tensor: torch.Tensor, use_triton: bool | None) -> bool:
    return tensor.is_cuda if use_triton is None else use_triton


class LRAMBlock(nn.Module):
    """The memory sub-network of section 3.1, a drop-in for the MLP: [B, T, w] -> [B, T, w].

    dense affine w -> w, query normalisation, theta with (n, m, h) = (8, value_dim, w/16), dense affine
    h*value_dim -> w (4w for the paper's value_dim = 64). Give the memory as memory_size (a power of two)
    or as the torus periods K. The value table is `values` [N, value_dim]; value_parameters() hands it to
    a trainer's own optimiser group (the paper trains it with 10x the learning rate).

    query_norm: "layer" (default) normalises each token over its own features, so no token sees another
    and the block stays causal; "batch" is the paper's batch norm (statistics over the batch and time, so
    later tokens change earlier outputs in a causal LM); "none" skips it.

    value_dtype: torch.float32 (default) or torch.bfloat16 for the value table (VALUE_DTYPES).

    sparse_values: the gradient of `values` is a coalesced sparse COO tensor holding only the rows read
    (as nn.Embedding(sparse=True)), for a lazy optimiser such as torch.optim.SparseAdam. On the Triton
    path it is always gathered by the segment sums, whatever value_grad says.
    """

    def __init__(self, d_model: int, memory_size: int | None = None, K=None, value_dim: int = 64,
                 topk: int = DEFAULT_TOPK, query_norm: str = "layer", use_triton: bool | None = None,
                 value_grad: str = "atomic", sparse_values: bool = False, value_dtype: torch.dtype = torch.float32):
        super().__init__()
        if d_model % HEAD_INPUTS:
            raise ValueError(f"d_model must be a multiple of 16 (16 inputs per head), got {d_model}")
        if (memory_size is None) == (K is None):
            raise ValueError("give exactly one of memory_size (a power of two) and K (8 torus periods)")
        if query_norm not in QUERY_NORMS:
            raise ValueError(f"query_norm must be one of {QUERY_NORMS}, got {query_norm!r}")
        self.K = check_torus(K) if K is not None else lattice.torus_for_memory_size(memory_size)
        self.n_heads, self.value_dim, self.topk = d_model // HEAD_INPUTS, value_dim, topk
        self.use_triton, self.value_grad, self.sparse_values = use_triton, value_grad, sparse_values
        self.query = nn.Linear(d_model, d_model)
        self.query_norm = {"layer": nn.LayerNorm(d_model), "batch": nn.BatchNorm1d(d_model),
                           "none": nn.Identity()}[query_norm]
        if value_dtype not in VALUE_DTYPES.values():
            raise ValueError(f"value_dtype must be one of {list(VALUE_DTYPES)}, got {value_dtype}")
        self.values = nn.Parameter(torch.empty(self.memory_size, value_dim, dtype=value_dtype))
        self.out = nn.Linear(self.n_heads * value_dim, d_model)
        self.reset_values()

    @property
    def memory_size(self) -> int:
        return lattice.memory_size(self.K)

    def reset_values(self):
        """Values ~ N(0, 1/value_dim), as product-key memories initialise theirs (Lample et al., 2019)."""
        nn.init.normal_(self.values, std=self.value_dim ** -0.5)

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
        read = theta(self.heads(x), self.values, self.K, self.topk, self.use_triton, self.value_grad,
                     self.sparse_values)
        read = read.flatten(-2)
        # the kernel already wrote the autocast dtype (bf16, fp16), which the output layer takes as it is
        return self.out(read if read.dtype in (torch.bfloat16, torch.float16) else read.to(x.dtype))

    @torch.no_grad()
    def read_locations(self, x: torch.Tensor):
        """The memory reads of x [B, T, w]: (index [B, T, h, topk], weight [B, T, h, topk]) for MemoryAccessStats."""
        _, q = torus_query(self.heads(x), self.K)
        if _triton_path(self.values, self.use_triton):
            from projects.lram_gpt.lookup_triton import lookup_triton

            return lookup_triton(q, self.K, self.topk)
        return lattice.lookup(q, self.K, self.topk)


class MemoryAccessStats:
    """Memory use over a split (paper Table 5): update(index, weight) with each lookup, then result().

    Accumulates the total read weight of every location. result() gives the share of locations read with
    positive weight and the KL divergence (nats) of the normalised weight distribution from uniform.
    """

    def __init__(self, memory_size: int):
        self.memory_size = memory_size
        self.weight = torch.zeros(memory_size, dtype=torch.float64)

    @torch.no_grad()
    def update(self, index: torch.Tensor, weight: torch.Tensor):
        if index.shape != weight.shape:
            raise ValueError(f"index {tuple(index.shape)} and weight {tuple(weight.shape)} must match")
        self.weight = self.weight.to(index.device)  # accumulate where the lookups are
        self.weight.index_add_(0, index.reshape(-1), weight.reshape(-1).to(torch.float64))

    def result(self) -> dict[str, float]:
        total = self.weight.sum()
        if total <= 0:
            raise ValueError("no memory reads recorded; call update(index, weight) first")
        p = self.weight / total
        used = p > 0
        kl = (p[used] * torch.log(p[used] * self.memory_size)).sum()
        return {"memory_usage": used.double().mean().item(), "kl_from_uniform": kl.item()}
