"""The data check before training: one error naming every bad file, warnings for list lengths."""
import json
import shutil

import numpy as np
import pytest

from languini.books import BooksDataset, DataError
from languini.data_check import check

VOCAB = 2048


@pytest.fixture
def corpus(default_corpus_root, tmp_path):
    """A copy of the prepared default corpus (its integrity.json hashes every token file) to damage."""
    shutil.copytree(default_corpus_root / f"books_{VOCAB}", tmp_path / f"books_{VOCAB}")
    return tmp_path / f"books_{VOCAB}"


def truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


def edit_tokens(path, change):
    tokens = np.load(path)
    np.save(path, change(tokens))


def test_prepared_corpus_passes(corpus):
    assert "files/valid_00.npy" in json.loads((corpus / "integrity.json").read_text())["files"]
    assert check(BooksDataset(corpus.parent, VOCAB), progress=False) == []


@pytest.mark.parametrize("damage,message", [
    (lambda c: truncate(c / "files/ood_series_00.npy", -100), r"ood_series_00.npy \(split ood_series\) is truncated"),
    (lambda c: truncate(c / "files/test_00.npy", 20), r"test_00.npy \(split test\) cannot be read \(EOF"),
    (lambda c: truncate(c / "files/train_05.npy", -2), r"train_05.npy \(split train\) is truncated"),
    (lambda c: edit_tokens(c / "files/valid_01.npy", lambda t: t.astype(np.float32)),
     r"valid_01.npy \(split valid\) holds float32 values, not integer token ids"),
    (lambda c: edit_tokens(c / "files/valid_01.npy", lambda t: t[:10].reshape(2, 5)),
     r"valid_01.npy \(split valid\) holds an array of shape \(2, 5\)"),
    (lambda c: edit_tokens(c / "files/valid_01.npy", lambda t: np.where(np.arange(len(t)) == 7, VOCAB, t)),
     r"valid_01.npy \(split valid\) holds token id 2048, outside the vocab 0..2047"),
    (lambda c: edit_tokens(c / "files/valid_01.npy", lambda t: np.where(np.arange(len(t)) == 7, (t + 1) % VOCAB, t)),
     r"valid_01.npy \(split valid\) does not match its SHA-256 in integrity.json"),
    (lambda c: (c / "files/test_02.npy").unlink(), r"Book files/test_02.npy .* is missing"),
    (lambda c: [(c / f"file_list_{s}.npy").rename(c / f"file_list_ood_{s}.npy") for s in ("valid", "test_iid")],
     "no valid or test split"),
])
def test_bad_file_is_named_with_what_to_do(corpus, damage, message):
    damage(corpus)
    with pytest.raises(DataError, match=message) as error:
        check(BooksDataset(corpus.parent, VOCAB), progress=False)
    assert "prepare_books.py" in str(error.value) and "nothing was trained" in str(error.value)


def test_every_bad_file_is_in_the_one_error(corpus):
    truncate(corpus / "files/test_00.npy", -10)
    truncate(corpus / "files/ood_series_02.npy", -10)
    with pytest.raises(DataError, match="found 2 problem") as error:
        check(BooksDataset(corpus.parent, VOCAB), progress=False)
    assert "test_00.npy" in str(error.value) and "ood_series_02.npy" in str(error.value)


def test_empty_evaluation_split_is_an_error(corpus):
    np.save(corpus / "file_list_ood_series.npy", np.empty((0, 2), dtype="<U32"))
    (corpus / "integrity.json").unlink()
    with pytest.raises(DataError, match="split ood_series has no books"):
        check(BooksDataset(corpus.parent, VOCAB), progress=False)


def test_list_length_differing_from_the_file_is_a_warning(corpus):
    """The official file lists serve every vocabulary: their lengths only balance the streams."""
    rows = np.load(corpus / "file_list_valid.npy")
    rows[0, 1], rows[2, 1] = str(int(rows[0, 1]) + 5), str(int(rows[2, 1]) - 1)
    np.save(corpus / "file_list_valid.npy", rows)
    (corpus / "integrity.json").unlink()  # as in the official release
    warnings = check(BooksDataset(corpus.parent, VOCAB), progress=False)
    assert len(warnings) == 1
    assert "2 book(s) of split valid" in warnings[0] and "used only to balance streams" in warnings[0]
