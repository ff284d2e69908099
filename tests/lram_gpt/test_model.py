"""The GPT with the lattice memory: causality with each query norm, parameter count (by hand and LRAM paper
Table 2), learning rates, FLOPs, memory statistics, configs, and one end-to-end run of the trainer (the model
contract is tests/core/test_contract.py's)."""
import json
import math

import pytest
import torch

from languini import experiment, flops
from languini.transformer import MLP
from projects.lram_gpt import configs
from projects.lram_gpt.memory import LRAMBlock
from projects.lram_gpt.model import Model
from tests.memory_gpt import earlier_logits_unchanged, gpt_parameters, mlp_parameters

# 3 blocks of width 32 (2 memory heads), 2^12 locations: every test builds the model in milliseconds.
TINY = dict(vocab_size=50, seq_len=16, d_model=32, n_layers=3, n_heads=2, d_head=16, mlp_ratio=2, memory_size=2 ** 12)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Model(configs.ModelConfig(**{**TINY, **overrides}))


def lram_parameters(d, N, m, query_norm):
    """Affine w -> w, the query norm's gain and bias, N values of m, affine (w/16 heads x m) -> w (4w for m=64)."""
    norm = {"layer": 2 * d, "batch": 2 * d, "none": 0}[query_norm]
    read = d // 16 * m
    return (d * d + d) + norm + N * m + (read * d + d)


def test_sequence_longer_than_position_table_is_explained():
    model = tiny_model()
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.randint(50, (1, 17)))


def test_memory_replaces_one_mlp_at_the_configured_layer():
    model = tiny_model(memory_layers="0")
    assert [type(block.ff) for block in model.blocks] == [LRAMBlock, MLP, MLP] and model.memory is model.blocks[0].ff
    assert model.memory.memory_size == 2 ** 12 and model.memory.n_heads == 2 and model.memory.topk == 32
    with pytest.raises(ValueError, match="memory_layers"):
        tiny_model(memory_layers="3")


@pytest.mark.parametrize("n_layers,expected", [(6, 3), (12, 7), (24, 15), (4, 2), (2, 1), (1, 0)])
def test_default_memory_layer(n_layers, expected):
    # The LRAM paper puts the memory in the 4th of 6 layers; deeper models keep it at two thirds of the depth.
    assert tiny_model(n_layers=n_layers).memory_blocks == [expected]


@pytest.mark.parametrize("query_norm,causal", [("layer", True), ("batch", False)])
def test_model_is_causal_with_the_default_query_norm(query_norm, causal):
    assert configs.ModelConfig().memory_query_norm == "layer"
    model = tiny_model(memory_query_norm=query_norm).train()
    # batch norm shows that the check can fail: its batch statistics carry later tokens into earlier logits.
    assert earlier_logits_unchanged(model, 50) == causal


@pytest.mark.parametrize("name,query_norm", [("cpu", "layer"), ("small", "layer"), ("mini_m16", "none"),
                                             ("medium_m24", "batch")])
def test_parameter_count_by_hand(name, query_norm):
    cfg = configs.get(name, memory_query_norm=query_norm)
    with torch.device("meta"):
        model = Model(cfg)
    d = cfg.d_model
    expected = (gpt_parameters(cfg.vocab_size, cfg.seq_len, d, cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.mlp_ratio)
                - mlp_parameters(d, cfg.mlp_ratio) + lram_parameters(d, cfg.memory_size, 64, query_norm))
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("memory_size,total_millions", [(2 ** 18, 74.4), (2 ** 20, 124.8), (2 ** 22, 326.1)])
def test_lram_paper_models_add_their_parameters(memory_size, total_millions):
    # LRAM paper Table 2: 6 layers of width 512 (MLP 2048), memory in the 4th, baseline 58.4M; the difference
    # does not depend on the vocabulary or positions, and each total is rounded to 0.1M.
    cfg = configs.get("mini", n_layers=6, d_model=512, n_heads=8, d_head=64, seq_len=256, vocab_size=30000,
                      memory_size=memory_size, memory_query_norm="batch")
    with torch.device("meta"):
        model = Model(cfg)
    added = sum(p.numel() for p in model.parameters()) - gpt_parameters(30000, 256, 512, 6, 8, 64, 4)
    assert model.memory_blocks == [3]
    assert abs(added - (total_millions - 58.4) * 1e6) <= 0.1e6


def test_gpt_init_keeps_the_memory_init():
    model = tiny_model(memory_size=2 ** 14)
    # values ~ N(0, 1/m) with m = 64; the GPT's init would give N(0, 0.02)
    assert model.memory.values.std().item() == pytest.approx(64 ** -0.5, rel=0.02)
    assert model.memory.out.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * 3), rel=0.1)


