"""Temporal links between memory words (thesis 3.5.1): the DNC's dense link matrix L (eq. 3.8-3.14) and the
Sparse DNC's two sparse matrices that stand for L and its transpose (eq. 3.15-3.20).

L(i, j) is the degree to which word i was written after word j. With the write weights w_t and the precedence
p_t (eq. 3.9: p_t = (1 - sum_i w_t(i)) p_{t-1} + w_t),

    L_t(i, j) = (1 - w_t(i) - w_t(j)) L_{t-1}(i, j) + w_t(i) p_{t-1}(j),   L_t(i, i) = 0          (3.11)

and a read head follows the links forwards, f = L a_{t-1} (3.13), or backwards, b = L^T a_{t-1} (3.14).

Sparse: every row of `link` (L) and of `back` (L^T) holds at most K_L (column, value) entries, p at most K_L
entries, each kept as the K_L largest after an update, so one step costs O(K_L^2) per written word whatever N.
The rows of both are updated as eq. 3.11 says, the decay by (1 - w(i) - w(j)) included (eq. 3.17-3.18 print
only the row's factor): the entries of a written column are found through the other matrix. Until the K_L limit
binds the two are exactly L and L^T (tests/sam/test_links.py). No gradient flows through the sparse links (the
thesis's choice); the read weights they carry keep theirs. The dense DNC keeps the whole L in autograd.

Layout: `link_cols`/`back_cols` (B, N + 1, K_L) int64 columns and `link_vals`/`back_vals` their values; the
column N means "no entry" and row N is scratch (written to and cleared, never read as a word's row).
"""
import torch


def empty_links(batch: int, words: int, k_links: int, device=None) -> dict:
    """Sparse links and precedence of memories that were never written."""
    cols = torch.full((batch, words + 1, k_links), words, dtype=torch.int64, device=device)
    vals = torch.zeros(batch, words + 1, k_links, device=device)
    return {"link_cols": cols, "link_vals": vals, "back_cols": cols.clone(), "back_vals": vals.clone(),
            "precedence_words": torch.full((batch, k_links), words, dtype=torch.int64, device=device),
            "precedence_weights": torch.zeros(batch, k_links, device=device)}


def _rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """table (B, N + 1, K_L) at rows (B, R) -> (B, R, K_L)."""
    return table.gather(1, rows[..., None].expand(-1, -1, table.shape[-1]))


