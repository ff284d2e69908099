"""Temporal links between memory words (thesis 3.5.1): the DNC's dense link matrix L (eq. 3.8-3.14) and the
Sparse DNC's two sparse matrices that stand for L and its transpose (eq. 3.15-3.20).

L(i, j) is the degree to which word i was written after word j. With the write weights w_t and the precedence
p_t (eq. 3.9: p_t = (1 - sum_i w_t(i)) p_{t-1} + w_t),

    L_t(i, j) = (1 - w_t(i) - w_t(j)) L_{t-1}(i, j) + w_t(i) p_{t-1}(j),   L_t(i, i) = 0          (3.11)

and a read head follows the links forwards, f = L a_{t-1} (3.13), or backwards, b = L^T a_{t-1} (3.14).

Sparse: `link` (N, for L) and `back` (P, for L^T) hold at most K_L (column, value) entries per row, p at most K_L
entries. Each step applies eq. 3.9 and 3.11 to them and keeps each changed row's K_L largest entries, so each of
N and P is exactly "eq. 3.11, then keep each row's K_L largest" (until K_L binds: exactly L and L^T;
tests/sam/test_links.py), at O(K_L^2) per written word whatever N. Eq. 3.17-3.18 print only the factor of L's row
(1 - w(i)); here the decay is 3.11's (1 - w(i) - w(j)), so that the links equal the DNC's while K_L does not bind.
The entries in a written word's row are changed directly. Those in its column, in rows not written, decay
lazily: column factors (1 - w_t(j)) multiply, so each word keeps the log of their product (`column_decay`), each
entry the value that log had when the entry was last set (its stamp), and an entry's value is
stored value * exp(column_decay[column] - stamp): finding a column's entries would need an index of columns.

A head follows the links through rows: forwards, f(i) = sum_j L(i, j) a(j), from P's rows j (the words read);
backwards, b(j) = sum_i L(i, j) a(i), from N's rows i: O(K K_L). Eq. 3.19-3.20 write f = N a and b = P a, which
need columns of N and P; once K_L binds, P's row j and N's column j keep different entries, so f = P^T a and
b = N^T a depart from them (the README gives the measured size). No gradient flows through the sparse links (the
thesis's choice); the read weights they carry keep theirs. The dense DNC keeps the whole L in autograd.

Layout: `link_cols`/`back_cols` (B, N + 1, K_L) int64 columns, `link_vals`/`back_vals` their stored values and
`link_stamps`/`back_stamps` their stamps (float64), `column_decay` (B, N + 1) float64; the column N means "no
entry" and row N is scratch (written to and cleared, never read as a word's row).
"""
import torch

# a word written with weight 1 zeroes its column: the log of this instead of log 0 = -inf, whose stamps would
# give -inf - -inf = NaN
_SMALLEST_FACTOR = torch.finfo(torch.float64).tiny


def empty_links(batch: int, words: int, k_links: int, device=None) -> dict:
    """Sparse links and precedence of memories that were never written."""
    cols = torch.full((batch, words + 1, k_links), words, dtype=torch.int64, device=device)
    vals = torch.zeros(batch, words + 1, k_links, device=device)
    stamps = torch.zeros(batch, words + 1, k_links, dtype=torch.float64, device=device)
    return {"link_cols": cols, "link_vals": vals, "link_stamps": stamps,
            "back_cols": cols.clone(), "back_vals": vals.clone(), "back_stamps": stamps.clone(),
            "column_decay": torch.zeros(batch, words + 1, dtype=torch.float64, device=device),
            "precedence_words": torch.full((batch, k_links), words, dtype=torch.int64, device=device),
            "precedence_weights": torch.zeros(batch, k_links, device=device)}


def _rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """table (B, N + 1, K_L) at rows (B, R) -> (B, R, K_L)."""
    return table.gather(1, rows[..., None].expand(-1, -1, table.shape[-1]))


