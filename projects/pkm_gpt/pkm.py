"""Product-key memory layer (Lample et al. 2019, "Large Memory Layers with Product Keys").

Per token and head, a query of k_dim is split into two halves; each half is scored against its
own n_keys sub-keys, and the knn best of each half give knn x knn candidate keys whose score is
the sum of the two half scores. The knn best candidates (exactly the best knn of all
N = n_keys^2 product keys) are softmax-weighted, and the output is the weighted sum of their rows
in one value table of N x v_dim shared by the heads, summed over heads.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from languini import model_parallel
from languini.memory_layers import check_value_grad, gate_layer, gated, query_norm_layer, sharded_bag
from languini.memory_stats import MemoryStats
from projects.pkm_gpt.ops.embedding_bag import embedding_bag
from languini.ops.product_keys import product_key_topk  # noqa: F401  (also this module's API)


@dataclass(frozen=True)
class PKMConfig:
    heads: int = 8
    k_dim: int = 64
    n_keys: int = 256  # number of values N = n_keys ** 2
    knn: int = 32
    v_dim: int | None = None  # None: the model width
    # "batch" (XLM's best for masked LM) lets later tokens of a training batch change earlier
    # outputs; "layer" normalises each token's query on its own and is causal.
    query_norm: str = "layer"
    value_grad: str = "atomic"  # Triton value-gradient reduction: atomic or segment
    sparse_values: bool = False  # value gradient as sparse rows read, for a lazy (SparseAdam) optimiser


# The LRAM paper's PKM (section 4.1): 8 heads, N = 2^16, value dimension = width, key dimension 64
# (it used batch norm for masked LM; this causal default uses layer norm).
LRAM_PAPER_PKM = PKMConfig(heads=8, k_dim=64, n_keys=256, knn=32)
# XLM's defaults: 4 heads, k_dim 256, knn 32, N = 512^2.
XLM_PKM = PKMConfig(heads=4, k_dim=256, n_keys=512, knn=32)
# Memory+'s (Berges et al. 2024; the defaults of Meta's memory layer code and its 373M config): 4 heads, k_dim 512,
# knn 32, N = 1024^2, no query normalisation.
MEMORY_PLUS_PKM = PKMConfig(heads=4, k_dim=512, n_keys=1024, knn=32, query_norm="none")
MEMORY_INITS = ("xlm", "meta")


class ProductKeyMemory(nn.Module):
    """[B, T, d_model] -> [B, T, v_dim] ([B, T, d_model] with a gate). The value table is `values` (see
    `value_parameters`).

    values: another memory's table to read instead of one of its own (one memory read by several layers, each with
    its own queries and sub-keys), of the same shape. gate: "silu" is Memory+ (Berges et al. 2024),
    out = W_o(read * silu(W_g x)) with W_g: d_model -> v_dim and W_o: v_dim -> d_model; "none" returns the read.
    shards: the model-parallel group the table's columns are split over (languini.model_parallel.shard_group),
    read by languini.memory_layers.sharded_bag.

    sparse_values: the gradient of `values` is a coalesced sparse COO tensor holding only the rows read
    (as nn.Embedding(sparse=True)), for a lazy optimiser such as torch.optim.SparseAdam; a graph break
    under torch.compile. On the Triton path it is the "segment" reduction, whatever value_grad says.

    query_norm and value_grad: see languini.memory_layers. While `stats` holds a MemoryStats, every forward
    records its reads (row indices and softmax weights) there.

    init: the memory's own initialisation (reset_memory_parameters), "xlm" (sub-keys uniform with bound
    1/sqrt(k_dim / 2), the half's width, as XLM; the maps keep what the model gives them) or "meta" (Meta's memory
    layer code for Memory+, Berges et al. 2024: sub-keys bound 1/sqrt(k_dim), the query map Xavier-uniform, W_g, W_o
    and the sigmoid gate N(0, 1/d_model)). sigmoid_gate: the output times sigmoid(w . x + b), one scalar per token
    (Meta's optional gated memory, off in its Memory+ configs).

    use_triton: the kernels (None: when on CUDA) for the bag and the product-key search; `triton_search`
    (default: as use_triton) picks the search's path alone, e.g. False for torch's top-k (the old baseline).
    """

    def __init__(self, d_model, heads=8, k_dim=64, n_keys=256, knn=32, v_dim=None, query_norm="layer",
                 value_grad="atomic", use_triton=None, sparse_values=False, values=None, gate="none",
                 shards=model_parallel.WHOLE, triton_search=None, init="xlm", sigmoid_gate=False):
        super().__init__()
        if k_dim % 2:
            raise ValueError(f"k_dim must be even (it is split into two halves), got {k_dim}")
        if not 1 <= knn <= n_keys:
            raise ValueError(f"knn must be in [1, n_keys={n_keys}], got {knn}")
        check_value_grad(value_grad)
        if init not in MEMORY_INITS:
            raise ValueError(f"init must be one of {MEMORY_INITS}, got {init!r}")
        self.init = init
        self.heads, self.k_dim, self.n_keys, self.knn = heads, k_dim, n_keys, knn
        self.v_dim = d_model if v_dim is None else v_dim
        self.num_values = n_keys ** 2
        self.value_grad, self.use_triton, self.sparse_values = value_grad, use_triton, sparse_values
        self.triton_search = use_triton if triton_search is None else triton_search

        self.query_proj = nn.Linear(d_model, heads * k_dim)
        # Layer norm over all heads * k_dim features: the per-token counterpart of XLM's batch norm.
        self.query_norm = query_norm_layer(query_norm, heads * k_dim)
        self.sub_keys = nn.Parameter(torch.empty(heads, 2, n_keys, k_dim // 2))
        if sparse_values and shards.size > 1:
            raise ValueError("sparse_values is single-process only; a value table split over processes "
                             "(--memory_shards) takes dense gradients")
        self.owns_values = values is None
        if values is None:
            self.values = model_parallel.parameter((self.num_values, self.v_dim), shards, dim=1,
                                                   what="the value width v_dim")
        else:
            s = model_parallel.sharding(values)
            if (s.full_shape if s else tuple(values.shape)) != (self.num_values, self.v_dim):
                raise ValueError(f"a shared value table must be [n_keys^2, v_dim] = {[self.num_values, self.v_dim]}")
            self.values = values
        self.gate = gate_layer(gate, d_model, self.v_dim)
        self.out = nn.Linear(self.v_dim, d_model) if self.gate is not None else None
        self.sigmoid_gate = nn.Linear(d_model, 1) if sigmoid_gate else None
        self.stats: MemoryStats | None = None  # set (evaluation) to record the reads of every forward
        self.reset_memory_parameters()

    @classmethod
    def from_config(cls, d_model, config: PKMConfig, use_triton=None, **options):
        """The layer of a PKMConfig; options: values, gate, shards (see the class)."""
        return cls(d_model, heads=config.heads, k_dim=config.k_dim, n_keys=config.n_keys, knn=config.knn,
                   v_dim=config.v_dim, query_norm=config.query_norm, value_grad=config.value_grad,
                   use_triton=use_triton, sparse_values=config.sparse_values, **options)

    def reset_memory_parameters(self):
        """Sub-keys and values (a table of its own), and with init "meta" the maps' weights; a model whose init loop
        rewrites all parameters should call this after it."""
        # Uniform sub-keys, normal values with std 1/sqrt(v_dim) (XLM and Meta alike), the same numbers however the
        # table is split (languini.model_parallel.init_).
        bound = 1 / math.sqrt(self.k_dim if self.init == "meta" else self.k_dim // 2)
        nn.init.uniform_(self.sub_keys, -bound, bound)
        if self.owns_values:
            model_parallel.init_(self.values, lambda t: nn.init.normal_(t, mean=0.0, std=self.v_dim ** -0.5))
        if self.init == "meta":
            nn.init.xavier_uniform_(self.query_proj.weight)
            d_model = self.query_proj.in_features  # Meta's std is output_dim^-0.5 for W_g and W_o, input_dim^-0.5
            for layer in (self.gate, self.out, self.sigmoid_gate):  # for the sigmoid gate: here both d_model
                if layer is not None:
                    nn.init.normal_(layer.weight, std=d_model ** -0.5)

    def value_parameters(self):
        """The value table, for its own optimiser group (the LRAM paper uses 10x the learning rate)."""
        return [self.values]

    def lookup(self, x):
        """x [B, T, d_model] -> indices [B*T, heads*knn] into `values` and softmax weights of the same shape."""
        queries = self.query_proj(x).flatten(0, -2)  # [B*T, heads*k_dim]
        queries = self.query_norm(queries).unflatten(-1, (self.heads, self.k_dim))
        scores, indices = product_key_topk(queries, self.sub_keys, self.knn, use_triton=self.triton_search)
        weights = torch.softmax(scores.float(), dim=-1)
        return indices.flatten(1), weights.flatten(1)

    def forward(self, x):
        indices, weights = self.lookup(x)
        if self.stats is not None:
            self.stats.update(indices.detach(), weights.detach())
        out = sharded_bag(indices, weights, self.values, self.bag).to(x.dtype).unflatten(0, x.shape[:-1])
        out = out if self.out is None else self.out(gated(out, self.gate, x))
        return out if self.sigmoid_gate is None else out * torch.sigmoid(self.sigmoid_gate(x))

    def bag(self, indices, weights, values):
        """The weighted embedding bag of ops/embedding_bag over `values` (the table, or this process's columns)."""
        return embedding_bag(values, indices, weights, use_triton=self.use_triton, value_grad=self.value_grad,
                             sparse_values=self.sparse_values)


def pkm_flops(tokens, d_model, heads=8, k_dim=64, n_keys=256, knn=32, v_dim=None):
    """Analytic forward FLOPs of the layer (a multiply-add counts 2), by part and in total.

    Not counted: biases, query normalisation, top-k comparisons and softmax (O(heads * knn) per token).
    """
    v_dim = d_model if v_dim is None else v_dim
    # per token: 2*d_model*heads*k_dim (query) + 2*heads*n_keys*k_dim (half scores) + heads*knn^2 (sums) + 2*heads*knn*v_dim (bag)
    parts = {
        "query": tokens * 2 * d_model * heads * k_dim,
        "key_scores": tokens * 2 * heads * n_keys * k_dim,
        "candidate_sums": tokens * heads * knn * knn,
        "embedding_bag": tokens * 2 * heads * knn * v_dim,
    }
    parts["total"] = sum(parts.values())
    return parts
