"""languini/model_parallel.py and the model-parallel part of languini/checkpoint.py: the same initial numbers on
every layout, layout fields left out of fingerprints and checks, a group size the run cannot hold refused, and on
2 processes (gloo): the all-to-all and the row gather with uneven counts and their gradients, evaluation in
lockstep (padding, never an empty batch), and checkpoints moving between layouts (a whole checkpoint cut into
parts on 2 processes; parts saved on 2 processes read back whole on 1)."""
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from languini import checkpoint, model_parallel, throughput
from languini.books import PAD
from languini.memory_layers import sharded_bag
from projects.gpt import configs as gpt_configs
from projects.lram_gpt import configs as lram_configs
from tests.distributed import run_on_ranks

FULL = (6, 4)  # the toy table: 6 rows of 4 columns, 2 columns per process


def fake_group(size, rank):
    return model_parallel.ShardGroup(size, rank)


@pytest.mark.parametrize("dim", [0, 1])
def test_initial_numbers_do_not_depend_on_the_layout(monkeypatch, dim):
    monkeypatch.setattr(model_parallel, "INIT_BLOCK_ELEMENTS", 8)  # blocks of 2 rows of 4: three blocks
    fill = lambda t: nn.init.normal_(t)  # noqa: E731
    torch.manual_seed(0)
    whole = model_parallel.parameter(FULL, model_parallel.WHOLE, dim)
    model_parallel.init_(whole, fill)
    for rank in range(2):
        torch.manual_seed(0)
        part = model_parallel.parameter(FULL, fake_group(2, rank), dim)
        model_parallel.init_(part, fill)
        assert torch.equal(part, whole.narrow(dim, 2 * rank if dim == 1 else 3 * rank, part.shape[dim]))
    monkeypatch.setattr(model_parallel, "INIT_BLOCK_ELEMENTS", 2 ** 26)
    torch.manual_seed(0)
    one_block = model_parallel.parameter(FULL, model_parallel.WHOLE, dim)
    model_parallel.init_(one_block, fill)  # a whole tensor of one block: filled in place, as nn.init alone does
    torch.manual_seed(0)
    assert torch.equal(one_block, nn.init.normal_(torch.empty(FULL)))


def test_a_meta_parameter_is_left_alone(monkeypatch):
    """A meta model (parameter counts) has nothing to draw: drawing its blocks took minutes for large PKM tables."""
    monkeypatch.setattr(model_parallel, "INIT_BLOCK_ELEMENTS", 8)
    with torch.device("meta"):
        param = model_parallel.parameter(FULL, model_parallel.WHOLE, 0)
    model_parallel.init_(param, lambda t: pytest.fail("fill called on a meta tensor"))
    assert param.is_meta


def test_parameter_counts_whole_tensors_and_refuses_uneven_splits():
    module = nn.Module()
    module.table = model_parallel.parameter(FULL, fake_group(2, 1), 1)
    module.other = nn.Parameter(torch.zeros(3))
    assert module.table.shape == (6, 2) and model_parallel.parameter_count(module) == 24 + 3
    assert model_parallel.ddp_ignored(module) == ["table"] and model_parallel.collective_forward(module)
    module.reader = nn.Module()
    module.reader.table = module.table  # one table read by two layers (--share_memory): DDP must skip both names
    assert model_parallel.ddp_ignored(module) == ["table", "reader.table"]
    assert model_parallel.parameter_count(module) == 24 + 3
    with pytest.raises(ValueError, match="value width .5. must be a multiple of the 2 shards"):
        model_parallel.parameter((6, 5), fake_group(2, 0), 1, what="the value width")


def test_layout_fields_leave_fingerprints_and_checks_alone():
    cfg, split = lram_configs.get("cpu"), lram_configs.get("cpu", memory_shards=2)
    assert throughput.model_fingerprint(cfg) == throughput.model_fingerprint(split)
    assert throughput.model_flags(split, cfg) == ""
    assert model_parallel.same_model(dataclasses.asdict(split), cfg)
    assert not model_parallel.same_model(dataclasses.asdict(lram_configs.get("cpu", memory_gate="silu")), cfg)


