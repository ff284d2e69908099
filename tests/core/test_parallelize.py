"""Activation checkpointing and FSDP2 (languini/parallelize.py).

One process: a count made in a forward is not made again in its recomputation (that checkpointed blocks give every
project the same loss and gradients is tests/core/test_contract.py's, what they keep
tests/core/test_bench_activation_memory.py's). Several processes (gloo): FSDP2 holds 1/W of
each dense weight per process and gives every project the mean gradient; a run saved with FSDP on 2 processes
continues on 1 and on 4 (and one saved by one process continues with FSDP on 2) with the losses of the
uninterrupted run; FSDP with activation checkpointing composes with split memory tables (shared by two layers,
Meta's Memory+ recipe) and a shared table left whole (the losses of one process), and with experts split over
processes (the losses of DDP on as many).
"""
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from languini import experiment, parallelize
from languini.stop import EXIT_UNFINISHED
from projects.gpt import configs as gpt_configs
from projects.gpt.model import Model as GPT
from projects.pkm_gpt import configs as pkm_configs
from projects.pkm_gpt.model import Model as PKM
from projects.switch_gpt import configs as switch_configs
from projects.switch_gpt.model import Model as Switch
from tests.distributed import run_on_ranks
from tests.torchrun import torchrun, train_losses


def _loss(model, x):
    """The cross-entropy of a forward and its auxiliary losses."""
    logits, _, *aux = model(x[:, :-1], None)
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()) + sum(aux[0].values() if aux else [])


def test_a_forward_count_is_not_counted_again_in_its_recomputation():
    cfg = switch_configs.get("cpu", seq_len=32)
    torch.manual_seed(0)
    plain = Switch(cfg)
    checkpointed = Switch(cfg)
    checkpointed.load_state_dict(plain.state_dict())
    parallelize.checkpoint_activations(checkpointed)
    x = torch.randint(0, cfg.vocab_size, (2, 33))
    for model in (plain, checkpointed):
        model.train()
        _loss(model, x).backward()
    counts = [[b.train_counts.clone() for b in m.modules() if hasattr(b, "train_counts")]
              for m in (plain, checkpointed)]
    assert counts[0] and all(c.sum() > 0 for c in counts[0])
    for a, b in zip(*counts, strict=True):
        assert torch.equal(a, b)


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ValueError, match="no `blocks`"):
        parallelize.checkpoint_activations(nn.Linear(2, 2))


class _Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(2, 2)])

    def after_step(self, hidden, targets):
        pass


def test_fsdp_refuses_a_model_that_changes_its_weights_after_a_step():
    with pytest.raises(ValueError, match="after-step hook"):
        parallelize.fully_shard_dense(_Hooked(), 2, torch.device("cpu"))


def _shard_and_count(rank, world_size, share_memory):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    if share_memory is None:
        model = GPT(gpt_configs.get("cpu", n_layers=3))
    else:
        model = PKM(pkm_configs.get("cpu", memory_layers="0,1", share_memory=share_memory))
    whole = sum(p.numel() for p in model.parameters())
    parallelize.fully_shard_dense(model, world_size, torch.device("cpu"))
    local = sum(p.to_local().numel() for p in model.parameters())
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert whole / world_size <= local <= whole / world_size + 64 * len(list(model.parameters()))
    units = [isinstance(b, FSDPModule) for b in model.blocks]
    # a table read by both blocks belongs to one unit: the root's, not either block's
    assert units == ([False, False] if share_memory else [True] * len(model.blocks)), units
    x = torch.randint(0, 2048, (2, 16))
    model(x, None)[0].sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("share_memory", [None, False, True], ids=["gpt", "pkm_two_tables", "pkm_shared_table"])
def test_fsdp_holds_a_part_of_every_dense_weight(share_memory):
    run_on_ranks(_shard_and_count, 2, share_memory)


def _every_project_sharded(rank, world_size, projects):
    from torch.distributed.tensor import DTensor

    from tests.core.test_contract import cpu_model, tokens

    for project in projects:
        plain, sharded = cpu_model(project).train(), cpu_model(project).train()
        parallelize.fully_shard_dense(sharded, world_size, torch.device("cpu"))
        xs = [tokens(plain, seed=r, length=33) for r in range(world_size)]
        for x in xs:  # the mean gradient over the processes' batches, on this process alone
            (_loss(plain, x) / world_size).backward()
        _loss(sharded, xs[rank]).backward()
        for (name, p), q in zip(sharded.named_parameters(), plain.parameters(), strict=True):
            assert isinstance(p, DTensor), f"{project}: {name} is not sharded"
            if q.grad is None:  # a weight this loss does not reach (one only a later segment's memory uses)
                assert p.grad is None or not p.grad.full_tensor().any(), f"{project}: {name}"
                continue
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-4, atol=1e-6 * q.grad.abs().max().item(),
                                       msg=f"{project}: {name}")


