"""The Sparse DNC's links (links.py) against eq. 3.9 and 3.11 computed entry by entry in float64: the DNC's dense
link matrix on memories small enough that the K_L limit never binds (rows of N - 1 <= K_L entries), and, where it
binds, two dense matrices for N and P that keep each row's K_L largest entries after every step."""
import torch

from projects.sam import links


def dense_reference(steps, words):
    """L and p after the writes, from eq. 3.9 and 3.11 one entry at a time (float64 Python numbers)."""
    L = [[0.0] * words for _ in range(words)]
    p = [0.0] * words
    for indices, weights in steps:
        w = [0.0] * words
        for i, x in zip(indices, weights):
            w[i] += x
        L = [[0.0 if i == j else (1 - w[i] - w[j]) * L[i][j] + w[i] * p[j] for j in range(words)]
             for i in range(words)]
        total = sum(w)
        p = [(1 - total) * p[j] + w[j] for j in range(words)]
    return torch.tensor(L, dtype=torch.float64), torch.tensor(p, dtype=torch.float64)


def densify(state, name, b):
    """Stream b's sparse rows of `name` ("link": N, "back": P) -> (N, N) dense."""
    words = state["link_cols"].shape[1] - 1
    cols, vals = links.entries({k: v[b:b + 1] for k, v in state.items()}, name, torch.arange(words + 1)[None])
    out = torch.zeros(words, words, dtype=torch.float64)
    for i in range(words):
        for c, v in zip(cols[0, i].tolist(), vals[0, i].tolist()):
            if c != words:
                out[i, c] += v
    return out


def densify_precedence(state, b):
    words = state["link_cols"].shape[1] - 1
    out = torch.zeros(words + 1, dtype=torch.float64)
    out.index_add_(0, state["precedence_words"][b], state["precedence_weights"][b].double())
    return out[:words]


