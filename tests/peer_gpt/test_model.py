"""The GPT with a PEER layer: placement, causality with each query norm, parameter counts by hand, FLOPs against the
GPT's (the configs' match), the expert tables' learning rate and init, memory statistics by hand, one end-to-end run
of the trainer, and a trainer step with row-sparse expert gradients (the model contract is
tests/core/test_contract.py's)."""

import math

import pytest
import torch

from languini import flops
from languini.books import BooksDataset
from languini.memory_stats import MemoryStats
from languini.trainer import TrainConfig, Trainer
from projects.gpt import configs as gpt_configs
from projects.gpt.model import Model as GPT
from projects.peer_gpt import configs
from projects.peer_gpt.model import MLP, Model
from projects.peer_gpt.peer import PEER
from tests.memory_gpt import (earlier_logits_unchanged, gpt_parameters, losses_on_one_batch, mlp_parameters,
                              smoke_run_results)

# 3 blocks, 4 x 4 = 16 experts of width 24, so that every test builds the model in milliseconds.
TINY = dict(vocab_size=50, seq_len=16, d_model=24, n_layers=3, n_heads=2, d_head=8, mlp_ratio=2,
            peer_heads=2, peer_k_dim=6, peer_n_keys=4, peer_knn=3)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Model(configs.ModelConfig(**{**TINY, **overrides}))


def peer_parameters(d, heads, k_dim, n_keys):
    """Query projection with bias, layer norm over heads * k_dim, one pair of n_keys sub-key sets of k_dim / 2 for
    all heads, n_keys^2 experts of a down and an up vector of width d (no biases)."""
    return d * heads * k_dim + heads * k_dim + 2 * heads * k_dim + 2 * n_keys * (k_dim // 2) + n_keys ** 2 * 2 * d


def test_peer_replaces_the_mlp_of_the_middle_block():
    model = tiny_model()
    assert [type(block.ff) for block in model.blocks] == [MLP, PEER, MLP] and model.memory is model.blocks[1].ff
    assert [type(b.ff) for b in tiny_model(memory_layers="0,2").blocks] == [PEER, MLP, PEER]
    with pytest.raises(ValueError, match="memory_layers"):
        tiny_model(memory_layers="3")


@pytest.mark.parametrize("n_layers,expected", [(12, 5), (24, 11), (4, 1), (2, 0), (1, 0), (5, 2)])
def test_default_block_is_the_papers_middle_block(n_layers, expected):
    # section 3.1: "in a 12 block transformer, we replace the FFN in block 6" (counting from 1)
    assert tiny_model(n_layers=n_layers).memory_blocks == [expected]


@pytest.mark.parametrize("query_norm,causal", [("layer", True), ("batch", False)])
def test_model_is_causal_with_the_default_query_norm(query_norm, causal):
    assert configs.ModelConfig().memory_query_norm == "layer"
    model = tiny_model(memory_query_norm=query_norm).train()
    # the paper's query BatchNorm shows that the check can fail: its batch statistics carry later tokens back
    assert earlier_logits_unchanged(model, 50) == causal


@pytest.mark.parametrize("name,readme_millions", [("cpu", None), ("mini", None), ("small", 159.5),
                                                  ("small_paper", 1717.4), ("medium", 401.0)])
def test_parameter_count_by_hand(name, readme_millions):
    cfg = configs.get(name)
    with torch.device("meta"):
        model = Model(cfg)
    d = cfg.d_model
    expected = (gpt_parameters(cfg.vocab_size, cfg.seq_len, d, cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.mlp_ratio)
                - mlp_parameters(d, cfg.mlp_ratio) + peer_parameters(d, cfg.peer_heads, cfg.peer_k_dim,
                                                                     cfg.peer_n_keys))
    assert sum(p.numel() for p in model.parameters()) == expected
    assert readme_millions is None or round(expected / 1e6, 1) == readme_millions  # as projects/peer_gpt/README.md


@pytest.mark.parametrize("name", ["mini", "tiny", "small", "medium"])
def test_experts_hold_the_parameters_of_pkm_gpts_memory(name):
    # pkm_gpt's memory: 2^16 values of width d_model; here 181^2 experts of two vectors of width d_model
    cfg = configs.get(name)
    assert 2 * cfg.peer_n_keys ** 2 / 2 ** 16 == pytest.approx(1, abs=3e-4)


def forward_flops(model_cls, cfg):
    with torch.device("meta"):
        return flops.forward_flops(model_cls(cfg), cfg.seq_len, cfg.vocab_size, "meta")


@pytest.mark.parametrize("name", ["cpu", "mini", "tiny", "small", "medium"])
def test_heads_are_the_fewest_that_match_the_gpts_forward_flops(name):
    gpt = forward_flops(GPT, gpt_configs.get(name))
    cfg = configs.get(name)
    assert cfg.peer_knn == 16 and cfg.peer_k_dim == 128  # the paper's k; our query width
    ratio = forward_flops(Model, cfg) / gpt
    fewer = forward_flops(Model, configs.get(name, peer_heads=cfg.peer_heads - 1)) / gpt
    assert fewer < 1 <= ratio < 1.02


def test_extra_flops_hold_the_experts_and_the_candidate_sums():
    # DeepSpeed sees the query projection and the half-key scores (matmuls), and on the CPU path the activation
    # (one FLOP an expert read); the experts' products and the candidate sums are extra_flops:
    # per token heads * knn^2 + 4 * heads * knn * d_model.
    counts = {}
    for knn in (2, 4):
        model = tiny_model(peer_knn=knn)
        counts[knn] = (flops.forward_flops(model, 16, 50), model.extra_flops(16))
        assert counts[knn][1] == 16 * (2 * knn * knn + 4 * 2 * knn * 24)
    assert (counts[4][0] - counts[4][1]) - (counts[2][0] - counts[2][1]) == 16 * 2 * (4 - 2)


def test_flops_on_the_meta_device_match_cpu():
    with torch.device("meta"):
        meta_model = Model(configs.ModelConfig(**TINY))
    assert flops.forward_flops(meta_model, 16, 50, "meta") == flops.forward_flops(tiny_model(), 16, 50)


@pytest.mark.parametrize("multiplier,sparse", [(1.0, False), (3.0, True)])
def test_optimizer_groups_give_the_experts_their_learning_rate(multiplier, sparse):
    model = tiny_model(expert_lr_multiplier=multiplier, sparse_experts=sparse)
    groups = model.optimizer_groups(2e-4)
    experts = [g for g in groups if any(p is model.memory.down for p in g["params"])]
    assert len(experts) == 1 and experts[0]["params"] == [model.memory.down, model.memory.up]
    assert experts[0]["lr"] == pytest.approx(multiplier * 2e-4)
    assert experts[0].get("sparse", False) == sparse and model.memory.sparse_experts == sparse
    assert all(g["lr"] == 2e-4 and "sparse" not in g for g in groups if g is not experts[0])
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # each parameter exactly once


def test_experts_are_initialised_as_neurons_of_the_mlp_they_replace():
    model = tiny_model(d_model=64, peer_n_keys=40, n_layers=8, n_heads=4, d_head=16)
    memory = model.memory
    # u_i as a row of the MLP's first layer (std 0.02), v_i as its residual write (0.02 / sqrt(2 L))
    assert memory.down.std().item() == pytest.approx(0.02, rel=0.05)
    assert memory.up.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    bound = 1 / math.sqrt(TINY["peer_k_dim"] // 2)  # XLM's sub-keys, not the GPT's init
    assert memory.sub_keys.abs().max().item() <= bound
    assert memory.sub_keys.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


def test_memory_stats_after_a_forward():
    model = tiny_model().eval()
    assert model.memory.stats is None  # nothing is collected during training
    with pytest.raises(ValueError, match="reset_memory_stats"):
        model.memory_stats()
    inputs = []
    model.memory.register_forward_hook(lambda module, args, out: inputs.append(args[0]))
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(50, (2, 9)))
        indices, weights = model.memory.lookup(inputs[0])
    stats = model.memory_stats()
    # the paper's expert usage and unevenness (section 3.3): z'_i = sum of expert i's router scores over tokens
    assert stats["memory_usage"] == indices.unique().numel() / 16
    z = torch.zeros(16, dtype=torch.float64).index_add_(0, indices.flatten(), weights.flatten().double())
    z = z / z.sum()
    assert stats["kl_from_uniform"] == pytest.approx(math.log(16) + sum(p * math.log(p) for p in z.tolist() if p > 0))


def test_layers_in_several_blocks_report_their_statistics_each():
    model = tiny_model(memory_layers="0,2").eval()
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(50, (2, 9)))
    assert model.memory_stats()["layers"].keys() == {"block_0", "block_2"}


