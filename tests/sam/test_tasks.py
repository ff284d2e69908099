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
    # the answer is the value shown right after the queried key, shown once
    for b in range(4):
        key = x[b, 12, :8]
        shown = [t for t in range(0, 12, 2) if torch.equal(x[b, t, :8], key)]
        assert len(shown) == 1 and torch.equal(y[b, -1], x[b, shown[0] + 1, :8])
    x, y, mask = tasks.episode("sort", 4, 20, g)
    assert x.shape == (4, 37, 10) and mask.sum() == 4 * 16


def test_associative_recall_keys_are_distinct_within_an_episode():
    """Keys of 2 bits, 4 pairs: each episode shows all 4 codes once (drawn with replacement, an episode would
    repeat one with probability 1 - 4!/4^4 = 0.91); of 3 bits, 5 pairs: no key twice in 200 episodes (each would
    repeat one with probability 1 - 8 7 6 5 4 / 8^5 = 0.79). 5 pairs of 2 bits cannot be distinct."""
    g = torch.Generator().manual_seed(0)
    x, _, _ = tasks.episode("recall", 64, 4, g, bits=2)
    codes = (x[:, 0:8:2, :2] * torch.tensor([2.0, 1.0])).sum(-1)  # (64, 4) keys as numbers 0-3
    assert (codes.sort(-1).values == torch.arange(4.0)).all()
    x, _, _ = tasks.episode("recall", 200, 5, g, bits=3)
    keys = x[:, 0:10:2, :3]
    assert not (keys[:, :, None] == keys[:, None]).all(-1).triu(1).any()
    with pytest.raises(ValueError, match="distinct keys"):
        tasks.episode("recall", 1, 5, g, bits=2)


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


def test_curriculum_levels_are_drawn_from_one_to_h():
    """3.4.3: levels from U(0, h) (here from 1: level 0 scores nothing), also when the task's range starts higher
    (recall: 3-6 pairs) or the curriculum starts higher; without the curriculum, the task's range."""
    g = torch.Generator().manual_seed(0)
    assert {tasks.Curriculum(3, 6, threshold=1.0, start=3).level(g) for _ in range(200)} == {1, 2, 3}
    assert {tasks.Curriculum(3, 6, threshold=1.0, start=5).level(g) for _ in range(300)} == {1, 2, 3, 4, 5}
    assert {tasks.Curriculum(3, 6, threshold=1.0, enabled=False).level(g) for _ in range(200)} == {3, 4, 5, 6}


def test_training_script_records_curves_and_evaluates(tmp_path, capsys):
    from projects.sam import train_tasks

    result = train_tasks.train("recall", "sam", cpu_seconds=60, max_batches=4, log_every=2, eval_batches=1,
                               words=16, hidden=16, heads=1, curriculum=True, start_level=2, initial_strength=11.0)
    assert len(result["curve"]) == 2 and result["sequences"] == 32
    assert result["start_level"] == 2 and all(point[2] == 2 for point in result["curve"])  # the curriculum's start
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
    from projects.sam import train_tasks

    with pytest.raises(ValueError, match="start_level must be in"):
        train_tasks.train("recall", "sam", cpu_seconds=1, max_batches=1, curriculum=True, start_level=7, words=16,
                          hidden=8)
    with pytest.raises(ValueError, match="the curriculum's first bound"):
        train_tasks.train("recall", "sam", cpu_seconds=1, max_batches=1, start_level=2, words=16, hidden=8)


def test_curves_over_the_whole_range_are_not_charged_to_the_budget():
    """eval_every: evaluations at 0, 1, ... CPU seconds of training and at the end (here 2), their own CPU time
    left out of the budget (so every model trains for the same seconds however slowly it evaluates)."""
    from projects.sam.train_tasks import train

    torch.set_num_threads(1)
    result = train("recall", "lstm", 2.0, eval_every=1.0, curve_batches=30, eval_batches=1)
    seconds = [point[0] for point in result["eval_curve"]]
    assert len(seconds) == 3 and seconds[0] == 0.0  # 0, 1 and the end
    assert seconds[1:] == pytest.approx([1.0, 2.0], abs=0.2)
    assert 2.0 <= result["cpu_seconds"] < 2.3
    assert all(point[2] > 0 and 0 <= point[3] <= 8 for point in result["eval_curve"])  # bits; of 8 answered


def test_the_figure_grid_writes_each_run_resumes_and_reports(tmp_path, capsys):
    from projects.sam import figure_3_4

    argv = ["--out", str(tmp_path), "--tasks", "recall", "--models", "lstm", "sam", "--seeds", "0", "--cpu_seconds",
            "recall=0.5", "--points", "2", "--jobs", "1"]
    figure_3_4.main(argv)
    out = capsys.readouterr().out
    assert "2 runs to do" in out and sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "recall_lstm_s0.json", "recall_sam_s0.json"]
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 4 and table[2].startswith("| recall | lstm | 1 |")
    assert (tmp_path / "figure_3_4.png").read_bytes().startswith(b"\x89PNG")
    figure_3_4.main(argv)  # every run there: nothing trained again
    assert "0 runs to do" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="task=seconds"):
        figure_3_4.main(argv[:-6] + ["--cpu_seconds", "recal=1"])
