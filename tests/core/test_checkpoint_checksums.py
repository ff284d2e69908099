"""Every file of a checkpoint is checked against its sha256 before it is read: a shard with zeros written into it,
a missing .metadata or a changed checkpoint.pt makes the run continue from the previous checkpoint, with a
warning naming the file; with no intact checkpoint left, one error names both problems. The shards are saved and
read back on 2 processes (gloo)."""
import shutil

import pytest
import torch

from languini import checkpoint, model_parallel
from tests.core.test_model_parallel import FULL, Toy
from tests.distributed import run_on_ranks

CPU = torch.device("cpu")
ZEROS = bytes(64 * 1024)


def whole_table(step):
    """The toy table saved at `step`: 0..23 times the step, 2 of its 4 columns on each process."""
    return torch.arange(24.0).view(FULL) * step


def save_steps_2_and_3(rank, world_size, run_dir):
    toy = Toy(model_parallel.shard_group(world_size, "--test"))
    for step in (2, 3):
        with torch.no_grad():
            toy.table.copy_(whole_table(step)[:, 2 * rank:2 * rank + 2])
        state = {"model": toy.state_dict(), "optimizers": [], "step": step, "model_config": {}}
        parts = checkpoint.move_to_shards(state, toy, [])
        checkpoint.save_shards(run_dir, step, parts, main=rank == 0)
        if rank == 0:
            checkpoint.save(run_dir, state)


def resume_step_2(rank, world_size, run_dir, warning):
    said = []
    ckpt, path = checkpoint.load(run_dir, CPU, warn=said.append, merge_shards=False)
    assert path.name == "checkpoint_previous.pt" and ckpt["step"] == 2
    assert len(said) == 1 and warning in said[0] and "previous checkpoint" in said[0], said
    toy = Toy(model_parallel.shard_group(world_size, "--test"))
    keys = checkpoint.prepare_restore(ckpt, toy, [])
    toy.load_state_dict(ckpt["model"])
    checkpoint.restore_shards(run_dir, ckpt["step"], keys, toy, [])
    assert torch.equal(toy.table.detach(), whole_table(2)[:, 2 * rank:2 * rank + 2])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run folder whose latest checkpoint (step 3) and previous one (step 2) were saved on 2 processes."""
    run_dir = tmp_path_factory.mktemp("saved")
    run_on_ranks(save_steps_2_and_3, 2, run_dir)
    return run_dir


@pytest.fixture
def run_dir(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "run")


def write_zeros(path, offset=0):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(ZEROS)


def test_an_intact_checkpoint_is_the_latest(run_dir):
    ckpt, path = checkpoint.load(run_dir, CPU, warn=pytest.fail)
    assert path.name == "checkpoint.pt" and torch.equal(ckpt["model"]["table"], whole_table(3))


def test_a_shard_with_zeros_written_into_it_falls_back_to_the_previous_checkpoint(run_dir):
    write_zeros(run_dir / "checkpoint_shards" / "__1_0.distcp")  # before the checksums: read without complaint
    run_on_ranks(resume_step_2, 2, run_dir, "checkpoint_shards/__1_0.distcp does not match its checksum")
    ckpt, _ = checkpoint.load(run_dir, CPU, warn=lambda _: None)  # a tool on one process: the whole table
    assert ckpt["step"] == 2 and torch.equal(ckpt["model"]["table"], whole_table(2))


def test_a_missing_metadata_falls_back_and_with_no_intact_checkpoint_left_is_one_clear_error(run_dir):
    (run_dir / "checkpoint_shards" / ".metadata").unlink()  # before the checksums: a raw FileNotFoundError
    said = []
    ckpt, path = checkpoint.load(run_dir, CPU, warn=said.append)
    assert path.name == "checkpoint_previous.pt" and torch.equal(ckpt["model"]["table"], whole_table(2))
    assert "checkpoint_shards/.metadata is missing" in said[0]
    shard = run_dir / "checkpoint_shards_previous" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    with pytest.raises(checkpoint.CheckpointError, match="Cannot resume .*checkpoint_shards/.metadata is missing, and "
                                                         "checkpoint_shards_previous/__0_0.distcp does not match"):
        checkpoint.load(run_dir, CPU)


def test_zeros_in_a_tensor_of_checkpoint_pt_or_of_a_process_states_are_detected(tmp_path):
    """torch.load reads zeros written into a large tensor of a torch.save file without complaint (its zip records
    are not checked): the checksums catch them."""
    big = torch.arange(2.0 ** 20)  # 4 MiB
    for step in (1, 2):
        checkpoint.save(tmp_path, {"step": step, "tensor": big * step})
        checkpoint.save_rank_states(tmp_path, 0, step, [big * step])
    write_zeros(tmp_path / "checkpoint.pt", 2 ** 21)
    write_zeros(tmp_path / "states_rank0.pt", 2 ** 21)
    said = []
    ckpt, path = checkpoint.load(tmp_path, CPU, warn=said.append)
    assert path.name == "checkpoint_previous.pt" and torch.equal(ckpt["tensor"], big)
    assert "checkpoint.pt does not match its checksum in checkpoint.sha256.json" in said[0]
    assert torch.equal(checkpoint.load_rank_states(tmp_path, 0, 1, CPU)[0], big)
    with pytest.raises(checkpoint.CheckpointError, match="states_rank0.pt does not match its checksum"):
        checkpoint.load_rank_states(tmp_path, 0, 2, CPU)


def test_the_checksums_follow_a_checkpoint_into_its_previous_place(tmp_path):
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, {"step": step})
    checkpoint.save(tmp_path, {"step": 4}, keep_previous=False)  # after a fallback: the previous one (2) kept
    ckpt, _ = checkpoint.load(tmp_path, CPU, warn=pytest.fail)
    assert ckpt["step"] == 4
    (tmp_path / "checkpoint.pt").unlink()
    ckpt, _ = checkpoint.load(tmp_path, CPU, warn=lambda _: None)
    assert ckpt["step"] == 2