@pytest.mark.parametrize("multiplier,sparse", [(10.0, False), (3.0, True)])
def test_optimizer_groups_give_the_values_their_learning_rate(multiplier, sparse):
    model = tiny_model(value_lr_multiplier=multiplier, sparse_values=sparse)
    groups = model.optimizer_groups(2e-4)
    values = [g for g in groups if any(p is model.memory.values for p in g["params"])]
    assert len(values) == 1 and values[0]["params"] == [model.memory.values]
    assert values[0]["lr"] == pytest.approx(multiplier * 2e-4)
    assert values[0].get("sparse", False) == sparse
    assert all(g["lr"] == 2e-4 and "sparse" not in g for g in groups if g is not values[0])
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # each parameter exactly once
    assert configs.ModelConfig().value_lr_multiplier == 10.0 and not configs.ModelConfig().sparse_values


def test_sparse_values_give_a_sparse_gradient_for_sparse_adam():
    model = tiny_model(sparse_values=True)
    logits, _ = model(torch.randint(50, (2, 5)))
    logits.square().mean().backward()
    assert model.memory.values.grad.layout == torch.sparse_coo
    assert all(p.grad.layout == torch.strided for p in model.optimizer_groups(1e-3)[0]["params"])


def test_extra_flops_by_hand():
    # per token and head: 64 (torus query) + 232 * 8 * 3 (candidate distances) + 4 * 32 (weights)
    # + 2 * 32 * 64 (weighted sum) + 64 (harmonic scale) = 9920
    assert tiny_model().extra_flops(16) == 16 * 2 * 9920
    assert tiny_model(memory_topk=8).extra_flops(16) == 16 * 2 * (64 + 5568 + 32 + 1024 + 64)


def test_shared_gated_memory_counts_its_table_once_and_every_read():
    model = tiny_model(memory_layers="0,2", share_memory=True, memory_gate="silu")
    assert [type(b.ff) for b in model.blocks] == [LRAMBlock, MLP, LRAMBlock] and model.memory_blocks == [0, 2]
    assert model.blocks[2].ff.values is model.blocks[0].ff.values and model.value_tables() == [model.memory.values]
    d, N, m, read = 32, 2 ** 12, 64, 2 * 64
    gate = d * read + read  # W_g: d -> h * m, with its bias
    own = lram_parameters(d, N, m, "layer") - N * m + gate  # what each memory layer holds besides the table
    expected = gpt_parameters(50, 16, d, 3, 2, 16, 2) - 2 * mlp_parameters(d, 2) + 2 * own + N * m
    assert sum(p.numel() for p in model.parameters()) == expected
    separate = tiny_model(memory_layers="0,2", memory_gate="silu")
    assert sum(p.numel() for p in separate.parameters()) == expected + N * m and len(separate.value_tables()) == 2
    # every memory layer reads: theta per head, and the gate's product read * silu(W_g x), which the profiler misses
    assert model.extra_flops(16) == 2 * 16 * (2 * 9920 + read)
    plain = tiny_model(memory_layers="0,2", share_memory=True)
    seen = flops.forward_flops(model, 16, 50) - flops.forward_flops(plain, 16, 50)
    assert seen == 2 * 16 * (2 * d * read + read) + 2 * 16 * read  # W_g and silu by the profiler, the product added
    values = [g for g in model.optimizer_groups(1e-3) if g["lr"] == pytest.approx(1e-2)]
    assert len(values) == 1 and values[0]["params"] == [model.memory.values]


def test_memory_stats_per_reading_layer_and_for_the_shared_table():
    model = tiny_model(memory_size=2 ** 8, memory_layers="0,2", share_memory=True).eval()
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(50, (2, 9)))
    stats = model.memory_stats()
    assert stats["layers"].keys() == {"block_0", "block_2"}
    weights = [m.stats.weight for m in model.memories]
    assert stats["memory_usage"] == ((weights[0] + weights[1]) > 0).double().mean().item()
    assert stats["memory_usage"] >= max(s["memory_usage"] for s in stats["layers"].values())
    separate = tiny_model(memory_size=2 ** 8, memory_layers="0,2").eval()
    separate.reset_memory_stats()
    with torch.no_grad():
        separate(torch.randint(50, (2, 9)))
    assert separate.memory_stats().keys() == {"layers"}  # two tables: each layer's reads only