def _set_rows(table: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    table.scatter_(1, rows[..., None].expand(-1, -1, table.shape[-1]), values)


def _column_decay(links: dict, cols: torch.Tensor) -> torch.Tensor:
    """column_decay at columns (B, R, K_L)."""
    return links["column_decay"].gather(1, cols.flatten(1)).view_as(cols)


def entries(links: dict, name: str, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of `name` ("link": N, "back": P) in rows (B, R): columns (B, R, K_L) and float64 values, each
    stored value decayed by its column's factors since it was set."""
    cols = _rows(links[f"{name}_cols"], rows)
    decay = _column_decay(links, cols) - _rows(links[f"{name}_stamps"], rows)
    return cols, _rows(links[f"{name}_vals"], rows).double() * decay.exp()


def _store(links: dict, name: str, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> None:
    """Set rows (B, R) of `name` to the entries (cols, values), stamped with their columns' decay now."""
    _set_rows(links[f"{name}_cols"], rows, cols)
    _set_rows(links[f"{name}_vals"], rows, values.to(links[f"{name}_vals"].dtype))
    _set_rows(links[f"{name}_stamps"], rows, _column_decay(links, cols))


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
    """One step of eq. 3.9 and 3.11 on the sparse links, then each changed row's K_L largest entries, in place:
    the write weights are `weights` (B, E) on the words `words` (B, E) (repeated words add up), zero elsewhere."""
    none = links["link_cols"].shape[1] - 1
    k_links = links["link_cols"].shape[-1]
    same = words[:, :, None] == words[:, None, :]
    earlier = torch.ones(words.shape[1], words.shape[1], dtype=torch.bool, device=words.device).tril(-1)
    first = ~(same & earlier).any(-1)
    written = torch.where(first, words, none)  # (B, E) distinct written words, `none` for repeats
    w = torch.where(first, (same.to(weights.dtype) * weights.detach()[:, None, :]).sum(-1), 0.0)

    def write_weight(x):  # (B, R, K_L) words -> their write weight (0 for words not written and `none`)
        match = (x[..., None] == written[:, None, None, :]) & (x[..., None] != none)
        return (match.to(w.dtype) * w[:, None, None, :]).sum(-1)

    # the written rows of both matrices: every entry decays by (1 - w(row) - w(column)), with the columns' decay
    # so far; then the written words' columns take their factor (1 - w) in every other row, through column_decay
    decayed = {}
    for name in ("link", "back"):
        cols, vals = entries(links, name, written)
        decayed[name] = cols, vals * (1 - w.double()[..., None] - write_weight(cols).double())
    links["column_decay"].scatter_add_(1, written, (1 - w.double()).clamp_min(_SMALLEST_FACTOR).log())
    # add w(i) p_{t-1}(j) to L(i, j) (N's written rows i) and to L^T(j, i) (P's rows j of the precedence), i != j
    p_words, p_weights = links["precedence_words"], links["precedence_weights"]
    pairs = (written[:, :, None] != p_words[:, None, :]) & (written[:, :, None] != none) & (p_words[:, None, :] != none)
    added = torch.where(pairs, w[:, :, None] * p_weights[:, None, :], 0.0).double()  # (B, E, K_L): (i, j)
    cols, vals = decayed["link"]
    _store(links, "link", written, *merge_entries(torch.cat([cols, p_words[:, None, :].expand_as(added)], -1),
                                                  torch.cat([vals, added], -1), k_links, none))
    _store(links, "back", written, *decayed["back"])  # the precedence's rows may be among them: set them first
    added_t = added.transpose(1, 2)  # (B, K_L, E): (j, i)
    cols, vals = entries(links, "back", p_words)
    _store(links, "back", p_words, *merge_entries(torch.cat([cols, written[:, None, :].expand_as(added_t)], -1),
                                                  torch.cat([vals, added_t], -1), k_links, none))
    # precedence (3.9)
    links["precedence_words"], links["precedence_weights"] = merge_entries(
        torch.cat([p_words, written], -1), torch.cat([(1 - w.sum(-1, keepdim=True)) * p_weights, w], -1), k_links, none)
    for name in ("link", "back"):  # the scratch row
        links[f"{name}_cols"][:, none] = none
        links[f"{name}_vals"][:, none] = 0.0
        links[f"{name}_stamps"][:, none] = 0.0


def follow(links: dict, direction: str, words: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The read weights one link away from read weights on `words` (B, H, K): "forward" f = L a (the words
    written after them, from P's rows), "backward" b = L^T a (from N's rows). Returns candidate (words, weights)
    of shape (B, H, K * K_L), repeated words not yet summed, word N (and weight 0) where there is no entry;
    differentiable in `weights`."""
    name = {"forward": "back", "backward": "link"}[direction]  # f(i) = sum_j P(j, i) a(j); b(j) = sum_i N(i, j) a(i)
    B, H, K = words.shape
    cols, vals = entries(links, name, words.reshape(B, H * K))  # (B, H*K, K_L)
    out = vals.to(weights.dtype).view(B, H, K, -1) * weights[..., None]
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
