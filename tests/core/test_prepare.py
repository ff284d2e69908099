"""prepare_books: exact round trip, byte counts, the official layout, and bad input leaving nothing behind."""
import gzip
import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from languini import default_corpus, tokenizer
from languini.books import OFFICIAL_LISTING_SHA256, BooksDataset, DataError, listing_digest
from languini.prepare import prepare_books

REPO = Path(__file__).resolve().parents[2]

ODD_TEXT = "Ça va?  Tabs\there,\n\n\n  leading spaces, ünïcödé — “quotes” and 数字 12345.\r\nEnd"


@pytest.fixture(scope="module")
def books_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("books")
    default_corpus.write_text(root, seed=7)  # enough text to train a small BPE
    with gzip.open(root / "test" / "odd.txt.gz", "wt", encoding="utf-8") as f:
        f.write(ODD_TEXT)
    return root


@pytest.fixture(scope="module")
def prepared(books_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    prepare_books(books_folder, out, vocab_size=600, workers=2, quiet=True)
    return out


def texts(folder):
    for p in sorted(folder.glob("*/*")):
        yield p, (gzip.open(p).read() if p.suffix == ".gz" else p.read_bytes()).decode("utf-8")


def test_round_trip_and_bytes_per_token_are_exact(books_folder, prepared):
    ds = BooksDataset(prepared, 600)
    sp = tokenizer.load(ds.tokenizer_path())
    table = tokenizer.bytes_per_token(sp)
    for path, text in texts(books_folder):
        name = path.name.split(".")[0]
        ids = np.load(ds.dir / "files" / f"{name}.npy")
        assert ids.dtype == np.uint16
        assert sp.decode(ids.tolist()) == text
        assert table[ids].sum() == len(text.encode("utf-8"))  # the denominator of normalised perplexity


def test_layout_lists_and_manifest(books_folder, prepared):
    ds = BooksDataset(prepared, 600)
    assert sorted(ds.splits) == ["ood_series", "test", "train", "valid"]
    assert (ds.dir / "file_list_test_iid.npy").exists()  # the official name of the test split
    rows = [line.split("\t") for line in (ds.dir / "manifest.tsv").read_text().splitlines()[1:]]
    by_name = {r[1]: (int(r[3]), int(r[4])) for r in rows}
    odd = [b for b in ds.books("test") if b.path.stem == "odd"][0]
    assert by_name["odd"] == (len(ODD_TEXT.encode()), odd.list_length)
    assert sum(len(ds.books(s)) for s in ds.splits) == len(rows)


def test_existing_dataset_is_not_overwritten(books_folder, prepared):
    with pytest.raises(DataError, match="--overwrite"):
        prepare_books(books_folder, prepared, vocab_size=600, quiet=True)


def test_tokenizer_of_another_vocab_is_refused(books_folder, prepared, tmp_path):
    with pytest.raises(DataError, match="600 tokens but --vocab_size is 512"):
        prepare_books(books_folder, tmp_path, vocab_size=512,
                      tokenizer_model=BooksDataset(prepared, 600).tokenizer_path(), quiet=True)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_bad_book_leaves_nothing_behind(books_folder, prepared, tmp_path):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train" / "good.txt").write_text("fine text")
    (src / "train" / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataError, match="bad.txt is not UTF-8"):
        prepare_books(src, out, vocab_size=600, tokenizer_model=BooksDataset(prepared, 600).tokenizer_path(),
                      workers=1, quiet=True)
    assert list(out.iterdir()) == []


def test_folder_without_splits(tmp_path):
    with pytest.raises(DataError, match="split sub-folders"):
        prepare_books(tmp_path, tmp_path / "out", quiet=True)


def test_default_corpus_is_deterministic(tmp_path):
    default_corpus.write_text(tmp_path / "a")
    default_corpus.write_text(tmp_path / "b")
    for (pa, ta), (pb, tb) in zip(texts(tmp_path / "a"), texts(tmp_path / "b"), strict=True):
        assert pa.name == pb.name and ta == tb
    train = sorted((tmp_path / "a" / "train").iterdir())
    assert len(train) == default_corpus.SPLITS["train"]
    text = train[0].read_text()
    assert text.count("CHAPTER") >= 8  # book-like structure
    refrain = text.split("\n\n")[3]
    assert text.count(refrain) >= 16  # long-range repetition: the refrain opens and closes every chapter


def test_integrity_hash_follows_the_official_recipe(tmp_path, capsys):
    # One line "<size>\t<name>\n" per file below the folder, sorted by name, then size, whatever its sub-folder.
    folder = tmp_path / "books_16384"
    (folder / "files" / "more").mkdir(parents=True)
    (folder / "files" / "b.npy").write_bytes(b"abc")
    (folder / "files" / "a.npy").write_bytes(b"0123456789")
    (folder / "files" / "more" / "a.npy").write_bytes(b"01234")
    expected = hashlib.sha256(b"5\ta.npy\n10\ta.npy\n3\tb.npy\n").hexdigest()
    assert listing_digest(folder) == expected
    with pytest.raises(SystemExit) as exit_status:
        prepare_script().main(["--check", str(folder)])
    assert exit_status.value.code == 1  # not the official release
    out = capsys.readouterr().out
    assert expected in out
    assert f"differs from the official hash of books_16384, {OFFICIAL_LISTING_SHA256['books_16384']}" in out


def prepare_script():
    spec = importlib.util.spec_from_file_location("prepare_books", REPO / "scripts" / "prepare_books.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, content, error", [
    ("cut.txt.gz", gzip.compress(b"a book that was cut short " * 50, mtime=0)[:-30],
     "Cannot read the book .*cut.txt.gz"),
    ("empty.txt", b" \n\n", "The book .*empty.txt holds no text"),
], ids=["truncated", "empty"])
def test_a_truncated_or_empty_book_is_named_and_leaves_no_output_folder(books_folder, prepared, tmp_path, name,
                                                                       content, error):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train" / "good.txt").write_text("fine text")
    (src / "train" / name).write_bytes(content)
    out = tmp_path / "new" / "out"  # created by the run, so removed by its failure
    with pytest.raises(DataError, match=error):
        prepare_books(src, out, vocab_size=600, tokenizer_model=BooksDataset(prepared, 600).tokenizer_path(),
                      workers=1, quiet=True)
    assert not (tmp_path / "new").exists()


def test_an_out_folder_in_the_corpus_or_a_dataset_folder_is_refused(books_folder, tmp_path):
    with pytest.raises(DataError, match="written into the raw corpus"):
        prepare_books(books_folder, books_folder / "prepared", quiet=True)
    with pytest.raises(DataError, match="pass --out .*data"):
        prepare_books(books_folder, tmp_path / "data" / "books_16384", quiet=True)
    assert not (books_folder / "prepared").exists() and not (tmp_path / "data").exists()


def test_a_misplaced_data_root_names_the_right_one(books_folder, prepared):
    """--data_root given the dataset folder itself, or the raw books: the error names the parent, or the command
    that prepares the books into data/ (not an --out into the corpus, nor a nested dataset)."""
    from languini.datasets import misplaced_root

    dataset = prepared / "books_600"
    assert f"--data_root {prepared}" in misplaced_root(dataset)
    raw = misplaced_root(books_folder)
    assert f"prepare_books.py {books_folder}" in raw and "--out" not in raw
    assert misplaced_root(prepared) is None  # a data root: not misplaced
