"""The GPT with a product-key memory: causality with each query norm, parameter count, learning rates, FLOPs,
memory stats, one end-to-end run of the trainer, and a trainer step with row-sparse values (the model contract
is tests/core/test_contract.py's)."""

import math

import pytest
import torch

from languini import flops
from languini.books import BooksDataset
from languini.memory_stats import MemoryStats
from languini.trainer import TrainConfig, Trainer
from projects.pkm_gpt import configs
from projects.pkm_gpt.model import MLP, Model
from projects.pkm_gpt.pkm import ProductKeyMemory
from tests.memory_gpt import (earlier_logits_unchanged, gpt_parameters, losses_on_one_batch, mlp_parameters,
                              smoke_run_results)

# 3 blocks, 4 x 4 = 16 values of width 24, so that every test builds the model in milliseconds.
TINY = dict(vocab_size=50, seq_len=16, d_model=24, n_layers=3, n_heads=2, d_head=8, mlp_ratio=2,
            pkm_heads=2, pkm_k_dim=6, pkm_n_keys=4, pkm_knn=3)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Model(configs.ModelConfig(**{**TINY, **overrides}))


def pkm_parameters(d, heads, k_dim, n_keys):
    """Query projection with bias, layer norm over heads * k_dim, two halves of n_keys sub-keys per head,
    n_keys^2 values of width d."""
    return d * heads * k_dim + heads * k_dim + 2 * heads * k_dim + heads * 2 * n_keys * (k_dim // 2) + n_keys ** 2 * d


def test_sequence_longer_than_position_table_is_explained():
    model = tiny_model()
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.randint(50, (1, 17)))


def test_memory_replaces_one_mlp_at_the_configured_layer():
    model = tiny_model(memory_layers="0")
    kinds = [type(block.ff) for block in model.blocks]
    assert kinds == [ProductKeyMemory, MLP, MLP] and model.memory is model.blocks[0].ff
    assert model.memory.v_dim == TINY["d_model"]
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
    # batchnorm shows that the check can fail: its batch statistics carry later tokens into earlier logits.
    assert earlier_logits_unchanged(model, 50) == causal


@pytest.mark.parametrize("name,millions", [("tiny", 53.9), ("small", 110.6), ("medium", 336.4), ("large", 731.1),
                                           ("XL", 1478.2)])
def test_hand_count_of_the_gpt_matches_the_languini_paper(name, millions):
    # Table 4 (mini's 27.6M is left out: the formula gives 27.55M, which the table rounds up).
    cfg = configs.get(name)
    count = gpt_parameters(cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_head,
                           cfg.mlp_ratio)
    assert count / 1e6 == pytest.approx(millions, abs=0.05)


@pytest.mark.parametrize("name,readme_millions", [("cpu", None), ("small", 156.8), ("small_xlm", 308.5)])
def test_parameter_count_by_hand(name, readme_millions):
    cfg = configs.get(name)
    with torch.device("meta"):
        model = Model(cfg)
    d = cfg.d_model
    expected = (gpt_parameters(cfg.vocab_size, cfg.seq_len, d, cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.mlp_ratio)
                - mlp_parameters(d, cfg.mlp_ratio) + pkm_parameters(d, cfg.pkm_heads, cfg.pkm_k_dim, cfg.pkm_n_keys))
    assert sum(p.numel() for p in model.parameters()) == expected
    assert readme_millions is None or round(expected / 1e6, 1) == readme_millions  # as projects/pkm_gpt/README.md


def test_lram_paper_pkm_adds_its_parameters():
    # LRAM paper Table 2: 6 layers of width 512 (MLP 2048), PKM in the 4th: 90.3M total against the baseline's
    # 58.4M, i.e. 31.9M +- 0.1M from the rounding; the difference does not depend on the vocabulary.
    cfg = configs.get("mini", n_layers=6, d_model=512, n_heads=8, d_head=64, seq_len=256, vocab_size=30000)
    with torch.device("meta"):
        model = Model(cfg)
    baseline = gpt_parameters(30000, 256, 512, 6, 8, 64, 4)
    assert model.memory_blocks == [3] and model.memory.num_values == 2 ** 16
    assert 31.8e6 <= sum(p.numel() for p in model.parameters()) - baseline <= 32.0e6


