"""Carried states stored in a smaller dtype (model_contract.checkpoint_state_dtype), e.g. the Compressive
Transformer's memories in bf16: what the files hold, what a resume continues with, and that models without the
attribute still resume bit-exactly."""
import json

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from languini import checkpoint, model_contract
from languini.experiment import main
from languini.stop import EXIT_UNFINISHED
from languini.trainer import Trainer
from projects.compressive import configs
from projects.compressive.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "2", "--n_heads", "2", "--d_head", "16", "--seq_len", "16",
        "--mem_len", "16", "--cmem_len", "8", "--batch_size", "4", "--micro_batches", "2", "--eval_batch_size", "4",
        "--eval_max_batches", "1", "--slow_eval_max_windows", "1", "--max_steps", "4", "--log_every", "1",
        "--run_name", "r"]


class BF16StateModel(Model):
    """The Compressive Transformer with its memories stored in bf16 by checkpoints."""
    checkpoint_state_dtype = torch.bfloat16


class ExactStateModel(Model):
    """The Compressive Transformer with its memories stored as they are (whatever the project's Model declares)."""
    checkpoint_state_dtype = None


def nested_states(seed=0):
    """Per micro-batch: None (no state yet), or per layer (fp32 memory, fp64 compressed memory) and an int step
    counter; sizes large enough that the file's fixed overhead is small."""
    g = torch.Generator().manual_seed(seed)
    layer = (torch.randn(4, 256, 64, generator=g), torch.randn(4, 32, 64, generator=g, dtype=torch.float64))
    return [None, [layer, {"count": torch.arange(5), "memory": torch.randn(4, 128, 64, generator=g)}]]


def floating_leaves(states):
    return [leaf for leaf in tree_flatten(states)[0] if torch.is_tensor(leaf) and leaf.is_floating_point()]


def test_rank_states_are_stored_in_bf16_and_restored_to_their_dtypes_rounded(tmp_path):
    states = nested_states()
    checkpoint.save_rank_states(tmp_path, 0, 7, states, dtype=torch.bfloat16)
    saved = torch.load(tmp_path / "states_rank0.pt", weights_only=False)
    assert [t.dtype for t in floating_leaves(saved["states"])] == [torch.bfloat16] * 3
    assert saved["states"][0] is None and torch.equal(saved["states"][1][1]["count"], torch.arange(5))
    loaded = checkpoint.load_rank_states(tmp_path, 0, 7, torch.device("cpu"))
    assert loaded[0] is None and loaded[1][1]["count"].dtype == torch.int64
    for got, original in zip(floating_leaves(loaded), floating_leaves(states), strict=True):
        assert got.dtype == original.dtype
        # bf16 -> fp32/fp64 is exact: the restored values are the originals rounded once to bf16
        assert torch.equal(got, original.to(torch.bfloat16).to(original.dtype))


def test_bf16_rank_states_take_about_half_of_fp32(tmp_path):
    states = [(torch.randn(4, 256, 64), torch.randn(4, 128, 64))]
    checkpoint.save_rank_states(tmp_path, 0, 1, states)
    checkpoint.save_rank_states(tmp_path, 1, 1, states, dtype=torch.bfloat16)
    fp32, bf16 = ((tmp_path / f"states_rank{r}.pt").stat().st_size for r in (0, 1))
    assert fp32 > 4 * 4 * 384 * 64  # the tensors' bytes, and a little more
    assert 0.49 < bf16 / fp32 < 0.52


def test_states_are_kept_as_they_are_without_a_dtype(tmp_path):
    states = nested_states()
    packed, dtypes = checkpoint.pack_states(states, None)
    assert packed is states and dtypes is None
    checkpoint.save_rank_states(tmp_path, 0, 1, states)
    loaded = checkpoint.load_rank_states(tmp_path, 0, 1, torch.device("cpu"))
    for got, original in zip(floating_leaves(loaded), floating_leaves(states), strict=True):
        assert got.dtype == original.dtype and torch.equal(got, original)  # a file round trip copies bits


