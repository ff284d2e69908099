"""The UltraMemV2 memory layer (Huang et al. 2025, "UltraMemV2: Memory Networks Scaling to 120B Parameters with
Superior Long-Context Learning", arXiv:2508.18756), on the retrieval of UltraMem (Huang et al. 2024, "Ultra-Sparse
Memory Network", ICLR 2025, arXiv:2411.12364). What is followed and what departs: README.md.

Per token x (the block's normalised input, width d_model), with N = n_keys^2 values:
1. TDQKR (v1, "Tucker Decomposed Query-Key Retrieval"): a row query and a column query of width k_dim (one linear
   map, each half layer-normed) are scored against n_keys row keys and n_keys column keys of rank r (layer-normed): S_row, S_col [n_keys, r];
   the score of value (i, j) is S_row[i]^T C S_col[j] with a learned r x r core C.
2. The top-k over the n_keys^2 grid as v1 finds it: C's first singular vectors u, v (C ~ sigma u v^T) rank the rows
   by S_row u and the columns by S_col v; the knn best of each give knn^2 candidate cells, scored exactly with C,
   and their knn best are read (ops/tucker_topk). Exact when C has rank 1 and the projected scores are
   non-negative; otherwise the approximation the paper makes.
3. The values, PEER-style (v2): out = W_out sum_j s_j gelu(p_i . W_pre x) v_i over the chosen values i, with s_j
   the raw grid scores (no softmax, v1), p_i (`pre_values`) and v_i (`values`) of width value_dim, one output
   projection W_out (v2's single linear projection in place of v1's implicit value expansion).
"""
import math

import torch
from torch import nn

from languini.memory_stats import MemoryStats
from languini.ops.peer_experts import peer_experts
from projects.ultramem_gpt.ops.tucker_topk import tucker_topk


def core_directions(core):
    """C's first left and right singular vectors (u, v), detached, fp32 or wider; the sign makes u's entry of largest
    magnitude positive (sigma u v^T is unchanged), so that a retrieval ranks by the same direction from step to
    step."""
    acc = torch.promote_types(core.dtype, torch.float32)
    left, _, right_t = torch.linalg.svd(core.detach().to(acc))
    u, v = left[:, 0], right_t[0]
    largest = u.gather(0, u.abs().argmax().unsqueeze(0))  # a tensor, no .item(): meta models and graphs need none
    sign = torch.where(largest >= 0, 1.0, -1.0).to(u.dtype)
    return u * sign, v * sign


def tdqkr_search(row_scores, col_scores, core, knn, triton=None):
    """TDQKR's top-k (v1): the knn values a token reads and their scores.

    Args:
        row_scores, col_scores: [R, n_keys, r] the rank-r scores of each row and column key; core: [r, r].
        knn: values read per token (also the row and column candidates kept before the exact rescoring).
        triton: the candidate top-k by the kernel (None: on CUDA).
    Returns:
        (indices int64 [R, knn] of the values i * n_keys + j, best first; scores [R, knn], S_row[i]^T C S_col[j],
        differentiable in row_scores, col_scores and core).
    """
    n_keys, rank = row_scores.shape[1], row_scores.shape[2]
    u, v = core_directions(core)
    with torch.no_grad():  # the candidates: a choice, no gradient
        row_best = torch.matmul(row_scores.detach().to(u.dtype), u).topk(knn, dim=1).indices  # [R, knn]
        col_best = torch.matmul(col_scores.detach().to(v.dtype), v).topk(knn, dim=1).indices
    rows = row_scores.gather(1, row_best.unsqueeze(-1).expand(-1, -1, rank))  # [R, knn, r]
    cols = col_scores.gather(1, col_best.unsqueeze(-1).expand(-1, -1, rank))
    impl = None if triton is None else ("triton" if triton else "naive")
    row_pos, col_pos = tucker_topk(rows, cols, core, knn, impl=impl)
    chosen_rows = rows.gather(1, row_pos.unsqueeze(-1).expand(-1, -1, rank))
    chosen_cols = cols.gather(1, col_pos.unsqueeze(-1).expand(-1, -1, rank))
    # torch.linalg.matmul and the sum: DeepSpeed's profiler counts neither (the model's extra_flops does)
    scores = (torch.linalg.matmul(chosen_rows, core.to(chosen_rows.dtype)) * chosen_cols).sum(-1)
    return row_best.gather(1, row_pos) * n_keys + col_best.gather(1, col_pos), scores