def test_a_config_saved_before_a_field_was_added_is_the_same_model_at_that_fields_default():
    cfg = gpt_configs.get("cpu")
    saved = dataclasses.asdict(cfg)
    del saved["tie_embeddings"]  # a run saved before --tie_embeddings existed: untied, as the default
    assert model_parallel.same_model(saved, cfg)
    assert not model_parallel.same_model(saved, gpt_configs.get("cpu", tie_embeddings=True))


def test_a_group_size_the_run_cannot_hold_is_refused(tmp_path):
    assert model_parallel.shard_group(2, "--memory_shards") is model_parallel.WHOLE  # one process: whole tensors
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="--memory_shards 2 splits over groups of 2 processes, but the run has 1"):
            model_parallel.shard_group(2, "--memory_shards")
        with model_parallel.single_process():
            assert model_parallel.shard_group(2, "--memory_shards") is model_parallel.WHOLE
    finally:
        dist.destroy_process_group()


class Toy(nn.Module):
    """A table split by columns, read by sharded_bag, and a copied scale."""

    def __init__(self, shards):
        super().__init__()
        self.table = model_parallel.parameter(FULL, shards, 1)
        self.scale = nn.Parameter(torch.tensor(2.0))
        model_parallel.init_(self.table, lambda t: t.copy_(torch.arange(24.0).view(FULL)))

    def forward(self, index, weight):
        bag = lambda i, w, t: F.embedding_bag(i, t, per_sample_weights=w, mode="sum")  # noqa: E731
        return sharded_bag(index, weight, self.table, bag) * self.scale


