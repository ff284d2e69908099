"""ultramem_gpt's own tests: where its memories sit, their tables and output scale by hand, FLOPs against the GPT's,
the values' learning rate and a sparse trainer step (the model contract is tests/core/test_contract.py's)."""
import math

import torch

from languini.memory_stats import MemoryStats
from projects.ultramem_gpt import configs
from projects.ultramem_gpt.model import Model
from tests.core import test_contract, test_throughput


def test_the_core_tests_find_the_project():
    assert "ultramem_gpt" in test_contract.PROJECTS and "ultramem_gpt" in test_throughput.LANGUAGE_MODELS


def test_every_block_has_a_memory_beside_its_ffn_unless_chosen():
    cfg = configs.get("cpu")
    model = Model(cfg)
    assert model.memory_blocks == [0, 1] and all(b.memory is not None for b in model.blocks)
    assert model.blocks[0].mlp.fc.out_features == cfg.ffn_hidden
    one = Model(configs.get("cpu", memory_layers="1"))
    assert one.blocks[0].memory is None and one.blocks[1].memory is not None


def test_the_cpu_configs_value_tables_by_hand():
    cfg = configs.get("cpu")
    layer = Model(cfg).memories[0]
    # 32^2 values and pre-values of width 128 / 4 per block: pkm_gpt cpu's 32^2 x 128 over its 2 blocks
    assert layer.values.shape == layer.pre_values.shape == (1024, 32)
    assert cfg.n_layers * 2 * layer.values.numel() == 32 ** 2 * 128
    # keys: 2 sides x rank 2 x 32 keys x 32; core 2 x 2
    assert layer.keys.shape == (2, 2, 32, 32) and layer.core.shape == (2, 2)


def test_a_block_adds_the_ffn_and_the_memory_of_its_normalised_input():
    torch.manual_seed(0)
    model = Model(configs.get("cpu"))
    block, x = model.blocks[0], torch.randn(2, 5, 128)
    h = x + block.attn(block.ln1(x))
    expected = h + block.mlp(block.ln2(h)) + block.memory(block.ln2(h))
    torch.testing.assert_close(block(x), expected)


def test_memory_output_std_matches_the_ffn_beside_it_at_init():
    torch.manual_seed(0)
    model = Model(configs.get("cpu"))
    tokens = torch.randn(512, 128, generator=torch.Generator().manual_seed(123))  # not the rows it was matched on
    with torch.no_grad():
        for block in model.blocks:
            ratio = (block.memory(tokens).std() / block.mlp(tokens).std()).item()
            assert 0.85 < ratio < 1.15  # sampling error of a std over a few thousand numbers, and other inputs


def test_forward_flops_match_the_gpts_of_the_same_name():
    from languini import flops
    from projects.gpt import configs as gpt_configs
    from projects.gpt.model import Model as GPT

    for name in ("cpu", "mini"):  # the other sizes: README.md's table (seconds each on the meta device)
        counts = []
        for cls, cfg in ((Model, configs.get(name)), (GPT, gpt_configs.get(name))):
            with torch.device("meta"):
                counts.append(flops.forward_flops(cls(cfg), cfg.seq_len, cfg.vocab_size, "meta"))
        assert abs(counts[0] / counts[1] - 1) < 1e-3, name


def test_value_tables_train_at_their_multiplier_and_stats_are_recorded():
    cfg = configs.get("cpu")
    model = Model(cfg)
    rest, values = model.optimizer_groups(1e-3)
    assert values["lr"] == 4e-3 and rest["lr"] == 1e-3
    assert {id(p) for p in values["params"]} == {id(t) for m in model.memories for t in (m.values, m.pre_values)}
    model.reset_memory_stats()
    with torch.no_grad():
        model(torch.randint(cfg.vocab_size, (2, 16)))
    stats = model.memory_stats()["layers"]["block_0"]
    assert 0 < stats["memory_usage"] <= 1


def test_sparse_values_trainer_step_moves_only_the_values_read(default_corpus_root, tmp_path):
    from languini.books import BooksDataset
    from languini.trainer import TrainConfig, Trainer

    # 16^2 = 256 values per block, at most 2 sequences x 8 tokens x 4 reads of them; two micro-batches add up two
    # sparse gradients before the step
    cfg = configs.get("cpu", seq_len=8, n_layers=1, ultramem_n_keys=16, ultramem_knn=4, sparse_values=True)
    torch.manual_seed(0)
    trainer = Trainer(project="ultramem_gpt", config_name="cpu", model_cfg=cfg, model_cls=Model,
                      tcfg=TrainConfig(batch_size=2, micro_batches=2), dataset=BooksDataset(default_corpus_root, 2048),
                      bytes_per_token=torch.ones(2048), run_dir=tmp_path, total_steps=1, tokens_per_second=1.0)
    assert [type(opt) for opt in trainer.optimizers] == [torch.optim.Adam, torch.optim.SparseAdam]
    memory = trainer.model.memories[0]
    memory.stats = MemoryStats(memory.num_values)  # records the values every forward reads
    before = [memory.pre_values.detach().clone(), memory.values.detach().clone()]
    x, y = trainer.batches(0)
    assert math.isfinite(trainer.train_step(x, y))
    read = memory.stats.weight > 0
    assert 0 < read.sum() < memory.num_values
    for table, old in zip((memory.pre_values, memory.values), before):
        assert table.grad.layout == torch.sparse_coo
        assert torch.equal((table.detach() != old).any(dim=1), read)
