"""The PEER layer (X. O. He 2024, "Mixture of A Million Experts", arXiv:2407.04153, section 2).

N = n_keys^2 experts, each a single hidden neuron: e_i(x) = gelu(u_i . x) v_i (eq. 6), u_i a row of `down` and
v_i a row of `up`, both of the model width. Each of `heads` query networks maps x to a query of k_dim; the query is
split in halves, each scored against n_keys sub-keys, and the knn best of the N product keys are found as in a
product-key memory (eqs. 4-5: the knn best of each half, then the knn best of their knn^2 sums). The heads share
the experts and the product keys (section 2, "Multi-Head Retrieval"). A head's router scores are the softmax of its
knn key scores (eq. 2 with s = softmax, as Algorithm 1), and the output is the sum over heads of the router-weighted
outputs of the chosen experts (eq. 7). No biases, as Algorithm 1.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from languini.memory_layers import query_norm_layer
from languini.memory_stats import MemoryStats
from languini.ops.peer_experts import peer_experts
from languini.ops.product_keys import product_key_topk


@dataclass(frozen=True)
class PEERConfig:
    heads: int = 8
    k_dim: int = 128
    n_keys: int = 1024  # N = n_keys ** 2 experts
    knn: int = 16


# Section 3.1's PEER in the isoFLOP study: 1024^2 experts, 8 heads, 16 experts per head. The paper does not give
# the query width; 128 is our choice.
PAPER_PEER = PEERConfig(heads=8, k_dim=128, n_keys=1024, knn=16)


class PEER(nn.Module):
    """[B, T, d_model] -> [B, T, d_model].

    query_norm: "layer" (each token's query on its own: causal), "batch" (the paper's query BatchNorm, section 3.1;
    its statistics over a causal batch let later tokens change earlier outputs during training) or "none".
    sparse_experts: the gradients of `down` and `up` are coalesced sparse COO tensors of the experts read, for a lazy
    optimiser (SparseAdam); a graph break under torch.compile.
    use_triton: the expert kernels (None: when on CUDA); `triton_search` (default: as use_triton) the search's.
    While `stats` holds a MemoryStats, every forward records the experts read and their router scores there.
    """

    def __init__(self, d_model, heads=8, k_dim=128, n_keys=1024, knn=16, query_norm="layer", use_triton=None,
                 sparse_experts=False, triton_search=None):
        super().__init__()
        if k_dim % 2:
            raise ValueError(f"k_dim must be even (it is split into two halves), got {k_dim}")
        if not 1 <= knn <= n_keys:
            raise ValueError(f"knn must be in [1, n_keys={n_keys}], got {knn}")
        self.d_model, self.heads, self.k_dim, self.n_keys, self.knn = d_model, heads, k_dim, n_keys, knn
        self.num_experts = n_keys ** 2
        self.use_triton, self.sparse_experts = use_triton, sparse_experts
        self.triton_search = use_triton if triton_search is None else triton_search
        self.query_proj = nn.Linear(d_model, heads * k_dim)
        self.query_norm = query_norm_layer(query_norm, heads * k_dim)
        self.sub_keys = nn.Parameter(torch.empty(2, n_keys, k_dim // 2))  # one set for all heads
        self.down = nn.Parameter(torch.empty(self.num_experts, d_model))  # u_i
        self.up = nn.Parameter(torch.empty(self.num_experts, d_model))  # v_i
        self.stats: MemoryStats | None = None
        self.reset_expert_parameters()

    def reset_expert_parameters(self, up_std=0.02):
        """Sub-keys as XLM's (uniform, bound 1/sqrt(k_dim / 2)); each expert as one hidden neuron of the GPT's MLP:
        u_i ~ N(0, 0.02) as a row of its first layer, v_i ~ N(0, up_std) as a column of its residual write. A model
        whose init loop rewrites all parameters should call this after it."""
        bound = 1 / math.sqrt(self.k_dim // 2)
        nn.init.uniform_(self.sub_keys, -bound, bound)
        nn.init.normal_(self.down, std=0.02)
        nn.init.normal_(self.up, std=up_std)

    def expert_parameters(self):
        """The expert tables, for their own optimiser group."""
        return [self.down, self.up]

    def lookup(self, x):
        """x [B, T, d_model] -> indices [B*T, heads*knn] of the experts and their router scores (each head's softmax
        over its knn key scores), of the same shape."""
        queries = self.query_norm(self.query_proj(x).flatten(0, -2)).unflatten(-1, (self.heads, self.k_dim))
        sub_keys = self.sub_keys.expand(self.heads, *self.sub_keys.shape)  # the heads share the product keys
        scores, indices = product_key_topk(queries, sub_keys, self.knn, use_triton=self.triton_search)
        return indices.flatten(1), torch.softmax(scores, dim=-1).flatten(1)  # scores: fp32 or wider

    def forward(self, x):
        indices, weights = self.lookup(x)
        if self.stats is not None:
            self.stats.update(indices.detach(), weights.detach())
        out = peer_experts(x.flatten(0, -2), self.down, self.up, indices, weights, use_triton=self.use_triton,
                           sparse_experts=self.sparse_experts)
        return out.to(x.dtype).unflatten(0, x.shape[:-1])


def peer_flops(tokens, d_model, heads=8, k_dim=128, n_keys=1024, knn=16):
    """Analytic forward FLOPs of the layer (a multiply-add counts 2), by part and in total.

    Not counted: query normalisation, top-k comparisons, the softmax and the activation (O(heads * knn) per token).
    """
    parts = {
        "query": tokens * (2 * d_model * heads * k_dim + heads * k_dim),  # with the bias
        "key_scores": tokens * 2 * heads * n_keys * k_dim,  # both halves: 2 * n_keys * (k_dim / 2) multiply-adds
        "candidate_sums": tokens * heads * knn * knn,
        "experts": tokens * 4 * heads * knn * d_model,  # u_i . x and the weighted sum of the v_i
    }
    parts["total"] = sum(parts.values())
    return parts
