"""Algorithm 3's long runs: the curriculum's set sizes by hand, a training stopped and continued against one
uninterrupted run, checkpoints of another run refused, and bench.py's --evaluate against the evaluation right
after training."""
import json

import pytest
import torch

from projects.neural_bloom import bench, meta_learning, tasks
from projects.neural_bloom.configs import EncoderConfig, NBFConfig
from projects.neural_bloom.model import NeuralBloomFilter
from tests.neural_bloom.test_bench import TOY


def test_curriculum_sizes_by_hand():
    c = meta_learning.Curriculum(start=50, steps=1000)
    # 50 x (5000 / 50) ** (step / 1000): 50 at the start, 500 halfway (100 ** 0.5 = 10), then the full size
    assert [c.largest(s, 5000) for s in (0, 500, 999, 1000, 4000)] == [50, 500, 4977, 5000, 5000]
    assert c.largest(0, 20) == 20  # a start above the task's size is the task's size
    with pytest.raises(ValueError, match="curriculum"):
        meta_learning.Curriculum(start=0, steps=10)


def word_task(set_size):
    universe = tasks.word_universe([f"k{i:03d}" for i in range(300)], 4)
    return tasks.DatabaseTask(universe, universe, set_size)


def test_train_batch_caps_the_set_size():
    task = word_task((2, 200))
    gen = torch.Generator().manual_seed(0)
    sizes = [task.train_batch(gen, 2, 4, largest=30)[0].shape[1] for _ in range(40)]
    assert max(sizes) == 30 and min(sizes) >= 2


def test_training_follows_the_curriculum(single_thread):
    task = word_task(120)
    seen, draw = [], task.train_batch

    def recorded(*args, **kwargs):
        batch = draw(*args, **kwargs)
        seen.append(batch[0].shape[1])
        return batch

    task.train_batch = recorded
    meta_learning.train(tiny_nbf(), task, seconds=60, batch_sets=1, queries=8, max_steps=6,
                        curriculum=meta_learning.Curriculum(start=4, steps=4))
    # 4 x 30 ** (s / 4) = 4, 9.36, 21.9, 51.3 rounded, then the task's 120
    assert seen == [4, 9, 22, 51, 120, 120]


def tiny_nbf(seed=0):
    torch.manual_seed(seed)
    return NeuralBloomFilter(NBFConfig(memory_slots=4, word_size=2, query_dim=6, hidden=16, write_scale=1 / 40),
                             EncoderConfig(kind="bytes", max_len=4, channels=8, z_dim=16))


def test_a_stopped_and_continued_training_is_one_run(tmp_path, single_thread):
    task, steps = word_task((5, 40)), 12
    kwargs = dict(seconds=600, lr=3e-3, batch_sets=2, queries=16, seed=3, identity={"model": "tiny"},
                  curriculum=meta_learning.Curriculum(start=5, steps=6))
    whole = tiny_nbf()
    whole_stats = meta_learning.train(whole, task, max_steps=steps, checkpoint=tmp_path / "whole.pt", **kwargs)
    parts = tiny_nbf()
    meta_learning.train(parts, task, max_steps=5, checkpoint=tmp_path / "parts.pt", **kwargs)  # stopped at 5
    parts = tiny_nbf(seed=99)  # a new process: other initial weights, all replaced by the checkpoint's
    parts_stats = meta_learning.train(parts, task, max_steps=steps, checkpoint=tmp_path / "parts.pt", **kwargs)
    assert parts_stats["steps"] == whole_stats["steps"] == steps
    saved = {name: torch.load(tmp_path / name, weights_only=False) for name in ("whole.pt", "parts.pt")}
    # the same float operations in the same order: equal up to a rounding or two
    assert saved["parts.pt"]["losses"] == pytest.approx(saved["whole.pt"]["losses"], rel=1e-5)
    for (name, a), b in zip(whole.state_dict().items(), parts.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    moments = [s["optimizer"]["state"] for s in saved.values()]
    for i in moments[0]:
        torch.testing.assert_close(moments[1][i]["exp_avg_sq"], moments[0][i]["exp_avg_sq"], rtol=1e-4, atol=1e-12)


def test_a_checkpoint_of_another_run_is_refused(tmp_path, single_thread):
    task = word_task(20)
    meta_learning.train(tiny_nbf(), task, seconds=600, lr=3e-3, batch_sets=1, queries=8, max_steps=2,
                        checkpoint=tmp_path / "run.pt", identity={"model": "tiny"})
    with pytest.raises(ValueError, match=r"another run \(lr differ"):
        meta_learning.train(tiny_nbf(), task, seconds=600, lr=1e-3, batch_sets=1, queries=8, max_steps=4,
                            checkpoint=tmp_path / "run.pt", identity={"model": "tiny"})
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        meta_learning.load_checkpoint(tmp_path / "missing.pt", {})


def test_evaluate_a_run_folder_equals_the_evaluation_after_training(books, tmp_path, capsys, single_thread):
    run = tmp_path / "run"
    trained = bench.main(["--task", "database", "--books", str(books), "--set_size", "20", "--nbf_steps", "6",
                          "--lstm", "false", "--memnet", "false", "--curriculum", "4:3", "--run_dir", str(run)]
                         + TOY)
    assert (run / "nbf_4x2.pt").exists() and (run / "command.json").exists()
    assert "(growing from 4 over the first 3 steps)" in capsys.readouterr().out
    evaluated = bench.main(["--evaluate", str(run), "--test_sets", "2", "--negatives", "400", "--timing", "false",
                            "--out", str(tmp_path / "evaluated.json")])
    assert "6 steps" in capsys.readouterr().out
    assert json.loads((tmp_path / "evaluated.json").read_text())["sizes"].keys() == {"20"}
    for alpha, point in trained["sizes"][20]["neural"]["NBF 4x2"].items():
        again = evaluated["sizes"][20]["neural"]["NBF 4x2"][alpha]
        assert again["false_negatives"] == pytest.approx(point["false_negatives"], abs=1e-9)
        assert again["threshold"] == pytest.approx(point["threshold"], rel=1e-5)
        assert again["model_fpr"] == pytest.approx(point["model_fpr"], abs=1e-9)
    # continued with more steps, the run resumes where it stopped
    bench.main(["--task", "database", "--books", str(books), "--set_size", "20", "--nbf_steps", "8", "--lstm",
                "false", "--memnet", "false", "--curriculum", "4:3", "--run_dir", str(run)] + TOY)
    assert "resumed from" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--evaluate", str(tmp_path)])
    assert "no command.json" in capsys.readouterr().err


def test_bad_curriculum_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--curriculum", "50"])
    assert "START:STEPS" in capsys.readouterr().err


def test_saved_words_are_the_same_universe(books, tmp_path, capsys):
    bench.main(["--books", str(books), "--save_words", str(tmp_path / "words")])
    assert "1,000 unique words" in capsys.readouterr().out
    assert tasks.read_words(tmp_path / "words") == tasks.read_words(books)
