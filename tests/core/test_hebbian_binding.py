"""scripts/hebbian_binding.py: the glyph data is deterministic per seed, the curriculum's level accounting, the
Hebbian model's rule after every step, the outputs (runs, CSVs, plot) and their reuse, at a tiny size."""
import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from languini import hebbian

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "hebbian_binding.py"
spec = importlib.util.spec_from_file_location("hebbian_binding", SCRIPT)
binding = importlib.util.module_from_spec(spec)
spec.loader.exec_module(binding)

EVAL_EVERY = 3
TINY = ["--image_size", "8", "--channels", "4", "--layers", "2", "--examples", "4", "--test_examples", "2",
        "--batch_size", "4", "--start_classes", "4", "--add_classes", "2", "--max_classes", "8",
        "--eval_every", str(EVAL_EVERY), "--seeds", "0", "1", "--lrs", "0.006"]


def test_glyphs_are_deterministic_per_seed():
    a, b = binding.glyph_dataset(14, 3, 10, seed=5), binding.glyph_dataset(14, 3, 10, seed=5)
    assert a.shape == (14, 3, 1, 10, 10) and torch.equal(a, b)
    assert not torch.equal(a, binding.glyph_dataset(14, 3, 10, seed=6))
    assert torch.equal(binding.glyph_dataset(7, 3, 10, seed=5), a[:7])  # the first classes, whatever the count
    assert a.min() >= 0 and a.max() <= 1
    # examples of a class are variants, not copies; every example has ink
    assert not torch.equal(a[0, 0], a[0, 1]) and (a.flatten(2).amax(2) > 0.9).all()


def test_draw_inks_the_segment_and_nothing_far_from_it():
    # a horizontal segment across the middle row of an 8-pixel canvas (pixel centres at (i + 0.5) / 8)
    image = binding.draw(torch.tensor([[[[0.1, 0.5625], [0.9, 0.5625]]]]), 8)[0]
    assert torch.equal(image[4, 1:7], torch.ones(6))  # the centre line: full ink
    assert image[:3].sum() == 0 and image[6:].sum() == 0  # more than a pixel beyond the half width: none


def test_levels_complete_at_the_first_evaluation_above_the_threshold(tmp_path):
    # a threshold of -1 completes every level at its first evaluation: each level takes EVAL_EVERY steps
    runs = binding.main(TINY + ["--models", "softmax", "--threshold", "-1", "--max_steps", "100",
                                "--run_dir", str(tmp_path / "runs"), "--out_dir", str(tmp_path / "out")])
    assert [[(lv["classes"], lv["steps"], lv["finished"]) for lv in r["levels"]] for r in runs] == \
        [[(4, 3, True), (6, 3, True), (8, 3, True)]] * 2
    assert all(r["total_steps"] == 3 * EVAL_EVERY for r in runs)
    with open(tmp_path / "out" / "steps_per_level.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["seed"], r["classes"], r["steps"]) for r in rows] == \
        [(s, c, "3") for s in ("0", "1") for c in ("4", "6", "8")]
    with open(tmp_path / "out" / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert [(r["classes"], r["completed"], r["mean_steps"], r["std_steps"]) for r in summary] == \
        [(c, "2", "3.0", "0.0") for c in ("4", "6", "8")]
    assert (tmp_path / "out" / "steps_per_level.png").stat().st_size > 0


def test_a_run_out_of_steps_records_its_unfinished_level_and_runs_are_reused(tmp_path, monkeypatch):
    args = TINY + ["--threshold", "1.0", "--max_steps", "7", "--run_dir", str(tmp_path / "runs"),
                   "--out_dir", str(tmp_path / "out")]
    updates = []
    update = hebbian.HebbianSoftmax.update
    monkeypatch.setattr(hebbian.HebbianSoftmax, "update",
                        lambda self, h, y: updates.append((h.shape, y.tolist())) or update(self, h, y))
    runs = binding.main(args)
    for r in runs:  # accuracy never exceeds 1: the first level runs out of steps
        assert r["levels"] == [{**r["levels"][0], "classes": 4, "steps": 7, "finished": False}]
    # the Hebbian runs (2 seeds) update after each of their 7 steps, with h of the encoder's width, on the
    # classes of the first level only
    assert len(updates) == 2 * 7 and all(shape == (4, 4) and max(y) < 4 for shape, y in updates)
    saved = json.loads((tmp_path / "runs" / "hebbian_lr0.006_seed1.json").read_text())
    assert saved["levels"] == runs[3]["levels"] and saved["settings"]["max_steps"] == 7
    monkeypatch.setattr(binding, "run_curriculum", lambda *a, **k: pytest.fail("a saved run was trained again"))
    assert binding.main(args + ["--train", "false"]) == runs
    with pytest.raises(SystemExit, match="other settings"):
        binding.main(args[:-6] + ["--max_steps", "8"] + args[-4:])