def _set_rows(table: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    table.scatter_(1, rows[..., None].expand(-1, -1, table.shape[-1]), values)


def merge_entries(cols: torch.Tensor, vals: torch.Tensor, keep: int, none: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the values of equal columns among candidates (..., C) and keep the `keep` largest; columns `none` are
    no entries. Returns (cols, vals) of shape (..., keep), padded with `none` and 0."""
    present = cols != none
    same = (cols[..., :, None] == cols[..., None, :]) & present[..., None]
    totals = (same.to(vals.dtype) * vals[..., None, :]).sum(-1)
    earlier = torch.ones(cols.shape[-1], cols.shape[-1], dtype=torch.bool, device=cols.device).tril(-1)
    first = present & ~(same & earlier).any(-1)
    key = torch.where(first, totals, torch.full_like(totals, float("-inf")))
    best, positions = key.topk(min(keep, cols.shape[-1]), dim=-1)
    kept = best > float("-inf")
    out_cols = torch.where(kept, cols.gather(-1, positions), none)
    out_vals = torch.where(kept, totals.gather(-1, positions), 0.0)
    if out_cols.shape[-1] < keep:  # fewer candidates than slots
        pad = keep - out_cols.shape[-1]
        out_cols = torch.cat([out_cols, out_cols.new_full((*out_cols.shape[:-1], pad), none)], -1)
        out_vals = torch.cat([out_vals, out_vals.new_zeros((*out_vals.shape[:-1], pad))], -1)
    return out_cols, out_vals


@torch.no_grad()
def update_links(links: dict, words: torch.Tensor, weights: torch.Tensor) -> None:
    """One step of eq. 3.9 and 3.11 on the sparse links, in place: the write weights are `weights` (B, E) on the
    words `words` (B, E) (repeated words add up), zero elsewhere."""
    none = links["link_cols"].shape[1] - 1
    k_links = links["link_cols"].shape[-1]
    same = words[:, :, None] == words[:, None, :]
    earlier = torch.ones(words.shape[1], words.shape[1], dtype=torch.bool, device=words.device).tril(-1)
    first = ~(same & earlier).any(-1)
    written = torch.where(first, words, none)  # (B, E) distinct written words, `none` for repeats
    w = torch.where(first, (same.to(weights.dtype) * weights.detach()[:, None, :]).sum(-1), 0.0)

    def member(x):  # (B, ...) -> whether x is a written word, and its write weight
        match = (x[..., None] == written.view(written.shape[0], *([1] * (x.dim() - 1)), -1)) & (x[..., None] != none)
        return match.any(-1), (match.to(w.dtype) * w.view(w.shape[0], *([1] * (x.dim() - 1)), -1)).sum(-1)

    _, w_written = member(written)
    # decay every entry (i, j) of L with i or j written by (1 - w(i) - w(j)), in both matrices
    for name, other in (("link", "back"), ("back", "link")):
        cols, vals = links[f"{name}_cols"], links[f"{name}_vals"]
        # entries (r, c) with c written and r not: the rows r are the other matrix's row c
        rows = _rows(links[f"{other}_cols"], written).flatten(1)  # (B, E * K_L)
        row_written, _ = member(rows)
        targets = _rows(cols, rows) == written.repeat_interleave(k_links, 1)[..., None]  # (B, E*K_L, K_L)
        found = targets.any(-1) & (rows != none) & ~row_written
        slots = torch.where(found, rows * k_links + targets.to(torch.int64).argmax(-1), none * k_links)
        flat_vals = vals.view(vals.shape[0], -1)
        factor = 1 - w_written.repeat_interleave(k_links, 1)
        flat_vals.scatter_(1, slots, flat_vals.gather(1, slots) * factor)
        # the written rows: every entry
        row_cols, row_vals = _rows(cols, written), _rows(vals, written)
        _set_rows(vals, written, row_vals * (1 - w_written[..., None] - member(row_cols)[1]))
    # add w(i) p_{t-1}(j) to L(i, j) and L^T(j, i), i != j
    p_words, p_weights = links["precedence_words"], links["precedence_weights"]
    pairs = (written[:, :, None] != p_words[:, None, :]) & (written[:, :, None] != none) & (p_words[:, None, :] != none)
    added = torch.where(pairs, w[:, :, None] * p_weights[:, None, :], 0.0)  # (B, E, K_L): (i, j)
    cols, vals = merge_entries(torch.cat([_rows(links["link_cols"], written), p_words[:, None, :].expand_as(added)], -1),
                               torch.cat([_rows(links["link_vals"], written), added], -1), k_links, none)
    _set_rows(links["link_cols"], written, cols)
    _set_rows(links["link_vals"], written, vals)
    added_t = added.transpose(1, 2)  # (B, K_L, E): (j, i)
    cols, vals = merge_entries(torch.cat([_rows(links["back_cols"], p_words), written[:, None, :].expand_as(added_t)], -1),
                               torch.cat([_rows(links["back_vals"], p_words), added_t], -1), k_links, none)
    _set_rows(links["back_cols"], p_words, cols)
    _set_rows(links["back_vals"], p_words, vals)
    # precedence (3.9)
    links["precedence_words"], links["precedence_weights"] = merge_entries(
        torch.cat([p_words, written], -1), torch.cat([(1 - w.sum(-1, keepdim=True)) * p_weights, w], -1), k_links, none)
    for name in ("link", "back"):  # the scratch row
        links[f"{name}_cols"][:, none] = none
        links[f"{name}_vals"][:, none] = 0.0


def follow(links: dict, direction: str, words: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The read weights one link away from read weights on `words` (B, H, K): "forward" f = L a (3.19: the words
    written after them), "backward" b = L^T a (3.20). Returns candidate (words, weights) of shape (B, H, K * K_L),
    repeated words not yet summed, word N (and weight 0) where there is no entry; differentiable in `weights`."""
    name = {"forward": "back", "backward": "link"}[direction]  # f(i) = sum_j L^T(j, i) a(j); b(j) = sum_i L(i, j) a(i)
    B, H, K = words.shape
    flat = words.reshape(B, H * K)
    cols, vals = _rows(links[f"{name}_cols"], flat), _rows(links[f"{name}_vals"], flat)  # (B, H*K, K_L)
    out = vals.view(B, H, K, -1) * weights[..., None]
    return cols.view(B, H, -1), out.reshape(B, H, -1)


def dense_link_update(link: torch.Tensor, precedence: torch.Tensor, w: torch.Tensor):
    """Eq. 3.9 and 3.11 on the dense (B, N, N) link matrix and (B, N) precedence with write weights w (B, N)."""
    decay = 1 - w[:, :, None] - w[:, None, :]
    link = decay * link + w[:, :, None] * precedence[:, None, :]
    link = link * (1 - torch.eye(link.shape[-1], device=link.device, dtype=link.dtype))
    return link, (1 - w.sum(-1, keepdim=True)) * precedence + w


def dense_follow(link: torch.Tensor, direction: str, weights: torch.Tensor) -> torch.Tensor:
    """f = L a (forward) or b = L^T a (backward) for dense read weights (B, H, N)."""
    if direction == "forward":
        return torch.einsum("bij,bhj->bhi", link, weights)
    return torch.einsum("bij,bhi->bhj", link, weights)
