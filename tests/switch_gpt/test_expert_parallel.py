"""A Switch layer with its experts split over 2 processes (gloo), tokens sent to their expert's process and back,
against the same layer with every expert on one process (tests/split_layer.py): initial weights, outputs,
auxiliary losses, every gradient and one Adam step; top-1 and top-2 routing with tokens dropped for capacity, the
local experts run by the loop and by the grouped Triton kernel, the processes routing different numbers of tokens
(the counts are exchanged first). And whole runs under torchrun on 2 and 4 processes: the evaluation, where a
process that has run out of batches still joins every forward, equals one process's of the same checkpoint, and
the run teaches a student under torchrun (scripts/distill.py)."""
import importlib.util
import json
from dataclasses import replace

import pytest
import torch

from languini.experiment import REPO_ROOT
from projects.switch_gpt import configs
from projects.switch_gpt.model import SwitchMLP
from tests.distributed import run_on_ranks
from tests.split_layer import check_split_layer
from tests.torchrun import torchrun

CONFIG = configs.ModelConfig(d_model=16, mlp_ratio=2, n_experts=4, capacity_factor=1.0, router_z_coef=1e-3)
TOKENS = (12, 7)  # capacity 3 and 1 per expert at top-1: tokens are dropped
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # fp32 GEMMs of 16 and 32 terms in other row orders
# One window per split in the slow eval (a second process has none) and one batch in the fast eval (the 3 books of
# a split are 3 streams: on 4 processes the fourth has none).
RUN = ["--config", "cpu", "--d_model", "32", "--n_layers", "2", "--seq_len", "32", "--batch_size", "4",
       "--max_steps", "2", "--eval_every", "2", "--eval_max_batches", "1", "--slow_eval_max_windows", "1"]
COUNTED = ("scored_tokens", "scored_bytes", "scored_chars")


def tokens(rank: int):
    generator = torch.Generator().manual_seed(300 + rank)
    return (torch.randn(TOKENS[rank], CONFIG.d_model, generator=generator),
            torch.randn(TOKENS[rank], CONFIG.d_model, generator=generator))


def check(rank: int, world_size: int) -> None:
    for impl in ("naive", "triton"):
        for routing in ("top1", "top2"):
            def build(shards):
                torch.manual_seed(0)
                layer = SwitchMLP(replace(CONFIG, routing=routing, experts_impl=impl, expert_parallel=shards.size))
                layer.init_weights()
                return layer

            check_split_layer(rank, world_size, build, tokens, TOLERANCE, f"{routing}, {impl}")
    layer = SwitchMLP(replace(CONFIG, expert_parallel=world_size))
    layer.init_weights()
    layer(tokens(rank)[0])
    if rank == 1:  # 7 tokens for 4 experts of 1 slot each: capacity dropped some
        assert layer.train_dropped >= 3


def test_experts_split_over_processes_match_one_process():
    run_on_ranks(check, 2)


def test_bad_expert_parallel_is_refused():
    with pytest.raises(ValueError, match="expert_parallel must be at least 1 and divide n_experts"):
        configs.get("cpu", expert_parallel=3)


@pytest.fixture(scope="module")
def evaluate_script():
    spec = importlib.util.spec_from_file_location("evaluate", REPO_ROOT / "scripts" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 4])
def test_expert_parallel_runs_evaluate_as_one_process_and_teach(processes, evaluate_script, default_corpus_root,
                                                                  tmp_path):
    data = ["--data_root", str(default_corpus_root)]
    run_dir = tmp_path / "teacher"
    trained = torchrun("projects/switch_gpt/train.py", [*RUN, *data, "--expert_parallel", str(processes),
                                                        "--out_dir", str(tmp_path), "--run_name", "teacher"],
                       processes)
    assert trained.returncode == 0, trained.stderr[-3000:]
    split = json.loads((run_dir / "results.json").read_text())
    one = evaluate_script.main([str(run_dir), "--out", str(tmp_path / "one_process.json")])
    assert split["eval"].keys() == one["eval"].keys() == {"fast", "slow"}
    for mode, rows in one["eval"].items():
        assert split["eval"][mode].keys() == rows.keys()
        for name, row in rows.items():
            got = split["eval"][mode][name]
            assert {k: got[k] for k in COUNTED} == {k: row[k] for k in COUNTED}, f"{mode} {name}"
            # fp32 logits, the experts' rows in another order; the sums are float64
            assert got["loss"] == pytest.approx(row["loss"], rel=1e-6), f"{mode} {name}"
    padding = 1 if processes == 4 else 0  # the fourth process, without a stream, reads one position of padding
    for name, stats in one["memory_stats"].items():
        choices = split["memory_stats"][name]["expert_load"]["block_1"]["tokens"]  # summed over the processes
        assert choices == stats["expert_load"]["block_1"]["tokens"] + padding, name

    student = torchrun("scripts/distill.py", ["--teacher", str(run_dir), "--project", "gpt", *RUN, *data,
                                              "--charge_teacher", "false", "--out_dir", str(tmp_path),
                                              "--run_name", "student"], processes)
    assert student.returncode == 0, student.stderr[-3000:]
    distilled = json.loads((tmp_path / "student" / "results.json").read_text())
    assert distilled["steps"] == 2 and distilled["distillation"]["teacher"] == str(run_dir.resolve())