class UltraMemV2(nn.Module):
    """[..., d_model] -> [..., d_model].

    use_triton: the kernels (value read and candidate top-k; None: when on CUDA). sparse_values: the value tables'
    gradients as coalesced sparse rows of the values read (for a lazy SparseAdam). While `stats` holds a
    MemoryStats, every forward records the values read and the magnitudes of their scores there.
    """

    def __init__(self, d_model, n_keys, knn=32, k_dim=None, value_dim=None, rank=2, use_triton=None,
                 sparse_values=False):
        super().__init__()
        k_dim = k_dim or max(d_model // 4, 1)
        value_dim = value_dim or max(d_model // 4, 1)
        if not 1 <= knn <= n_keys:
            raise ValueError(f"knn must be in [1, n_keys={n_keys}], got {knn}")
        if rank < 1:
            raise ValueError(f"the Tucker rank must be at least 1, got {rank}")
        self.d_model, self.n_keys, self.knn, self.k_dim, self.value_dim, self.rank = (
            d_model, n_keys, knn, k_dim, value_dim, rank)
        self.num_values = n_keys ** 2
        self.use_triton, self.sparse_values = use_triton, sparse_values
        self.query_proj = nn.Linear(d_model, 2 * k_dim, bias=False)  # the row query and the column query
        self.query_norm = nn.LayerNorm(k_dim)
        self.keys = nn.Parameter(torch.empty(2, rank, n_keys, k_dim))  # row keys, column keys; r each
        self.key_norm = nn.LayerNorm(k_dim)
        self.core = nn.Parameter(torch.empty(rank, rank))
        self.pre_proj = nn.Linear(d_model, value_dim, bias=False)
        self.pre_values = nn.Parameter(torch.empty(self.num_values, value_dim))
        self.values = nn.Parameter(torch.empty(self.num_values, value_dim))
        self.out_proj = nn.Linear(value_dim, d_model, bias=False)
        self.stats: MemoryStats | None = None
        self.reset_memory_parameters()

    def reset_memory_parameters(self, std=0.02):
        """As the authors' public UltraMemV2 layer (README.md): keys N(0, 1/sqrt(k_dim)), the query and key norms'
        gains 1/k_dim^0.4 (a row score of about k_dim^0.2 at init), the core uniform in [0, 1); projections and
        both value tables N(0, std). The output projection's scale is set by the model (match_output_std)."""
        nn.init.normal_(self.keys, std=1 / math.sqrt(self.k_dim))
        for norm in (self.query_norm, self.key_norm):
            nn.init.constant_(norm.weight, self.k_dim ** -0.4)
            nn.init.zeros_(norm.bias)
        nn.init.uniform_(self.core, 0.0, 1.0)
        for p in (self.query_proj.weight, self.pre_proj.weight, self.out_proj.weight, self.pre_values, self.values):
            nn.init.normal_(p, std=std)

    def value_parameters(self):
        """The value tables (pre-values and values), for their own optimiser group."""
        return [self.pre_values, self.values]

    def key_scores(self, tokens):
        """(S_row, S_col), each [R, n_keys, r], for tokens [R, d_model]."""
        queries = self.query_norm(self.query_proj(tokens).unflatten(-1, (2, self.k_dim)))  # [R, 2, k_dim]
        keys = self.key_norm(self.keys).flatten(1, 2)  # [2, r * n_keys, k_dim]
        scores = torch.matmul(queries.transpose(0, 1), keys.transpose(1, 2))  # [2, R, r * n_keys]
        scores = scores.unflatten(-1, (self.rank, self.n_keys)).transpose(2, 3)  # [2, R, n_keys, r]
        return scores[0], scores[1]

    def lookup(self, tokens):
        """(indices int64 [R, knn], scores [R, knn]) of the values each token [R, d_model] reads."""
        row_scores, col_scores = self.key_scores(tokens)
        return tdqkr_search(row_scores, col_scores, self.core, self.knn, triton=self.use_triton)

    def forward(self, x):
        tokens = x.flatten(0, -2)
        indices, scores = self.lookup(tokens)
        if self.stats is not None:
            self.stats.update(indices.detach(), scores.detach().abs())
        read = peer_experts(self.pre_proj(tokens), self.pre_values, self.values, indices, scores,
                            use_triton=self.use_triton, sparse_experts=self.sparse_values)
        return self.out_proj(read.to(x.dtype)).unflatten(0, x.shape[:-1])

    @torch.no_grad()
    def match_output_std(self, target_std, tokens):
        """Scale the output projection so that the layer's output on `tokens` [R, d_model] has std target_std (the
        FFN's beside it: the v2 paper's initialisation matched to the FFN, as README.md reads it)."""
        self.out_proj.weight.mul_(target_std / self(tokens).std())


def ultramem_flops(d_model, n_keys, knn=32, k_dim=None, value_dim=None, rank=2):
    """Analytic forward FLOPs per token of the layer (a multiply-add counts 2), by part and in total.

    Not counted: the norms, the top-k comparisons, the SVD of the r x r core, the activation.
    """
    k_dim = k_dim or max(d_model // 4, 1)
    value_dim = value_dim or max(d_model // 4, 1)
    parts = {
        "query": 2 * d_model * 2 * k_dim,
        "key_scores": 2 * 2 * n_keys * rank * k_dim,  # row and column keys, r scores each
        "rank_one_ranking": 2 * 2 * n_keys * rank,  # S_row u and S_col v
        "candidate_grid": 2 * knn * rank * rank + 2 * knn * knn * rank,  # (rows @ C), then with cols
        "chosen_scores": knn * (2 * rank * rank + 2 * rank),
        "values": 4 * knn * value_dim,  # p_i . (W_pre x) and the weighted sum of the v_i
        "projections": 2 * 2 * d_model * value_dim,  # W_pre and W_out
    }
    parts["total"] = sum(parts.values())
    return parts


def ultramem_layer(width: int, n_values: int, **options) -> UltraMemV2:
    """An UltraMemV2 layer of the model width holding about n_values values (n_keys = round(sqrt(n_values))), the
    defaults of this project otherwise (knn 32, k_dim = value_dim = width / 4, rank 2): for benchmarks that build
    memory layers by (width, size). Its output projection keeps its N(0, 0.02) init (no FFN to match here)."""
    return UltraMemV2(width, n_keys=max(round(math.sqrt(n_values)), options.get("knn", 32)), **options)