@pytest.mark.parametrize("options", [dict(memory_layers="0,2", share_memory=True), dict(memory_gate="silu")])
def test_shared_and_gated_memories_train(options):
    model = tiny_model(**options)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.randint(50, (4, 16))
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1])[0].flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.85 * losses[0]


def test_profiler_sees_nothing_of_theta_on_either_path():
    counts = {}
    for topk in (8, 32):
        model = tiny_model(memory_topk=topk)
        counts[topk] = flops.forward_flops(model, 16, 50) - model.extra_flops(16)
        model.memory.use_triton = True  # the kernel under the interpreter
        assert flops.forward_flops(model, 16, 50) - model.extra_flops(16) == counts[topk]
    assert counts[8] == counts[32]  # what the profiler counts does not depend on the lookup


def test_flops_on_the_meta_device_match_cpu():
    with torch.device("meta"):
        meta_model = Model(configs.ModelConfig(**TINY))
    assert flops.forward_flops(meta_model, 16, 50, "meta") == flops.forward_flops(tiny_model(), 16, 50)


def test_memory_stats_after_eval_forwards():
    model = tiny_model(memory_size=2 ** 8)
    with pytest.raises(ValueError, match="reset_memory_stats"):
        model.memory_stats()
    memory_inputs = []
    model.memory.register_forward_hook(lambda module, args, out: memory_inputs.append(args[0]))
    x = torch.randint(50, (2, 9))
    model.reset_memory_stats()
    with torch.no_grad():
        model.eval()(x)
        model(x[:1])
    stats = model.memory_stats()
    assert 0 < stats["memory_usage"] <= 1 and stats["kl_from_uniform"] >= 0
    index = torch.cat([model.memory.read_locations(inputs)[0].flatten() for inputs in memory_inputs])
    assert stats["memory_usage"] == index.unique().numel() / 2 ** 8


def test_memory_stats_through_the_distributed_path(tmp_path):
    model = tiny_model(memory_size=2 ** 8).eval()
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(50, (2, 9)))
    alone = model.memory_stats()
    # a group of one process runs the all-reduce path (not the sum over several: that needs more processes)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        assert model.memory_stats() == alone and model.memory_stats() == alone
    finally:
        torch.distributed.destroy_process_group()


def test_configs():
    for size in ("mini", "tiny", "small", "medium", "large", "XL"):
        assert configs.get(size).memory_size == 2 ** 20
        for e in range(16, 25):
            assert configs.get(f"{size}_m{e}") == configs.get(size, memory_size=2 ** e)
    # the GPT baseline's size and batch per compute class (Languini paper, Table 6)
    assert {c: (v["config"], v["batch_size"]) for c, v in configs.COMPUTE_CLASSES.items()} == {
        "6h": ("small", 128), "12h": ("small", 128), "24h": ("small", 256), "48h": ("medium", 256),
        "96h": ("medium", 256)}
    with pytest.raises(ValueError, match="small_m22"):
        configs.get("small_m15")


def test_training_run_end_to_end(default_corpus_root, tmp_path):
    # --config cpu: without it a machine with a GPU picks the small config.
    argv = ["--config", "cpu", "--max_steps", "3", "--batch_size", "4", "--eval_every", "3", "--eval_batch_size", "4",
            "--eval_max_batches", "2", "--slow_eval_max_windows", "2", "--data_root", str(default_corpus_root),
            "--out_dir", str(tmp_path), "--run_name", "smoke"]
    experiment.main("lram_gpt", configs, Model, argv=argv)
    results = json.loads((tmp_path / "smoke" / "results.json").read_text())
    assert results["project"] == "lram_gpt" and results["config"] == "cpu" and results["steps"] == 3
    assert results["memory_stats"].keys() == results["eval"]["fast"].keys()
    for stats in results["memory_stats"].values():
        assert 0 < stats["memory_usage"] <= 1
        assert 0 <= stats["kl_from_uniform"] <= math.log(configs.get("cpu").memory_size)


def test_math_attention_is_the_default_and_agrees_with_sdpa():
    assert configs.ModelConfig().attention == "math"  # the official code's default (use_flash off)
    math_model, sdpa_model = tiny_model().eval(), tiny_model(attention="sdpa").eval()
    x = torch.randint(50, (2, 16))
    # Two fp32 computations (eps 1.2e-7) of scores over d_head products and sums over <= 16 weights, in
    # three layers: they differ by about 1e-7 (logits of order 0.5); 1e-5 leaves a wide margin.
    torch.testing.assert_close(math_model(x)[0], sdpa_model(x)[0], rtol=1e-5, atol=1e-5)
