"""The tasks' samplers against hand-worked fixtures (no ../shared data: small books written here)."""
import gzip

import pytest
import torch

from projects.neural_bloom import tasks


def write_book(path, text):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)


def test_read_words_by_hand(tmp_path):
    write_book(tmp_path / "a.txt.gz", "The cat's hat, the CAT; naïve café 42 well-known\n")
    write_book(tmp_path / "b.txt.gz", "the dog_house Über")
    (tmp_path / "notes.txt").write_text("ignored words")
    # runs of word characters, case kept, sorted by code point (digits < capitals < small letters < Ü)
    assert tasks.read_words(tmp_path) == ["42", "CAT", "The", "café", "cat", "dog_house", "hat", "known", "naïve",
                                          "s", "the", "well", "Über"]
    with pytest.raises(FileNotFoundError, match="no \\*.txt.gz books"):
        tasks.read_words(tmp_path / "missing")


def test_split_words_is_seeded_disjoint_and_sorted():
    words = [f"w{i}" for i in range(10)]
    train, held_out = tasks.split_words(words, 0.3, seed=0)
    assert (len(train), len(held_out)) == (7, 3)
    assert sorted(train + held_out) == sorted(words) and train == sorted(train) and held_out == sorted(held_out)
    assert tasks.split_words(words, 0.3, seed=0) == (train, held_out)
    assert tasks.split_words(words, 0.3, seed=1) != (train, held_out)


def test_encode_bytes_by_hand():
    out = tasks.encode_bytes(["ab", "abcdef", "é"], 4)
    assert out.dtype == torch.uint8
    assert out.tolist() == [[97, 98, 0, 0], [97, 98, 99, 100], [195, 169, 0, 0]]
    with pytest.raises(ValueError, match="sorted and unique"):
        tasks.word_universe(["b", "a"], 4)


class ScriptedDraws:
    """Stands for tasks.randint: returns the scripted values in order and checks each call's range."""

    def __init__(self, script):
        self.script = list(script)

    def __call__(self, gen, high, size=()):
        expected_high, value = self.script.pop(0)
        assert high == expected_high
        value = torch.tensor(value)
        assert value.shape == torch.Size(size) and ((value >= 0) & (value < high)).all()
        return value


def test_database_sampler_by_hand(monkeypatch):
    words = list("abcdefghij")  # 10 sorted keys
    universe = tasks.word_universe(words, 2)
    task = tasks.DatabaseTask(universe, universe, 3)
    # a set: the start is drawn from 0..7 (10 - 3 + 1 starts); start 4 stores e, f, g
    monkeypatch.setattr(tasks, "randint", ScriptedDraws([(8, 4), (7, list(range(7)))]))
    members, negatives = task.eval_set(None, 3, 7)
    assert members.tolist() == [4, 5, 6]
    # the 7 draws 0..6 of the keys outside the range map to every outside key once: 0 1 2 3, then 7 8 9
    assert negatives.tolist() == [0, 1, 2, 3, 7, 8, 9]
    # a training batch of one set and 4 queries: size (one choice), start 4, two members at positions 2 and 0,
    # two uniform queries 9 and 5; 5 (f) is in the set, so the targets are 1 1 0 1
    monkeypatch.setattr(tasks, "randint", ScriptedDraws([(1, 0), (8, 4), (3, [2, 0]), (10, [9, 5])]))
    sets, queries, targets = task.train_batch(None, 1, 4)
    assert sets.tolist() == [[4, 5, 6]] and queries.tolist() == [[6, 4, 9, 5]]
    assert targets.tolist() == [[1.0, 1.0, 0.0, 1.0]]


def test_database_negatives_are_uniform_outside_the_range():
    universe = tasks.word_universe([f"k{i:02d}" for i in range(30)], 3)
    task = tasks.DatabaseTask(universe, universe, 8)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        members, negatives = task.eval_set(gen, 8, 2000)
        outside = sorted(set(range(30)) - set(members.tolist()))
        counts = torch.bincount(negatives, minlength=30)
        assert counts[members].sum() == 0 and (counts[outside] > 50).all()  # 2000 / 22 = 91 each on average
        assert (members == torch.arange(members[0], members[0] + 8)).all()


def test_extrapolation_sizes_vary_per_batch():
    universe = tasks.word_universe([f"k{i:03d}" for i in range(300)], 4)
    task = tasks.DatabaseTask(universe, universe, (2, 200))
    gen = torch.Generator().manual_seed(0)
    sizes = {task.train_batch(gen, 2, 4)[0].shape[1] for _ in range(40)}
    assert min(sizes) >= 2 and max(sizes) <= 200 and len(sizes) > 20
    with pytest.raises(ValueError, match="do not fit"):
        tasks.DatabaseTask(universe, universe, 400)


def test_class_sets_come_from_one_class_and_negatives_from_others():
    train, held_out = tasks.synthetic_classes(5, 40, 10, dim=6, seed=0)
    task = tasks.ClassTask(train, held_out, 8)
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        members, negatives = task.eval_set(gen, 8, 50)
        assert len(set(members.tolist())) == 8 and len(held_out.classes[members].unique()) == 1
        assert (held_out.classes[negatives] != held_out.classes[members[0]]).all()
    sets, queries, targets = task.train_batch(gen, 3, 10)
    assert targets[:, :5].eq(1).all() and targets[:, 5:].eq(0).all()  # half from the set, half other classes


def test_synthetic_universes_share_their_prototypes():
    train, held_out = tasks.synthetic_classes(3, 400, 400, dim=5, noise=1.0, seed=0)
    again, _ = tasks.synthetic_classes(3, 400, 400, dim=5, noise=1.0, seed=0)
    assert torch.equal(train.inputs, again.inputs) and train.keys == again.keys
    for c in range(3):  # class means agree to a few standard errors (1 / sqrt(400) = 0.05 per coordinate)
        torch.testing.assert_close(train.inputs[train.classes == c].mean(0),
                                   held_out.inputs[held_out.classes == c].mean(0), atol=0.25, rtol=0)
    assert len(set(train.keys)) == len(train)


def test_uniform_and_heavy_hitter_sets():
    universe, _ = tasks.synthetic_classes(2, 50, 1, dim=4, seed=0)
    gen = torch.Generator().manual_seed(0)
    uniform = tasks.UniformTask(universe, universe, 20)
    members, negatives = uniform.eval_set(gen, 20, 500)
    assert len(set(members.tolist())) == 20 and not set(negatives.tolist()) & set(members.tolist())
    heavy = tasks.HeavyHitterTask(universe, 5, decay=0.5, seed=0)
    weights = heavy.weights(universe)
    # one element of each rank: weights 0.5^0, 0.5^1, ... in a fixed shuffled order
    torch.testing.assert_close(weights.sort(descending=True).values, 0.5 ** torch.arange(100).double())
    top = int(weights.argmax())
    # the top element has at least half the weight left at each of the 5 draws: missed with p <= 0.5^5
    assert sum(top in heavy.members(gen, 5, universe).tolist() for _ in range(50)) >= 40