@pytest.mark.parametrize("value", [torch.int8, "bfloat16", 16])
def test_a_checkpoint_state_dtype_that_is_no_floating_dtype_names_the_contract(value):
    class Declared(Model):
        checkpoint_state_dtype = value

    with pytest.raises(model_contract.ContractError, match="floating torch dtype.*model_contract.py"):
        model_contract.checkpoint_state_dtype(Declared)
    assert model_contract.checkpoint_state_dtype(torch.nn.Module) is None  # the default: as they are


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]


class RecordingTrainer(Trainer):
    """Keeps the carried states a resumed run continues with."""
    resumed_states = []

    def load_state_dict(self, ckpt):
        super().load_state_dict(ckpt)
        # a copy: training replaces the states in self.states
        RecordingTrainer.resumed_states.append(tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, self.states))


def test_compressive_memories_resume_rounded_to_bf16(default_corpus_root, tmp_path, monkeypatch):
    """The plain model's run checkpoints at steps 2 and 4 with its memories as they are; the same run of the bf16
    model stops at step 2, holds them in bf16 (a smaller file), and resumes with them rounded."""
    monkeypatch.setattr(RecordingTrainer, "resumed_states", [])
    common = TINY + ["--data_root", str(default_corpus_root)]
    whole = tmp_path / "whole" / "r"
    main("compressive", configs, ExactStateModel, common + ["--out_dir", str(tmp_path / "whole"),
                                                            "--checkpoint_every", "2"])
    before = torch.load(whole / "checkpoint_previous.pt", weights_only=False)  # the fp32 memories of step 2
    assert before["step"] == 2 and before["state_dtypes"] is None

    split = tmp_path / "split" / "r"
    args = common + ["--out_dir", str(tmp_path / "split")]
    with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
        main("compressive", configs, BF16StateModel, args + ["--stop_at_step", "2"])
    saved = torch.load(split / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 2
    fp32_memories, bf16_memories = floating_leaves(before["states"]), floating_leaves(saved["states"])
    assert len(fp32_memories) == 2 * 2 * 2  # micro-batches x layers x (memory, compressed memory)
    assert all(t.dtype == torch.float32 for t in fp32_memories)
    assert all(t.dtype == torch.bfloat16 for t in bf16_memories)
    state_bytes = sum(t.numel() * 4 for t in fp32_memories)
    # the checkpoint is smaller by half the fp32 memories' bytes, less the few hundred bytes that record their
    # dtypes (more where fp32 memories are views whose whole storage torch.save writes)
    assert (whole / "checkpoint_previous.pt").stat().st_size - (split / "checkpoint.pt").stat().st_size \
        >= 0.45 * state_bytes

    main("compressive", configs, BF16StateModel, args + ["--resume", "true"], trainer_cls=RecordingTrainer)
    [resumed] = RecordingTrainer.resumed_states
    for got, original in zip(floating_leaves(resumed), fp32_memories, strict=True):
        assert got.dtype == torch.float32 and got.shape == original.shape
        assert torch.equal(got, original.to(torch.bfloat16).float())  # rounded once; bf16 -> fp32 is exact
    assert any(not torch.equal(got, original) for got, original in zip(floating_leaves(resumed), fp32_memories))
    # before the resume the runs are the same computation; after it, their losses differ by the rounding alone
    # (relative 2^-9 in the memories; losses near ln 2048)
    split_losses, whole_losses = losses(split), losses(whole)
    assert split_losses[:2] == whole_losses[:2] and [s for s, _ in split_losses] == [1, 2, 3, 4]
    for (_, a), (_, b) in zip(split_losses[2:], whole_losses[2:]):
        assert a == pytest.approx(b, rel=1e-2)


def test_compressive_without_the_attribute_resumes_bit_exactly(default_corpus_root, tmp_path):
    common = TINY + ["--data_root", str(default_corpus_root), "--eval_every", "2"]
    main("compressive", configs, ExactStateModel, common + ["--out_dir", str(tmp_path / "whole")])
    split = common + ["--out_dir", str(tmp_path / "split")]
    with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
        main("compressive", configs, ExactStateModel, split + ["--stop_at_step", "3"])
    main("compressive", configs, ExactStateModel, split + ["--resume", "true"])
    assert losses(tmp_path / "split" / "r") == losses(tmp_path / "whole" / "r")
