"""A run whose value table is split over 2 processes (torchrun, gloo), saved there and continued on 1 process,
trains as the run on 1 process: the same loss at every step. (The 20-step comparisons of lram_gpt, pkm_gpt and
switch_gpt at the --config cpu size are the commands in the projects' READMEs; this is the smallest one.)"""
import json
import os
import subprocess
import sys

import pytest

from languini import experiment
from languini.experiment import REPO_ROOT, child_python_path
from languini.stop import EXIT_UNFINISHED
from projects.lram_gpt import configs
from projects.lram_gpt.model import Model

RUN = ["--config", "cpu", "--d_model", "32", "--n_layers", "2", "--seq_len", "32", "--batch_size", "4",
       "--max_steps", "4", "--log_every", "1", "--eval_every", "4", "--run_name", "r"]


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]


@pytest.mark.slow
def test_saved_on_two_processes_continued_on_one(default_corpus_root, tmp_path):
    common = RUN + ["--data_root", str(default_corpus_root)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()}
    # unfinished: torchrun exits with 1 when its workers exit with EXIT_UNFINISHED
    stopped = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              str(REPO_ROOT / "projects" / "lram_gpt" / "train.py"), *common, "--memory_shards", "2",
                              "--stop_at_step", "2", "--out_dir", str(tmp_path / "split")],
                             env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 1 and "Continue with the same command" in stopped.stdout, stopped.stderr[-3000:]
    assert (tmp_path / "split" / "r" / "checkpoint_shards" / "step").read_text() == "2"
    # continued on one process (the same flags: one process holds the whole table), and the run on one process
    continued = ["--memory_shards", "2", "--resume", "true", "--stop_at_step", "3", "--out_dir", str(tmp_path / "split")]
    for argv in (common + continued, common + ["--stop_at_step", "3", "--out_dir", str(tmp_path / "one")]):
        with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
            experiment.main("lram_gpt", configs, Model, argv)
    split, one = losses(tmp_path / "split" / "r"), losses(tmp_path / "one" / "r")
    assert [s for s, _ in split] == [s for s, _ in one] == [1, 2, 3]
    for (_, a), (_, b) in zip(split, one):
        assert a == pytest.approx(b, rel=1e-6)  # fp32 losses; the split read sums in another order
