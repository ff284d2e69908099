"""The Sparse DNC's links (links.py) against the DNC's dense link matrix, eq. 3.9 and 3.11 computed entry by entry
in float64, on memories small enough that the K_L limit never binds (rows of N - 1 <= K_L entries)."""
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


def densify(cols, vals, words):
    """(N + 1, K_L) sparse rows -> (N, N) dense."""
    out = torch.zeros(words, words, dtype=torch.float64)
    for i in range(words):
        for c, v in zip(cols[i].tolist(), vals[i].tolist()):
            if c != words:
                out[i, c] += v
    return out


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
        torch.testing.assert_close(densify(state["link_cols"][b], state["link_vals"][b], words), L, atol=1e-6, rtol=0)
        torch.testing.assert_close(densify(state["back_cols"][b], state["back_vals"][b], words), L.T, atol=1e-6,
                                   rtol=0)
        dense_p = torch.zeros(words, dtype=torch.float64)
        for c, v in zip(state["precedence_words"][b].tolist(), state["precedence_weights"][b].tolist()):
            if c != words:
                dense_p[c] += v
        torch.testing.assert_close(dense_p, p, atol=1e-6, rtol=0)
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
    dense = densify(state["link_cols"][0], state["link_vals"][0], 6)
    want = torch.zeros(6, 6, dtype=torch.float64)
    want[1, 0], want[2, 1], want[3, 2], want[4, 2] = 1.0, 1.0, 0.5, 0.5
    torch.testing.assert_close(dense, want)
    assert sorted(state["precedence_words"][0].tolist()) == [3, 4]
    assert (state["link_cols"][0] != 6).sum(-1).max() <= 2
