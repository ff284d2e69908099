"""The PEER layer against brute force: the experts it reads are the best of all N product keys of each head, its
output is a loop over heads and chosen experts (eq. 7), its gradients pass gradcheck in float64, and the Triton path
(interpreter on CPU) gives the reference path's output and gradients."""

import math

import pytest
import torch

from projects.peer_gpt.peer import PEER
from tests.memory_gpt import assert_runs_close, reference_and_triton_runs

# 3 heads, queries of 6, 5 sub-keys a half (25 experts), 4 experts per head, width 7: odd sizes
SIZES = dict(heads=3, k_dim=6, n_keys=5, knn=4)
D = 7


def layer_and_input(seed=0, dtype=torch.float64, rows=(2, 3), **options):
    torch.manual_seed(seed)
    layer = PEER(D, **{**SIZES, **options}).to(dtype)
    for p in layer.parameters():  # larger than the init, so that every part moves the output visibly
        torch.nn.init.normal_(p, std=0.5)
    return layer, torch.randn(*rows, D, dtype=dtype)


def all_product_keys(sub_keys):
    """[n_keys^2, k_dim]: key i1 * n_keys + i2 is sub-key i1 of the first half joined to sub-key i2 of the second."""
    first, second = sub_keys[0], sub_keys[1]
    n = first.shape[0]
    return torch.cat([first.repeat_interleave(n, 0), second.repeat(n, 1)], dim=1)


def gelu_tanh(z):
    return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def brute_force(layer, x):
    """(indices [R, heads, knn] of the best product keys over all N, the layer's output by a loop)."""
    tokens = x.flatten(0, -2)
    queries = layer.query_norm(layer.query_proj(tokens)).unflatten(-1, (layer.heads, layer.k_dim))
    scores = queries @ all_product_keys(layer.sub_keys).T  # [R, heads, N]: every head scores all experts
    best = scores.topk(layer.knn, dim=-1)
    out = torch.zeros_like(tokens)
    for r in range(tokens.shape[0]):
        for h in range(layer.heads):
            router = torch.softmax(best.values[r, h], dim=0)  # eq. 2 with s = softmax, per head (Algorithm 1)
            for j, i in enumerate(best.indices[r, h].tolist()):
                out[r] = out[r] + router[j] * gelu_tanh(layer.down[i] @ tokens[r]) * layer.up[i]
    return best.indices, out.unflatten(0, x.shape[:-1])


def test_reads_the_best_experts_of_all_product_keys_and_sums_their_outputs_over_heads():
    layer, x = layer_and_input()
    expected_indices, expected_out = brute_force(layer, x)
    indices, weights = layer.lookup(x)
    assert indices.shape == weights.shape == (6, SIZES["heads"] * SIZES["knn"])
    # each head's knn experts are the brute force's (in the same, descending order: random scores have no ties)
    assert torch.equal(indices.unflatten(1, (SIZES["heads"], SIZES["knn"])), expected_indices)
    torch.testing.assert_close(weights.unflatten(1, (3, 4)).sum(-1), torch.ones(6, 3, dtype=torch.float64))
    torch.testing.assert_close(layer(x), expected_out, rtol=1e-12, atol=1e-12)


def test_heads_share_the_product_keys_and_the_experts():
    layer, _ = layer_and_input()
    assert layer.sub_keys.shape == (2, SIZES["n_keys"], SIZES["k_dim"] // 2)
    assert layer.down.shape == layer.up.shape == (SIZES["n_keys"] ** 2, D) and layer.num_experts == 25
    # one query head reading one expert is one hidden neuron of an MLP (eq. 8): gelu(u . x) v
    one, x = layer_and_input(heads=1, knn=1)
    i = one.lookup(x)[0][0, 0]
    torch.testing.assert_close(one(x)[0, 0], gelu_tanh(one.down[i] @ x[0, 0]) * one.up[i])


def test_gradients_of_input_and_every_parameter_pass_gradcheck_in_float64():
    layer, x = layer_and_input(rows=(1, 3))
    names = [name for name, _ in layer.named_parameters()]

    def output(x, *params):
        return torch.func.functional_call(layer, dict(zip(names, params)), (x,))

    inputs = [x.requires_grad_(), *[p.detach().clone().requires_grad_() for p in layer.parameters()]]
    # top-k is piecewise constant: a small step changes no choice, and the gradient is that of the chosen experts
    assert torch.autograd.gradcheck(output, inputs, eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_triton_path_gives_the_reference_output_and_gradients(sparse, device):
    layer, x = layer_and_input(dtype=torch.float32, sparse_experts=sparse)
    reference, triton = reference_and_triton_runs(layer, x, device, ("use_triton", "triton_search"))
    assert layer.down.grad.layout == (torch.sparse_coo if sparse else torch.strided)
    assert_runs_close(reference, triton, tol=1e-5)  # fp32 sums of a few dozen terms of order 1-10


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="k_dim"):
        PEER(8, k_dim=5)
    with pytest.raises(ValueError, match="knn"):
        PEER(8, n_keys=4, knn=5)
