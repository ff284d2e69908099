"""The NTM task generators (tasks.py) against hand-worked episodes, and the curriculum's doubling."""
import pytest
import torch

from projects.sam import tasks


def test_copy_of_two_vectors():
    x, y, mask = tasks.copy_episode(torch.tensor([[[1.0, 0.0], [1.0, 1.0]]]))
    assert x.tolist() == [[[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]]
    assert y.tolist() == [[[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]]
    assert mask.tolist() == [[0, 0, 0, 1, 1]]


def test_associative_recall_of_the_second_of_three_pairs():
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    values = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    x, y, mask = tasks.recall_episode(keys, values, torch.tensor([1]))
    # channels: 2 bits, key flag, query flag; key/value steps, then the query, then the answer step
    assert x.tolist() == [[[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0],
                           [0, 1, 0, 1], [0, 0, 0, 0]]]
    assert y[0, -1].tolist() == [1, 0] and y[0, :-1].abs().sum() == 0
    assert mask.tolist() == [[0, 0, 0, 0, 0, 0, 0, 1]]


def test_priority_sort_of_three_vectors_keeping_two():
    vectors = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    priorities = torch.tensor([[0.1, 0.9, -0.5]])
    x, y, mask = tasks.sort_episode(vectors, priorities, 2)
    assert torch.allclose(x, torch.tensor([[[1, 0, 0.1, 0], [0, 1, 0.9, 0], [1, 1, -0.5, 0], [0, 0, 0, 1],
                                             [0, 0, 0, 0], [0, 0, 0, 0]]]))
    assert y[0, 4:].tolist() == [[0, 1], [1, 0]]  # priority 0.9 first, then 0.1
    assert mask.tolist() == [[0, 0, 0, 0, 1, 1]]


def test_random_episodes_have_the_thesis_sizes():
    g = torch.Generator().manual_seed(0)
    x, y, mask = tasks.episode("copy", 4, 20, g)
    assert x.shape == (4, 41, 9) and y.shape == (4, 41, 8) and mask.sum() == 4 * 20
    x, y, mask = tasks.episode("recall", 4, 6, g)
    assert x.shape == (4, 14, 10) and mask.sum() == 4
    # the answer is the value shown right after the queried key
    for b in range(4):
        key = x[b, 12, :8]
        shown = [t for t in range(0, 12, 2) if torch.equal(x[b, t, :8], key)]
        assert any(torch.equal(y[b, -1], x[b, t + 1, :8]) for t in shown)
    x, y, mask = tasks.episode("sort", 4, 20, g)
    assert x.shape == (4, 37, 10) and mask.sum() == 4 * 16


def test_cost_per_sequence_is_bits():
    """Logits 0 on every scored bit: 1 bit of cross-entropy each."""
    targets = torch.ones(2, 3, 4)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    assert abs(float(tasks.cost_per_sequence(torch.zeros(2, 3, 4), targets, mask)) - (8 + 4) / 2) < 1e-6
    assert tasks.errors_per_sequence(torch.full((2, 3, 4), -1.0), targets, mask) == 6.0


def test_curriculum_doubles_below_the_threshold():
    g = torch.Generator().manual_seed(0)
    curriculum = tasks.Curriculum(1, 20, threshold=1.0, window=3, start=2)
    assert all(1 <= curriculum.level(g) <= 2 for _ in range(20))
    assert [curriculum.record(c) for c in (5.0, 0.5, 0.5)] == [False, False, False]  # mean 2 of the last three
    assert curriculum.record(0.5) and curriculum.h == 4  # mean 0.5 of the last three
    for _ in range(3):
        for _ in range(3):
            curriculum.record(0.0)
    assert curriculum.h == 20  # 4 -> 8 -> 16 -> 20, the top of the range


def test_training_script_records_curves_and_evaluates(tmp_path, capsys):
    from projects.sam import train_tasks

    result = train_tasks.train("recall", "sam", cpu_seconds=60, max_batches=4, log_every=2, eval_batches=1,
                               words=16, hidden=16, heads=1, curriculum=True, min_level=2, initial_strength=11.0)
    assert len(result["curve"]) == 2 and result["sequences"] == 32
    assert result["min_level"] == 2 and all(point[2] == 2 for point in result["curve"])  # the curriculum's start
    assert result["eval_cost"] > 0 and 0 <= result["eval_errors"] <= 8
    train_tasks.main(["--task", "copy", "--models", "lstm", "--cpu_seconds", "0.2", "--log_every", "1",
                      "--eval_batches", "1", "--out", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png")])
    assert "cost/seq" in capsys.readouterr().out and (tmp_path / "c.png").exists()
    train_tasks.main(["--task", "copy", "--from_json", str(tmp_path / "c.json"), "--plot", str(tmp_path / "d.png")])
    assert "bit errors/seq" in capsys.readouterr().out and (tmp_path / "d.png").exists()


def test_initial_read_strength():
    """beta = 1 + softplus(the interface's output): a controller output of zero gives the configured strength
    (by hand: 1 + log(1 + (e^10 - 1)) = 11) in every head; strengths of 1 or less cannot be reached."""
    from projects.sam.configs import MemoryConfig
    from projects.sam.core import MemoryCore

    core = MemoryCore(MemoryConfig(kind="sam", hidden=8, heads=3, word_size=4, words=16, initial_strength=11.0), 3, 2)
    _, strength, *_ = core._heads(core.interface(torch.zeros(1, 8)))
    torch.testing.assert_close(strength, torch.full((1, 3), 11.0))
    with pytest.raises(ValueError, match="initial_strength"):
        MemoryCore(MemoryConfig(kind="sam", words=16, initial_strength=1.0), 3, 2)
    with pytest.raises(ValueError, match="min_level"):
        from projects.sam import train_tasks
        train_tasks.train("recall", "sam", cpu_seconds=1, max_batches=1, min_level=7, words=16, hidden=8)
