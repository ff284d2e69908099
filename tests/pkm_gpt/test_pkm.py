"""Product-key memory layer: exact top-k, causality, shapes, sparse value gradients, statistics, FLOPs."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from languini.memory_stats import MemoryStats
from projects.pkm_gpt.pkm import (LRAM_PAPER_PKM, XLM_PKM, PKMConfig, ProductKeyMemory, pkm_flops,
                                  product_key_topk)

# A tiny layer: d_model 12, 3 heads, k_dim 6, 7^2 = 49 values of v_dim 10, knn 4.
TINY = dict(heads=3, k_dim=6, n_keys=7, knn=4, v_dim=10)
PATHS = {"reference": dict(use_triton=False),
         "triton-atomic": dict(use_triton=True, value_grad="atomic"),
         "triton-segment": dict(use_triton=True, value_grad="segment")}


def tiny_layer(seed=0, **overrides):
    torch.manual_seed(seed)
    return ProductKeyMemory(12, **{**TINY, **overrides})


@pytest.mark.parametrize("heads,n_keys,k_dim,knn", [(3, 16, 6, 5), (2, 7, 8, 7), (1, 9, 4, 1)])
def test_product_key_topk_equals_exhaustive_topk(heads, n_keys, k_dim, knn):
    generator = torch.Generator().manual_seed(n_keys)
    queries = torch.randn(23, heads, k_dim, generator=generator, dtype=torch.float64)
    sub_keys = torch.randn(heads, 2, n_keys, k_dim // 2, generator=generator, dtype=torch.float64)
    # All N = n_keys^2 full keys; key i1 * n_keys + i2 is the concatenation of sub-keys i1 and i2.
    first = sub_keys[:, 0].repeat_interleave(n_keys, dim=1)  # [heads, N, k_dim/2]: sub-key i // n_keys
    second = sub_keys[:, 1].repeat(1, n_keys, 1)  # sub-key i % n_keys
    full_keys = torch.cat([first, second], dim=-1)  # [heads, N, k_dim]
    expected_scores, expected_indices = torch.einsum("rhd,hnd->rhn", queries, full_keys).topk(knn, dim=-1)

    scores, indices = product_key_topk(queries, sub_keys, knn)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(scores, expected_scores)


@pytest.mark.parametrize("query_norm", ["layer", "none"])
def test_query_norm_is_causal(query_norm):
    layer = tiny_layer(query_norm=query_norm, use_triton=False).train()
    x = torch.randn(2, 9, 12)
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 4, 12)
    # exact: the first 5 positions go through the same kernels on the same numbers in both calls
    assert torch.equal(layer(x)[:, :5], layer(changed)[:, :5])


def test_batchnorm_in_training_is_not_causal():
    # The causality test above can fail: batch statistics carry later tokens into earlier outputs.
    layer = tiny_layer(query_norm="batch", use_triton=False).train()
    x = torch.randn(2, 9, 12)
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 4, 12)
    assert not torch.allclose(layer(x)[:, :5], layer(changed)[:, :5])


def test_default_config_is_causal_layernorm():
    assert ProductKeyMemory(8, heads=1, k_dim=4, n_keys=3, knn=2).query_norm.__class__ is torch.nn.LayerNorm


@pytest.mark.parametrize("path", PATHS)
def test_output_shape_and_dtype(path, device):
    layer = tiny_layer(**PATHS[path]).to(device)
    assert layer(torch.randn(3, 5, 12).to(device)).shape == (3, 5, 10)
    assert layer.to(torch.bfloat16)(torch.randn(3, 5, 12, dtype=torch.bfloat16).to(device)).dtype == torch.bfloat16
    assert tiny_layer(v_dim=None, use_triton=False)(torch.randn(1, 2, 12)).shape == (1, 2, 12)


@pytest.mark.parametrize("path", PATHS)
def test_value_gradient_only_on_touched_rows(path, device):
    layer = tiny_layer(n_keys=9, **PATHS[path]).to(device)  # 81 rows, 2 * 3 tokens * 3 heads * 4 slots = 72 accesses
    x = torch.randn(2, 3, 12).to(device)
    (layer(x) * torch.randn(2, 3, 10).to(device)).sum().backward()
    indices, _ = layer.lookup(x)
    touched = torch.zeros(layer.num_values, dtype=torch.bool, device=device)
    touched[indices.flatten()] = True
    assert 0 < touched.sum() < layer.num_values
    assert torch.equal(layer.values.grad.abs().sum(dim=1) > 0, touched)


@pytest.mark.parametrize("path", ["triton-atomic", "triton-segment"])
def test_triton_layer_matches_reference_layer(path, device):
    x = torch.randn(2, 7, 12).to(device)
    grad_out = torch.randn(2, 7, 10).to(device)
    results = []
    for options in (PATHS["reference"], PATHS[path]):
        layer = tiny_layer(seed=1, **options).to(device)
        out = layer(x)
        (out * grad_out).sum().backward()
        results.append((out, {name: p.grad for name, p in layer.named_parameters()}))
    (expected_out, expected_grads), (out, grads) = results
    torch.testing.assert_close(out, expected_out)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], msg=name)


@pytest.mark.parametrize("path", ["reference", "triton-atomic"])
def test_sparse_values_layer_matches_dense_layer(path, device):
    x = torch.randn(2, 7, 12).to(device)
    grad_out = torch.randn(2, 7, 10).to(device)
    results = []
    for sparse_values in (False, True):
        layer = tiny_layer(seed=1, sparse_values=sparse_values, **PATHS[path]).to(device)
        out = layer(x)
        (out * grad_out).sum().backward()
        results.append((out, {name: p.grad for name, p in layer.named_parameters()}))
    (expected_out, expected_grads), (out, grads) = results
    assert grads["values"].layout == torch.sparse_coo
    grads["values"] = grads["values"].to_dense()
    # exact: both forwards run the same kernel on the same numbers (the reference's sparse path on copies of the
    # rows it gathers first)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], msg=name)


@pytest.mark.parametrize("path", ["reference", "triton-segment"])
def test_sparse_adam_moves_only_the_rows_read_in_its_step(path, device):
    # Two steps on different tokens. Rows read only in the first keep Adam momentum, so dense Adam moves them in
    # the second step too (showing that the check can fail); SparseAdam moves only the second step's rows.
    first, second = torch.randn(1, 2, 12).to(device), torch.randn(1, 2, 12).to(device)
    moved = {}
    for sparse_values, optimizer_cls in ((True, torch.optim.SparseAdam), (False, torch.optim.Adam)):
        layer = tiny_layer(n_keys=9, sparse_values=sparse_values, **PATHS[path]).to(device)  # 81 rows, 24 reads/step
        optimizer = optimizer_cls(layer.value_parameters(), lr=1e-2)
        for x in (first, second):
            before = layer.values.detach().clone()
            optimizer.zero_grad()
            layer(x).square().sum().backward()
            optimizer.step()
        moved[sparse_values] = set((layer.values.detach() != before).any(dim=1).nonzero().flatten().tolist())
    read_first, read_second = (set(layer.lookup(x)[0].flatten().tolist()) for x in (first, second))
    assert read_first - read_second, "the draw should read some rows in the first step only"
    assert moved[True] == read_second
    assert moved[False] == read_first | read_second


def test_value_parameters_are_the_table_only():
    layer = tiny_layer()
    assert [id(p) for p in layer.value_parameters()] == [id(layer.values)]
    assert layer.values.shape == (49, 10)


def test_memory_usage_collected_in_forward():
    layer = tiny_layer(use_triton=False).eval()
    x = torch.randn(2, 5, 12)
    layer.stats = MemoryStats(layer.num_values)
    with torch.no_grad():
        layer(x)
        layer(x)
    indices, _ = layer.lookup(x)
    assert layer.stats.result()["memory_usage"] == indices.unique().numel() / layer.num_values
    assert layer.stats.weight.sum().item() == pytest.approx(2 * 2 * 5 * TINY["heads"])


def test_flops_match_profiler_and_hand_count():
    tokens, d_model = 2 * 5, 12
    layer = tiny_layer(use_triton=False)
    with FlopCounterMode(display=False) as counter:
        layer(torch.randn(2, 5, d_model))
    flops = pkm_flops(tokens, d_model, **TINY)
    # The profiler sees the query projection and the half-key scores (matmuls), not the gathers.
    assert counter.get_total_flops() == flops["query"] + flops["key_scores"]
    assert flops["embedding_bag"] == tokens * 3 * 4 * 10 * 2  # tokens * heads * knn * v_dim multiply-adds
    assert flops["candidate_sums"] == tokens * 3 * 4 * 4
    # 10 tokens: query 2*12*3*6 = 432, half-key scores 2*3*7*6 = 252, sums 3*4*4 = 48, bag 2*3*4*10 = 240 each
    assert flops["total"] == 10 * (432 + 252 + 48 + 240)


def test_presets():
    with torch.device("meta"):
        lram = ProductKeyMemory.from_config(512, LRAM_PAPER_PKM)
    assert lram.values.shape == (2 ** 16, 512)
    assert lram.sub_keys.shape == (8, 2, 256, 32)
    assert lram.query_proj.out_features == 8 * 64 and lram.knn == 32
    assert (XLM_PKM.heads, XLM_PKM.k_dim, XLM_PKM.knn, XLM_PKM.n_keys ** 2) == (4, 256, 32, 512 ** 2)
    assert XLM_PKM.v_dim is None
    assert not LRAM_PAPER_PKM.sparse_values
    assert ProductKeyMemory.from_config(12, PKMConfig(**TINY, sparse_values=True)).sparse_values


@pytest.mark.parametrize("bad", [dict(k_dim=5), dict(knn=8), dict(query_norm="rms"), dict(value_grad="x")])
def test_bad_config_raises_value_error(bad):
    with pytest.raises(ValueError):
        tiny_layer(**bad)


def test_layer_compiles_without_graph_break(device):
    layer = tiny_layer(use_triton=True).to(device)
    x = torch.randn(2, 3, 12).to(device)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    compiled(x).sum().backward()
    expected = tiny_layer(use_triton=True).to(device)(x)
    torch.testing.assert_close(compiled(x), expected)
    assert layer.values.grad is not None
