"""Transformer-XL relative attention over [prefix; segment] in plain PyTorch (Dai et al. 2019, section 3.3): the
reference for the Triton kernel (triton.py) and the CPU path of the model.

Query i of the segment sits at key position P + i (P keys before the segment: compressed memory and memory), so key
j is at distance P + i - j. With r the position embeddings projected per head (row delta = W_{k,R} R_delta):
    score(i, j) = q_i.k_j (A) + q_i.r_{P+i-j} (B) + u.k_j (C) + w.r_{P+i-j} (D),
scaled, over the keys j <= P + i, softmax, weighted values.
"""
import torch
import torch.nn.functional as F


def relative_shift(by_distance: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's relative shift: from scores indexed by (query i, distance column k), where column k holds
    distance S-1-k, to scores indexed by (query i, key j), i.e. out[..., i, j] = by_distance[..., i, j + T-1-i].

    With P = S - T keys before the segment, query i sits at key position P + i, so key j is at distance P + i - j:
    column S-1-(P+i-j) = j + T-1-i. Padding a zero column on the left and reading the (T, S+1) block as (S+1, T)
    shifts row i left by T-1-i once the first T entries are dropped. Entries with j > P + i (future keys, masked
    by the caller) receive other rows' numbers.
    """
    *batch, T, S = by_distance.shape
    padded = F.pad(by_distance, (1, 0))  # (..., T, S + 1)
    return padded.view(*batch, S + 1, T)[..., 1:, :].reshape(*batch, T, S)


def memory_mask(T: int, P: int, device) -> torch.Tensor:
    """(T, P + T) booleans, True where query i may read key j: all P memories, and the segment causally."""
    return torch.ones(T, P + T, dtype=torch.bool, device=device).tril(P)


def relative_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, u: torch.Tensor,
                             w: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The four terms formed one by one, each a (B, H, T, S) tensor; B and D moved to their keys by the shift.

    Args:
        q: (B, H, T, D) queries of the segment.
        k, v: (B, H, S, D) keys and values of [prefix; segment], S = P + T >= T.
        r: (H, S, D) projected position embeddings by distance: row delta for distance delta = 0 .. S-1.
        u, w: (H, D) the content and position biases.
        scale: multiplies the scores (1/sqrt(D)).
        mask: (T, S) booleans, True where query i reads key j; default memory_mask(T, P).
    Returns:
        (B, H, T, D) in the dtype of the einsums (q's, or autocast's).
    """
    T, S = q.shape[2], k.shape[2]
    by_column = r.flip(1)  # column c holds distance S-1-c, as relative_shift reads it
    a = torch.einsum("bhid,bhjd->bhij", q, k)
    b = relative_shift(torch.einsum("bhid,hcd->bhic", q, by_column))
    c = torch.einsum("hd,bhjd->bhj", u.to(k.dtype), k)[:, :, None, :]
    d = relative_shift(torch.einsum("hd,hcd->hc", w.to(r.dtype), by_column)[None, :, None, :].expand(1, -1, T, -1))
    scores = (a + b + c + d) * scale
    mask = memory_mask(T, S - T, q.device) if mask is None else mask
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhij,bhjd->bhid", F.softmax(scores, dim=-1).to(v.dtype), v)
