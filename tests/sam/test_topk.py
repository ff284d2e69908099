"""The exact K-nearest-word search (ops/topk): the PyTorch path and the Triton kernel (interpreter on CPU) against
cosine similarities computed word by word in float64 and sorted."""
import math

import pytest
import torch

from projects.sam.ops.topk import EMPTY, cosine_topk

IMPLS = ["naive", "triton"]


def brute_force(query, memory, k):
    """Every (similarity, index) of every word, computed one by one in float64 and sorted: the k best per query."""
    B, H, _ = query.shape
    values, indices = torch.empty(B, H, k, dtype=torch.float64), torch.empty(B, H, k, dtype=torch.int64)
    for b in range(B):
        for h in range(H):
            q = query[b, h].double()
            scored = []
            for i, word in enumerate(memory[b].double()):
                norm = math.sqrt(float((word * word).sum()))
                scored.append((float(q @ word) / (float(q.norm()) * norm) if norm > 0 else EMPTY, i))
            scored.sort(key=lambda pair: (-pair[0], pair[1]))
            values[b, h] = torch.tensor([s for s, _ in scored[:k]], dtype=torch.float64)
            indices[b, h] = torch.tensor([i for _, i in scored[:k]])
    return values, indices


def random_memory(B, H, N, W, empty, seed):
    g = torch.Generator().manual_seed(seed)
    memory = torch.randn(B, N, W, generator=g)
    memory[:, torch.randperm(N, generator=g)[:empty]] = 0.0  # never-written words
    return torch.randn(B, H, W, generator=g) * 3.0, memory


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,H,N,W,k,empty", [(1, 1, 5, 3, 4, 0), (2, 3, 300, 32, 4, 7), (2, 2, 129, 17, 8, 0),
                                               (1, 2, 6, 8, 4, 3)])
def test_topk_matches_brute_force(impl, B, H, N, W, k, empty, device):
    query, memory = random_memory(B, H, N, W, empty, seed=N + W)
    values, indices = cosine_topk(query.to(device), memory.to(device), k, impl)
    everything, order = brute_force(query, memory, N)
    assert values.shape == indices.shape == (B, H, k) and indices.dtype == torch.int64
    # fp32 cosines of words of width <= 32: errors of a few 1e-7
    torch.testing.assert_close(values.cpu().double(), everything[..., :k], rtol=0, atol=1e-5)
    # indices agree wherever the similarity is not tied with a neighbour (all-zero words tie at EMPTY)
    gaps = torch.cat([everything[..., :-1] - everything[..., 1:], torch.ones(B, H, 1, dtype=torch.float64)], -1)
    distinct = ((gaps > 1e-5) & torch.cat([torch.ones(B, H, 1, dtype=torch.bool), gaps[..., :-1] > 1e-5], -1))[..., :k]
    assert distinct.float().mean() > 0.5  # the comparison checks most places
    assert torch.equal(indices.cpu()[distinct], order[..., :k][distinct])


def test_hand_computed_example(device):
    """Words (1,0), (0,1), (1,1), (0,0), (-1,0) and the query (2,1): cosines 2/sqrt5, 1/sqrt5, 3/sqrt10, EMPTY,
    -2/sqrt5, so the order is 2, 0, 1, 4 (the empty word last)."""
    memory = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [-1.0, 0.0]]])
    query = torch.tensor([[[2.0, 1.0]]])
    for impl in IMPLS:
        values, indices = cosine_topk(query.to(device), memory.to(device), 5, impl)
        assert indices.cpu().tolist() == [[[2, 0, 1, 4, 3]]]
        want = torch.tensor([3 / 10 ** 0.5, 2 / 5 ** 0.5, 1 / 5 ** 0.5, -2 / 5 ** 0.5, EMPTY])
        torch.testing.assert_close(values.cpu()[0, 0], want, rtol=0, atol=1e-6)
