"""Staged training of the Shortformer end to end on CPU: a run stopped at or right after the stage boundary and
resumed has the losses of the uninterrupted run, the cache carried across the boundary and the checkpoint."""
import json

import pytest

from languini.experiment import main
from projects.shortformer import configs
from projects.shortformer.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--cache_len", "32", "--batch_size", "4", "--eval_batch_size", "4",
        "--eval_max_batches", "2", "--slow_eval_max_windows", "2"]


def train_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["seq_len"], r["tokens"], r["loss"]) for r in rows if r["event"] == "train"]


@pytest.mark.parametrize("stop", [pytest.param(8, id="at-the-boundary"), pytest.param(9, id="after-the-boundary")])
def test_resume_across_the_stage_boundary_is_exact(default_corpus_root, tmp_path, stop):
    # 14 steps with a quarter of the tokens at 8: steps in the ratio 0.25/8 : 0.75/32 = 4 : 3, so 8 steps at 8
    # tokens and 6 at 32; the boundary lies between steps 8 and 9.
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "14", "--stages", "8:0.25,32",
                   "--log_every", "1", "--eval_every", "7", "--micro_batches", "2", "--run_name", "r"]
    whole = main("shortformer", configs, Model, args + ["--out_dir", str(tmp_path / "a")])
    assert main("shortformer", configs, Model, args + ["--out_dir", str(tmp_path / "b"),
                                                        "--stop_at_step", str(stop)]) is None
    resumed = main("shortformer", configs, Model, args + ["--out_dir", str(tmp_path / "b"), "--resume", "true"])
    rows = train_rows(tmp_path / "a" / "r")
    assert [(s, length, tokens) for s, length, tokens, _ in rows] == (
        [(s, 8, s * 4 * 8) for s in range(1, 9)] + [(s, 32, 256 + (s - 8) * 4 * 32) for s in range(9, 15)])
    assert train_rows(tmp_path / "b" / "r") == rows
    assert resumed["eval"] == whole["eval"]
    assert [s["steps"] for s in resumed["stages"]] == [8, 6]
    # the cache makes the slow evaluation the Shortformer's non-overlapping one with cache
    assert resumed["eval"]["slow"]["test"]["protocol"] == "stream"
