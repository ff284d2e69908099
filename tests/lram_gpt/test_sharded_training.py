"""Runs whose value table is split over 2 processes (torchrun, gloo) train as the run on 1 process: the same loss
at every step, for a run saved there and continued on 1 process, and for one table read by both memory layers
(--share_memory). (The 20-step comparisons of lram_gpt, pkm_gpt and switch_gpt at the --config cpu size are the
commands in the projects' READMEs; these are the smallest ones.)"""
import pytest

from languini import experiment
from languini.stop import EXIT_UNFINISHED
from projects.lram_gpt import configs
from projects.lram_gpt.model import Model
from tests.torchrun import torchrun, train_losses

TRAIN = "projects/lram_gpt/train.py"
RUN = ["--config", "cpu", "--d_model", "32", "--n_layers", "2", "--seq_len", "32", "--batch_size", "4",
       "--max_steps", "4", "--log_every", "1", "--eval_every", "4", "--run_name", "r"]
# Both blocks read one gated table (Memory+); 5x the default learning rate makes 6 steps show a wrong gradient
# of the table (DDP averaging the processes' different column halves was 1.5e-5 off at step 2, 2.8e-4 at step 6).
SHARED = ["--config", "cpu", "--seq_len", "32", "--batch_size", "4", "--max_steps", "6", "--lr", "3e-3",
          "--memory_layers", "0,1", "--share_memory", "true", "--memory_gate", "silu", "--log_every", "1",
          "--eval_every", "6", "--eval_max_batches", "1", "--slow_eval_max_windows", "1", "--run_name", "r"]


@pytest.mark.slow
def test_saved_on_two_processes_continued_on_one(default_corpus_root, tmp_path):
    common = RUN + ["--data_root", str(default_corpus_root)]
    # unfinished: torchrun exits with 1 when its workers exit with EXIT_UNFINISHED
    stopped = torchrun(TRAIN, [*common, "--memory_shards", "2", "--stop_at_step", "2", "--out_dir",
                               str(tmp_path / "split")], 2)
    assert stopped.returncode == 1 and "Continue with the same command" in stopped.stdout, stopped.stderr[-3000:]
    assert (tmp_path / "split" / "r" / "checkpoint_shards" / "step").read_text() == "2"
    # continued on one process (the same flags: one process holds the whole table), and the run on one process
    continued = ["--memory_shards", "2", "--resume", "true", "--stop_at_step", "3", "--out_dir", str(tmp_path / "split")]
    for argv in (common + continued, common + ["--stop_at_step", "3", "--out_dir", str(tmp_path / "one")]):
        with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
            experiment.main("lram_gpt", configs, Model, argv)
    split, one = train_losses(tmp_path / "split" / "r"), train_losses(tmp_path / "one" / "r")
    assert [s for s, _ in split] == [s for s, _ in one] == [1, 2, 3]
    for (_, a), (_, b) in zip(split, one):
        assert a == pytest.approx(b, rel=1e-6)  # fp32 losses; the split read sums in another order


@pytest.mark.slow
def test_a_shared_table_split_over_two_processes_trains_as_on_one(default_corpus_root, tmp_path):
    common = SHARED + ["--data_root", str(default_corpus_root)]
    split = torchrun(TRAIN, [*common, "--memory_shards", "2", "--out_dir", str(tmp_path / "split")], 2)
    assert split.returncode == 0, split.stderr[-3000:]
    experiment.main("lram_gpt", configs, Model, common + ["--out_dir", str(tmp_path / "one")])
    split, one = train_losses(tmp_path / "split" / "r"), train_losses(tmp_path / "one" / "r")
    assert [s for s, _ in split] == [s for s, _ in one] == list(range(1, 7))
    for (step, a), (_, b) in zip(split, one):
        # fp32 losses near 7.3 (a unit in the last place: 4.8e-7); the split read sums in another order
        assert a == pytest.approx(b, abs=1e-5), f"step {step}"
