"""Staged training of the Shortformer end to end on CPU: a run stopped at or right after the stage boundary and
resumed has the losses of the uninterrupted run, the cache carried across the boundary and the checkpoint."""
import json

import pytest

from languini.experiment import main
from languini.stop import EXIT_UNFINISHED
from projects.shortformer import configs
from projects.shortformer.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--cache_len", "32", "--batch_size", "4", "--eval_batch_size", "4",
        "--eval_max_batches", "2", "--slow_eval_max_windows", "2"]


def train_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["seq_len"], r["tokens"], r["loss"]) for r in rows if r["event"] == "train"]


# 14 steps with a quarter of the tokens at 8. --stage_batch sequences: steps in the ratio 0.25/8 : 0.75/32 = 4 : 3,
# so 8 steps of 4 x 8 tokens and 6 of 4 x 32. tokens: every step reads 4 x 32 tokens (16 sequences of 8 in the first
# stage), so a quarter of the steps: round(3.5) = 4 at 8 and 10 at 32, and the cache starts afresh at the boundary.
BY_STAGE_BATCH = {
    "sequences": ([(s, 8, s * 4 * 8) for s in range(1, 9)] + [(s, 32, 256 + (s - 8) * 4 * 32) for s in range(9, 15)],
                  [8, 6]),
    "tokens": ([(s, 8, s * 128) for s in range(1, 5)] + [(s, 32, 512 + (s - 4) * 128) for s in range(5, 15)], [4, 10]),
}


@pytest.mark.parametrize("stage_batch,stop", [("sequences", 8), ("sequences", 9), ("tokens", 4), ("tokens", 5)],
                         ids=["sequences-at-the-boundary", "sequences-after", "tokens-at-the-boundary", "tokens-after"])
def test_resume_across_the_stage_boundary_is_exact(default_corpus_root, tmp_path, stage_batch, stop):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "14", "--stages", "8:0.25,32",
                   "--stage_batch", stage_batch, "--log_every", "1", "--eval_every", "7", "--micro_batches", "2",
                   "--run_name", "r"]
    whole = main("shortformer", configs, Model, args + ["--out_dir", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
        main("shortformer", configs, Model, args + ["--out_dir", str(tmp_path / "b"), "--stop_at_step", str(stop)])
    resumed = main("shortformer", configs, Model, args + ["--out_dir", str(tmp_path / "b"), "--resume", "true"])
    rows = train_rows(tmp_path / "a" / "r")
    expected_rows, expected_steps = BY_STAGE_BATCH[stage_batch]
    assert [(s, length, tokens) for s, length, tokens, _ in rows] == expected_rows
    assert train_rows(tmp_path / "b" / "r") == rows
    assert resumed["eval"] == whole["eval"]
    assert [s["steps"] for s in resumed["stages"]] == expected_steps
    # the cache makes the slow evaluation the Shortformer's non-overlapping one with cache
    assert resumed["eval"]["slow"]["test"]["protocol"] == "stream"
