"""The embedded default corpus: held-out splits small enough for a CPU smoke run; rebuilt when its version changes."""
from languini import default_corpus, evaluation, prepare
from languini.books import BooksDataset


def test_held_out_splits_keep_the_final_evaluation_small(default_corpus_root):
    # The smoke run's final evaluation reads every held-out split fast and slow (windows of 128 moved by 32). The
    # slow projects on a CPU, lram_gpt, trained its cpu config at 3,867 tokens/s on 2 cores and evaluated at about
    # 1.5x that (measured): 100,000 positions took it about 17 s, a small part of a 2m class. Three chapters per
    # held-out book made 170,112.
    ds = BooksDataset(default_corpus_root, default_corpus.VOCAB_SIZE)
    held_out = [s for s in ds.splits if s != "train"]
    assert sorted(held_out) == sorted(s for s in default_corpus.SPLITS if s != "train")
    positions = sum(evaluation.fast_positions(ds.books(s), 16, 128, 500)
                    + evaluation.slow_positions(ds.books(s), 128, None, stateful=False) for s in held_out)
    assert positions < 100_000


def test_a_corpus_of_another_version_is_built_again(tmp_path, monkeypatch):
    builds = []
    monkeypatch.setattr(prepare, "prepare_books", lambda text, root, vocab, **kw: builds.append(kw["overwrite"]))
    monkeypatch.setattr(default_corpus, "BooksDataset", lambda root, vocab: root)
    monkeypatch.setattr(default_corpus, "write_text", lambda folder: None)
    (tmp_path / f"books_{default_corpus.VOCAB_SIZE}").mkdir()  # built before versions were recorded
    default_corpus.ensure(tmp_path)
    default_corpus.ensure(tmp_path)  # now current: kept
    (tmp_path / "corpus_version").write_text(f"{default_corpus.VERSION - 1}\n")
    default_corpus.ensure(tmp_path)
    assert builds == [True, True]