def test_gpt_init_keeps_the_memory_init():
    model = tiny_model(d_model=256, pkm_n_keys=16, n_heads=4, d_head=64)
    # XLM's init: values ~ N(0, 1/v_dim), sub-keys ~ U(+-1/sqrt(k_dim/2)); the GPT's init would give N(0, 0.02).
    assert model.memory.values.std().item() == pytest.approx(256 ** -0.5, rel=0.05)
    bound = 1 / math.sqrt(TINY["pkm_k_dim"] // 2)
    assert model.memory.sub_keys.abs().max().item() <= bound
    assert model.memory.sub_keys.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


@pytest.mark.parametrize("multiplier,sparse", [(10.0, False), (3.0, True)])
def test_optimizer_groups_give_the_values_their_learning_rate(multiplier, sparse):
    model = tiny_model(value_lr_multiplier=multiplier, sparse_values=sparse)
    groups = model.optimizer_groups(2e-4)
    values = [g for g in groups if any(p is model.memory.values for p in g["params"])]
    assert len(values) == 1 and [p for p in values[0]["params"]] == [model.memory.values]
    assert values[0]["lr"] == pytest.approx(multiplier * 2e-4)
    assert values[0].get("sparse", False) == sparse and model.memory.sparse_values == sparse
    assert all(g["lr"] == 2e-4 and "sparse" not in g for g in groups if g is not values[0])
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # each parameter exactly once
    assert configs.ModelConfig().value_lr_multiplier == 10.0 and not configs.ModelConfig().sparse_values


def test_extra_flops_hold_everything_that_depends_on_knn():
    # DeepSpeed sees the matmuls (query projection, half-key scores) but not the candidate sums and the bag,
    # whose FLOPs per token are heads * knn^2 + 2 * heads * knn * d_model.
    counts = {}
    for knn in (2, 4):
        model = tiny_model(pkm_knn=knn)
        counts[knn] = (flops.forward_flops(model, 16, 50), model.extra_flops(16))
        assert counts[knn][1] == 16 * (2 * knn * knn + 2 * 2 * knn * 24)
    assert counts[2][0] - counts[2][1] == counts[4][0] - counts[4][1]


def test_shared_gated_memory_counts_its_table_once_and_every_read():
    model = tiny_model(memory_layers="0,2", share_memory=True, memory_gate="silu")
    assert [type(b.ff) for b in model.blocks] == [ProductKeyMemory, MLP, ProductKeyMemory]
    assert model.blocks[2].ff.values is model.blocks[0].ff.values and model.value_tables() == [model.memory.values]
    d, table = 24, 16 * 24
    gate = 2 * (d * d + d)  # Memory+: W_g (d -> v_dim) and W_o (v_dim -> d), with biases
    own = pkm_parameters(d, 2, 6, 4) - table + gate  # what each memory layer holds besides the table
    expected = gpt_parameters(50, 16, d, 3, 2, 8, 2) - 2 * mlp_parameters(d, 2) + 2 * own + table
    assert sum(p.numel() for p in model.parameters()) == expected
    separate = tiny_model(memory_layers="0,2", memory_gate="silu")
    assert sum(p.numel() for p in separate.parameters()) == expected + table and len(separate.value_tables()) == 2
    plain = tiny_model(memory_layers="0,2", share_memory=True)
    # every memory layer reads (candidate sums and bag), and the gate's product read * silu(W_g x)
    assert model.extra_flops(16) == plain.extra_flops(16) + 2 * 16 * d == 2 * 16 * (2 * 3 * 3 + 2 * 2 * 3 * d + d)
    seen = flops.forward_flops(model, 16, 50) - flops.forward_flops(plain, 16, 50)
    assert seen == 2 * 16 * (2 * 2 * d * d + d) + 2 * 16 * d  # W_g, W_o and silu by the profiler, the product added


def test_memory_stats_per_reading_layer_and_for_the_shared_table():
    model = tiny_model(memory_layers="0,2", share_memory=True).eval()
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(50, (2, 9)))
    stats = model.memory_stats()
    assert stats["layers"].keys() == {"block_0", "block_2"}
    weights = [m.stats.weight for m in model.memories]
    assert stats["memory_usage"] == ((weights[0] + weights[1]) > 0).double().mean().item()