def test_trains():
    model = tiny_model()
    losses = losses_on_one_batch(model, 50)
    assert losses[-1] < 0.85 * losses[0]


def test_training_run_end_to_end(default_corpus_root, tmp_path):
    smoke_run_results("peer_gpt", configs, Model, default_corpus_root, tmp_path, configs.get("cpu").peer_n_keys ** 2)


def test_sparse_experts_trainer_step_moves_only_the_experts_read(default_corpus_root, tmp_path):
    # 16^2 = 256 experts, at most 2 sequences * 8 tokens * 2 heads * 3 reads = 96 of them read; two micro-batches
    # add up two sparse gradients before the step.
    cfg = configs.ModelConfig(**{**TINY, "vocab_size": 2048, "seq_len": 8, "peer_n_keys": 16,
                                 "sparse_experts": True})
    torch.manual_seed(0)
    trainer = Trainer(project="peer_gpt", config_name="cpu", model_cfg=cfg, model_cls=Model,
                      tcfg=TrainConfig(batch_size=2, micro_batches=2), dataset=BooksDataset(default_corpus_root, 2048),
                      bytes_per_token=torch.ones(2048), run_dir=tmp_path, total_steps=1, tokens_per_second=1.0)
    assert [type(opt) for opt in trainer.optimizers] == [torch.optim.Adam, torch.optim.SparseAdam]
    memory = trainer.model.memory
    memory.stats = MemoryStats(memory.num_experts)  # records the experts every forward reads
    before = [memory.down.detach().clone(), memory.up.detach().clone()]
    x, y = trainer.batches(0)
    assert math.isfinite(trainer.train_step(x, y))
    read = memory.stats.weight > 0
    assert 0 < read.sum() < memory.num_experts
    for table, old in zip((memory.down, memory.up), before):
        assert table.grad.layout == torch.sparse_coo
        assert torch.equal((table.detach() != old).any(dim=1), read)