def toy_state(model):
    """A trainer-like state after one Adam step on a fixed gradient."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    full_grad = torch.linspace(-1, 1, 24).view(FULL)
    s = model_parallel.sharding(model.table)
    model.table.grad = model_parallel.local_part(full_grad, s) if s else full_grad
    model.scale.grad = torch.tensor(0.5)
    optimizer.step()
    return optimizer, {"model": model.state_dict(), "optimizers": [optimizer.state_dict()], "step": 3,
                       "model_config": {}}


def distributed_checks(rank, world_size, whole_dir, split_dir):
    shards = model_parallel.shard_group(world_size, "--test")
    # the all-to-all with uneven counts, and its backward
    x = torch.arange(3.0 * (rank + 1)).requires_grad_()  # rank 0 sends 1 + 2 rows, rank 1 sends 2 + 4
    send = [1, 2] if rank == 0 else [2, 4]
    y = model_parallel.all_to_all(x, send, model_parallel.exchange_counts(torch.tensor(send), shards.group),
                                  shards.group)
    assert y.tolist() == ([0.0, 0.0, 1.0] if rank == 0 else [1.0, 2.0, 2.0, 3.0, 4.0, 5.0])
    (y * (rank + 1)).sum().backward()  # each row's gradient is the factor of the process it went to
    assert x.grad.tolist() == ([1.0, 2.0, 2.0] if rank == 0 else [1.0, 1.0, 2.0, 2.0, 2.0, 2.0])

    # the row gather: every process's rows in order; the backward sums over the processes
    rows = torch.full((rank + 1, 2), float(rank)).requires_grad_()
    gathered, counts = model_parallel.gather_rows(rows, shards)
    assert counts == [1, 2] and gathered[:, 0].tolist() == [0.0, 1.0, 1.0]
    gathered.sum().backward()
    assert rows.grad.eq(world_size).all()

    # the split read: all columns of this process's bags
    toy = Toy(shards)
    index, weight = torch.tensor([[rank, 5]]), torch.tensor([[1.0, 0.5]])
    expected = 2 * (torch.arange(24.0).view(FULL)[rank] + 0.5 * torch.arange(24.0).view(FULL)[5])
    torch.testing.assert_close(toy(index, weight), expected[None])

    # evaluation in lockstep: 3 batches here and 1 there, then 2 here and none there; both processes run as many
    # forward passes, the extra ones padding of the last batch's shape (one position without one), nothing scored
    batch = (torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))
    for counts, padding_shape in (((3, 1), (2, 4)), ((2, 0), (1, 1))):
        seen = list(model_parallel.lockstep([batch] * counts[rank], toy, torch.device("cpu")))
        assert len(seen) == max(counts) and all(b is batch for b in seen[:counts[rank]])
        for x, y, mask in seen[counts[rank]:]:
            assert x.shape == y.shape == mask.shape == padding_shape
            assert x.eq(PAD).all() and y.eq(PAD).all() and mask.dtype == torch.bool and not mask.any()

    # a whole checkpoint (saved on one process) cut into this process's parts
    ckpt, _ = checkpoint.load(whole_dir, torch.device("cpu"), merge_shards=False)
    toy = Toy(shards)
    optimizer = torch.optim.Adam(toy.parameters(), lr=0.1)
    assert checkpoint.prepare_restore(ckpt, toy, [optimizer]) == []
    toy.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizers"][0])
    whole_toy = Toy(model_parallel.WHOLE)
    whole_optimizer, _ = toy_state(whole_toy)
    part = model_parallel.sharding(toy.table)
    assert torch.equal(toy.table, model_parallel.local_part(whole_toy.table.detach(), part))
    assert torch.equal(optimizer.state[toy.table]["exp_avg_sq"],
                       model_parallel.local_part(whole_optimizer.state[whole_toy.table]["exp_avg_sq"], part))

    # the parts saved by both processes (the previous folder kept), for the single process to read whole
    toy = Toy(shards)
    optimizer, state = toy_state(toy)
    parts = checkpoint.move_to_shards(state, toy, [optimizer])
    assert sorted(parts) == ["model/table", "optimizer0/table/exp_avg", "optimizer0/table/exp_avg_sq"]
    assert torch.is_tensor(optimizer.state[toy.table]["exp_avg"])  # the live state is untouched
    for step in (2, 3):
        checkpoint.save_shards(split_dir, step, parts, main=rank == 0)
    if rank == 0:
        checkpoint.save(split_dir, state)


def test_two_processes_talk_and_checkpoints_change_layout(tmp_path):
    whole_dir, split_dir = tmp_path / "whole", tmp_path / "split"
    whole_dir.mkdir()
    split_dir.mkdir()
    whole = Toy(model_parallel.WHOLE)
    whole_optimizer, state = toy_state(whole)
    checkpoint.save(whole_dir, state)
    run_on_ranks(distributed_checks, 2, whole_dir, split_dir)

    assert (split_dir / "checkpoint_shards_previous" / "step").read_text() == "2"
    # a tool on one process: the parts read back as whole tensors (stored numbers, no arithmetic: the same bits)
    merged, _ = checkpoint.load(split_dir, torch.device("cpu"))
    assert torch.equal(merged["model"]["table"], whole.table.detach())
    assert torch.equal(merged["optimizers"][0]["state"][0]["exp_avg"], whole_optimizer.state[whole.table]["exp_avg"])
    # the trainer's path on one process: the live whole tensors filled from the parts
    ckpt, _ = checkpoint.load(split_dir, torch.device("cpu"), merge_shards=False)
    assert isinstance(ckpt["model"]["table"], checkpoint.InShards)
    toy = Toy(model_parallel.WHOLE)
    optimizer = torch.optim.Adam(toy.parameters(), lr=0.1)
    keys = checkpoint.prepare_restore(ckpt, toy, [optimizer])
    toy.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizers"][0])
    checkpoint.restore_shards(split_dir, ckpt["step"], keys, toy, [optimizer])
    assert torch.equal(toy.table, whole.table) and torch.equal(toy.scale, whole.scale)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(optimizer.state[toy.table][key], whole_optimizer.state[whole.table][key])
    with pytest.raises(checkpoint.CheckpointError, match="No model-parallel tensors for step 4"):
        checkpoint.shards_folder(split_dir, 4)