def random_steps(words, entries, steps, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        indices = torch.randint(words, (entries,), generator=g)  # repeats happen: they add up
        weights = torch.rand(entries, generator=g)
        weights = weights / weights.sum() * torch.rand((), generator=g)  # sum <= 1, as the mean over heads
        out.append((indices.tolist(), weights.tolist()))
    return out


def test_sparse_links_equal_the_dense_matrix_while_the_limit_does_not_bind():
    words, k_links, batch = 6, 8, 2
    runs = [random_steps(words, 3, 12, seed) for seed in range(batch)]
    state = links.empty_links(batch, words, k_links)
    for t in range(12):
        idx = torch.tensor([run[t][0] for run in runs])
        w = torch.tensor([run[t][1] for run in runs])
        links.update_links(state, idx, w)
    for b, run in enumerate(runs):
        L, p = dense_reference(run, words)
        assert L.abs().sum() > 0.5  # the comparison is not between zeros
        # float32 values after 12 steps of products and sums of numbers in [0, 1]
        torch.testing.assert_close(densify(state, "link", b), L, atol=1e-6, rtol=0)
        torch.testing.assert_close(densify(state, "back", b), L.T, atol=1e-6, rtol=0)
        torch.testing.assert_close(densify_precedence(state, b), p, atol=1e-6, rtol=0)
        # following the links: f = L a and b = L^T a for read weights on three words (eq. 3.19, 3.20)
        read = torch.tensor([[[1, 4, 2]]])
        a = torch.tensor([[[0.5, 0.3, 0.2]]])
        dense_a = torch.zeros(words, dtype=torch.float64).index_add_(0, read[0, 0], a[0, 0].double())
        for direction, want in (("forward", L @ dense_a), ("backward", L.T @ dense_a)):
            sub = {k: v[b:b + 1] for k, v in state.items()}
            cand, vals = links.follow(sub, direction, read, a)
            got = torch.zeros(words + 1, dtype=torch.float64).index_add_(0, cand[0, 0], vals[0, 0].double())
            torch.testing.assert_close(got[:words], want, atol=1e-6, rtol=0)
        # the dense implementation the DNC baseline uses gives the same matrix
        dL, dp = torch.zeros(1, words, words, dtype=torch.float64), torch.zeros(1, words, dtype=torch.float64)
        for indices, weights in run:
            w = torch.zeros(1, words, dtype=torch.float64).index_add_(1, torch.tensor(indices),
                                                                        torch.tensor([weights], dtype=torch.float64))
            dL, dp = links.dense_link_update(dL, dp, w)
        torch.testing.assert_close(dL[0], L, atol=1e-12, rtol=0)
        torch.testing.assert_close(links.dense_follow(dL, "forward", dense_a[None, None])[0, 0], L @ dense_a)


def test_rows_keep_the_largest_k_links_entries():
    """With K_L = 2 every row keeps at most two entries, the largest: a hand-worked step. Words 0, 1, 2 written
    one after the other with weight 1 make p = e_2 and L(1, 0) = L(2, 1) = 1; then writing word 3 with weight 0.5
    and word 4 with weight 0.5 links both to word 2 (0.5 each), and p keeps its two largest of {2: 0, 3: .5, 4: .5}."""
    state = links.empty_links(1, 6, 2)
    for word in range(3):
        links.update_links(state, torch.tensor([[word]]), torch.tensor([[1.0]]))
    links.update_links(state, torch.tensor([[3, 4]]), torch.tensor([[0.5, 0.5]]))
    want = torch.zeros(6, 6, dtype=torch.float64)
    want[1, 0], want[2, 1], want[3, 2], want[4, 2] = 1.0, 1.0, 0.5, 0.5
    torch.testing.assert_close(densify(state, "link", 0), want)
    assert sorted(state["precedence_words"][0].tolist()) == [3, 4]
    assert (state["link_cols"][0] != 6).sum(-1).max() <= 2


def truncated_reference(steps, words, k_links):
    """Eq. 3.9 and 3.11 applied to two dense float64 matrices, N (for L) and P (for L^T), and p, each keeping
    its rows' (p: its) K_L largest entries after every step: what the sparse links stand for once K_L binds."""
    def keep_largest(rows):
        values, columns = rows.topk(k_links, dim=-1)
        return torch.zeros_like(rows).scatter(-1, columns, values)

    off_diagonal = 1 - torch.eye(words, dtype=torch.float64)
    N, P, p = torch.zeros(words, words, dtype=torch.float64), torch.zeros(words, words, dtype=torch.float64), \
        torch.zeros(words, dtype=torch.float64)
    binds = False  # whether a row ever had more than K_L entries before it was cut
    for indices, weights in steps:
        w = torch.zeros(words, dtype=torch.float64).index_add_(0, torch.tensor(indices),
                                                               torch.tensor(weights, dtype=torch.float64))
        decay = 1 - w[:, None] - w[None, :]
        new_N = (decay * N + w[:, None] * p[None, :]) * off_diagonal
        new_P = (decay * P + p[:, None] * w[None, :]) * off_diagonal
        binds |= bool(((new_N > 0).sum(-1) > k_links).any() or ((new_P > 0).sum(-1) > k_links).any())
        N, P = keep_largest(new_N), keep_largest(new_P)
        p = keep_largest(((1 - w.sum()) * p + w)[None])[0]
    return N, P, p, binds


def test_links_once_k_links_binds_are_eq_3_11_then_each_rows_k_links_largest():
    """K_L = 3 on 10 words with 4 writes a step: rows fill past K_L and are cut. Every entry of a written word's
    column decays, also where the other matrix no longer holds its mirror (P's row j cut the entry N(i, j) keeps)."""
    words, k_links, batch, steps = 10, 3, 3, 30
    runs = [random_steps(words, 4, steps, seed) for seed in range(10, 10 + batch)]
    state = links.empty_links(batch, words, k_links)
    for t in range(steps):
        links.update_links(state, torch.tensor([run[t][0] for run in runs]), torch.tensor([run[t][1] for run in runs]))
    for b, run in enumerate(runs):
        N, P, p, binds = truncated_reference(run, words, k_links)
        assert binds and N.abs().sum() > 0.5
        torch.testing.assert_close(densify(state, "link", b), N, atol=1e-6, rtol=0)  # float32 values, 30 steps
        torch.testing.assert_close(densify(state, "back", b), P, atol=1e-6, rtol=0)
        torch.testing.assert_close(densify_precedence(state, b), p, atol=1e-6, rtol=0)


def test_a_column_decays_without_its_mirror_and_the_links_are_followed_through_rows():
    """Hand-worked, K_L = 1. Words 0 then 1 written with weight 1: L(1, 0) = 1, p = e_1. Words 2 (0.6) and
    3 (0.4): N(2, 1) = 0.6, N(3, 1) = 0.4, but P's row 1 keeps only its largest, P(1, 2) = 0.6; p keeps {2: 0.6}.
    Word 1 written with 0.5: column 1 decays by 1 - 0.5 in every row, N(2, 1) = 0.3 and N(3, 1) = 0.2 (whose
    mirror P(1, 3) was cut), P(0, 1) = 0.5; row 1 of N: 0.5 L(1, 0) = 0.5 against the added 0.5 * 0.6 = 0.3 at
    (1, 2), keeps 0.5; P's row 1: 0.5 * 0.6 = 0.3; P(2, 1) = 0.3 added; p = {1: 0.5} (against 0.5 * 0.6 at 2).
    Following the links from word 1: forwards through P's row 1 (f = P^T a: word 2, 0.3), not N's column 1 (N a
    would also give word 3, 0.2); backwards from word 3 through N's row 3 (b = N^T a: word 1, 0.2; P a: nothing)."""
    state = links.empty_links(1, 5, 1)
    for words, weights in (([0], [1.0]), ([1], [1.0]), ([2, 3], [0.6, 0.4]), ([1], [0.5])):
        links.update_links(state, torch.tensor([words]), torch.tensor([weights]))
    N = torch.zeros(5, 5, dtype=torch.float64)
    N[1, 0], N[2, 1], N[3, 1] = 0.5, 0.3, 0.2
    P = torch.zeros(5, 5, dtype=torch.float64)
    P[0, 1], P[1, 2], P[2, 1] = 0.5, 0.3, 0.3
    torch.testing.assert_close(densify(state, "link", 0), N)
    torch.testing.assert_close(densify(state, "back", 0), P)
    assert state["precedence_words"][0].tolist() == [1]
    for direction, read, want in (("forward", 1, {2: 0.3}), ("backward", 3, {1: 0.2})):
        cand, vals = links.follow(state, direction, torch.tensor([[[read]]]), torch.tensor([[[1.0]]]))
        got = {c: v for c, v in zip(cand[0, 0].tolist(), vals[0, 0].tolist()) if c != 5}
        assert got.keys() == want.keys() and all(abs(got[c] - want[c]) < 1e-6 for c in want)


def test_the_measure_of_the_departure_is_zero_until_k_links_binds():
    """links_departure.py (the README's numbers): with K_L >= N nothing is cut, so links.follow, eq. 3.19-3.20 as
    printed and the DNC's dense L give the same weights; with K_L = 1 follow and the printed ones differ."""
    from projects.sam import links_departure

    small = dict(words=6, hidden=8, heads=2, word_size=4, k=2)
    uncut = links_departure.measure("copy", 8, 2, batch=2, level=4, **small)
    cut = links_departure.measure("copy", 1, 2, batch=2, level=4, **small)
    for direction in ("forward", "backward"):
        for pair in ("follow-printed", "follow-dense", "printed-dense"):
            assert uncut[direction, pair]["count"] > 0
            assert uncut[direction, pair]["max"] < 1e-6  # float32 links against float64, over 8 steps
        assert cut[direction, "follow-printed"]["max"] > 0.1