def test_fsdp_gives_every_project_the_mean_gradient_over_the_processes():
    from tests.core.test_contract import PROJECTS

    run_on_ranks(_every_project_sharded, 2, PROJECTS, timeout=300)


TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "2", "--seq_len", "32", "--batch_size", "4",
        "--log_every", "1", "--eval_max_batches", "1", "--slow_eval_max_windows", "1", "--run_name", "r"]


def _close(a, b):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (step, x), (_, y) in zip(a, b):
        # fp32 losses near 7.6 (a unit in the last place: 4.8e-7); the processes sum their parts in another order
        assert x == pytest.approx(y, abs=1e-5), f"step {step}"


@pytest.mark.slow
def test_fsdp_saved_on_two_processes_continues_on_one_and_on_four_and_back(default_corpus_root, tmp_path):
    from projects.gpt import configs

    common = TINY + ["--max_steps", "4", "--eval_every", "4", "--data_root", str(default_corpus_root)]
    split = tmp_path / "split"
    stopped = torchrun("projects/gpt/train.py", [*common, "--fsdp", "true", "--stop_at_step", "2", "--out_dir",
                                                 str(split)], 2)
    assert stopped.returncode == 1 and "Continue with the same command" in stopped.stdout, stopped.stderr[-3000:]
    assert (split / "r" / "checkpoint_shards" / "step").read_text() == "2"
    shutil.copytree(split, tmp_path / "four")
    four = torchrun("projects/gpt/train.py", [*common, "--fsdp", "true", "--resume", "true", "--out_dir",
                                              str(tmp_path / "four")], 4)
    assert four.returncode == 0, four.stderr[-3000:]
    experiment.main("gpt", configs, GPT, common + ["--fsdp", "true", "--resume", "true", "--out_dir", str(split)])
    experiment.main("gpt", configs, GPT, common + ["--out_dir", str(tmp_path / "one")])
    # and the other way: saved whole by one process, continued with FSDP on 2
    with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
        experiment.main("gpt", configs, GPT, common + ["--stop_at_step", "2", "--out_dir", str(tmp_path / "whole")])
    two = torchrun("projects/gpt/train.py", [*common, "--fsdp", "true", "--resume", "true", "--out_dir",
                                             str(tmp_path / "whole")], 2)
    assert two.returncode == 0, two.stderr[-3000:]
    one = train_losses(tmp_path / "one" / "r")
    assert [s for s, _ in one] == [1, 2, 3, 4]
    for run in (split, tmp_path / "four", tmp_path / "whole"):
        _close(train_losses(run / "r"), one)


COMPOSED = {
    # Memory+: one gated table read by both blocks, split over the 2 processes, the rest sharded by FSDP; two
    # micro-batches, the first without a gradient exchange
    "lram_gpt": ["--memory_layers", "0,1", "--share_memory", "true", "--memory_gate", "silu", "--memory_shards", "2",
                 "--micro_batches", "2"],
    # a shared table that is not split: FSDP keeps it in the root's unit
    "pkm_gpt": ["--memory_layers", "0,1", "--share_memory", "true"],
    # compared with DDP on the same 2 processes: each process's load-balancing loss is of its own tokens, so the
    # run on one process differs (5e-5 at step 2 here) whatever shards the dense weights
    "switch_gpt": ["--expert_parallel", "2", "--capacity_factor", "8"],
}
AGAINST_DDP = {"switch_gpt"}


@pytest.mark.slow
@pytest.mark.parametrize("project", sorted(COMPOSED))
def test_fsdp_and_activation_checkpointing_compose_with_split_parameters(project, default_corpus_root, tmp_path):
    import importlib

    configs = importlib.import_module(f"projects.{project}.configs")
    model = importlib.import_module(f"projects.{project}.model").Model
    common = TINY + ["--max_steps", "4", "--eval_every", "4", "--lr", "3e-3", *COMPOSED[project], "--data_root",
                     str(default_corpus_root)]
    split = torchrun(f"projects/{project}/train.py", [*common, "--fsdp", "true", "--activation_checkpointing", "true",
                                                      "--out_dir", str(tmp_path / "split")], 2)
    assert split.returncode == 0, split.stderr[-3000:]
    if project in AGAINST_DDP:
        ddp = torchrun(f"projects/{project}/train.py", [*common, "--out_dir", str(tmp_path / "one")], 2)
        assert ddp.returncode == 0, ddp.stderr[-3000:]
    else:
        experiment.main(project, configs, model, common + ["--out_dir", str(tmp_path / "one")])
    _close(train_losses(tmp_path / "split" / "r"), train_losses(tmp_path / "one" / "r"))