@pytest.mark.parametrize("options", [dict(memory_layers="0,2", share_memory=True), dict(memory_gate="silu")])
def test_shared_and_gated_memories_train(options):
    model = tiny_model(**options)
    losses = losses_on_one_batch(model, 50)
    assert losses[-1] < 0.85 * losses[0]


def test_flops_on_the_meta_device_match_cpu():
    with torch.device("meta"):
        meta_model = Model(configs.ModelConfig(**TINY))
    assert flops.forward_flops(meta_model, 16, 50, "meta") == flops.forward_flops(tiny_model(), 16, 50)


def test_memory_stats_after_a_forward():
    model = tiny_model().eval()
    assert model.memory.stats is None  # nothing is collected during training
    with pytest.raises(ValueError, match="reset_memory_stats"):
        model.memory_stats()
    memory_inputs = []
    model.memory.register_forward_hook(lambda module, args, out: memory_inputs.append(args[0]))
    x = torch.randint(50, (2, 9))
    model.reset_memory_stats()
    with torch.no_grad():
        model(x)
        indices, weights = model.memory.lookup(memory_inputs[0])
    stats = model.memory_stats()
    assert stats["memory_usage"] == indices.unique().numel() / 16
    counts = torch.zeros(16, dtype=torch.float64).index_add_(0, indices.flatten(), weights.flatten().double())
    p = counts / counts.sum()
    kl = sum(p_i * math.log(p_i * 16) for p_i in p.tolist() if p_i > 0)
    assert stats["kl_from_uniform"] == pytest.approx(kl)


def test_training_run_end_to_end(default_corpus_root, tmp_path):
    smoke_run_results("pkm_gpt", configs, Model, default_corpus_root, tmp_path, configs.get("cpu").pkm_n_keys ** 2)


def test_sparse_values_trainer_step_moves_only_the_rows_read(default_corpus_root, tmp_path):
    # 16^2 = 256 rows, at most 2 sequences * 8 tokens * 2 heads * 3 reads = 96 of them read; two micro-batches
    # add up two sparse gradients before the step.
    cfg = configs.ModelConfig(**{**TINY, "vocab_size": 2048, "seq_len": 8, "pkm_n_keys": 16, "sparse_values": True})
    torch.manual_seed(0)
    trainer = Trainer(project="pkm_gpt", config_name="cpu", model_cfg=cfg, model_cls=Model,
                      tcfg=TrainConfig(batch_size=2, micro_batches=2), dataset=BooksDataset(default_corpus_root, 2048),
                      bytes_per_token=torch.ones(2048), run_dir=tmp_path, total_steps=1, tokens_per_second=1.0)
    assert [type(opt) for opt in trainer.optimizers] == [torch.optim.Adam, torch.optim.SparseAdam]
    memory = trainer.model.memory
    memory.stats = MemoryStats(memory.num_values)  # records the rows every forward reads
    before = memory.values.detach().clone()
    x, y = trainer.batches(0)
    assert math.isfinite(trainer.train_step(x, y))
    assert memory.values.grad.layout == torch.sparse_coo
    moved = (memory.values.detach() != before).any(dim=1)
    assert torch.equal(moved, memory.stats.weight > 0) and 0 < moved.sum() < memory.num_values


def test_memory_stats_when_distributed(tmp_path):
    # One process suffices to run the all-reduce path that merges the accesses of all processes.
    model = tiny_model().eval()
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(50, (2, 9)))
    expected = model.memory_stats()
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        assert model.memory_stats() == pytest.approx(expected)
    finally:
        torch.distributed.destroy_process_group()


def test_math_attention_is_the_default_and_agrees_with_sdpa():
    assert configs.ModelConfig().attention == "math"  # the official code's default (use_flash off)
    math_model, sdpa_model = tiny_model().eval(), tiny_model(attention="sdpa").eval()
    x = torch.randint(50, (2, 16))
    # Two fp32 computations (eps 1.2e-7) of scores over d_head products and sums over <= 16 weights, in
    # three layers: they differ by about 1e-7 (logits of order 0.5); 1e-5 leaves a wide margin.
    torch.testing.assert_close(math_model(x)[0], sdpa_model(x)[0], rtol=1e-5, atol=1e-5)
