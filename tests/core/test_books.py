"""The loader: official layout, stream distribution, batches, 1-GPU-vs-N-GPU equivalence, eval coverage, bad data."""
import hashlib
import json

import numpy as np
import pytest

from languini.books import (END_OF_DOC, BooksDataset, DataError, TrainBatches, distribute, eval_batches,
                            sliding_windows)

VOCAB = 16384


def write_official(root, books: dict[str, list[np.ndarray]], lists_in_root=True, with_files_prefix=True):
    """A fixture in the official release layout: lists next to books_<vocab>/, rows (path, length)."""
    (root / f"books_{VOCAB}" / "files").mkdir(parents=True)
    names = {"train": "file_list_train.npy", "test": "file_list_test_iid.npy",
             "langlearn": "file_list_test_langlearn.npy", "stats": "file_list_test_statistics.npy"}
    for split, arrays in books.items():
        rows = []
        for i, a in enumerate(arrays):
            np.save(root / f"books_{VOCAB}" / "files" / f"{split}{i}.npy", a.astype(np.uint16))
            rows.append((f"files/{split}{i}.npy" if with_files_prefix else f"{split}{i}.npy", str(len(a))))
        list_dir = root if lists_in_root else root / f"books_{VOCAB}"
        np.save(list_dir / names[split], np.array(rows))


def book(start, n):
    return np.arange(start, start + n)


@pytest.fixture
def official(tmp_path):
    write_official(tmp_path, {"train": [book(100, 7), book(200, 3), book(300, 5), book(400, 4)],
                              "test": [book(500, 6), book(600, 2)],
                              "langlearn": [book(700, 9)], "stats": [book(800, 3)]})
    return BooksDataset(tmp_path, VOCAB)


def test_official_layout_is_read_unchanged(official):
    assert sorted(official.splits) == ["langlearn", "stats", "test", "train"]
    assert [b.length for b in official.books("train")] == [7, 3, 5, 4]
    assert [b.path.name for b in official.books("test")] == ["test0.npy", "test1.npy"]


@pytest.mark.parametrize("lists_in_root,with_files_prefix", [(False, True), (True, False)])
def test_lists_beside_files_and_bare_names(tmp_path, lists_in_root, with_files_prefix):
    write_official(tmp_path, {"train": [book(1, 4)], "test": [book(9, 2)]}, lists_in_root, with_files_prefix)
    ds = BooksDataset(tmp_path, VOCAB)
    assert [b.length for b in ds.books("train")] == [4]


def test_fingerprint_names_the_books_and_their_lengths(tmp_path):
    # The official release has no integrity.json: the fingerprint hashes its file lists' sha256 all the same.
    write_official(tmp_path / "a", {"train": [book(1, 4)], "test": [book(9, 2)]})
    lists = sorted((tmp_path / "a").glob("file_list_*.npy"))
    by_hand = "".join(f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in lists)
    fingerprint = BooksDataset(tmp_path / "a", VOCAB).fingerprint
    assert fingerprint == hashlib.sha256(by_hand.encode()).hexdigest()[:12]
    write_official(tmp_path / "b", {"train": [book(1, 4)], "test": [book(9, 3)]})  # one more token in one book
    assert BooksDataset(tmp_path / "b", VOCAB).fingerprint != fingerprint
    assert (BooksDataset(tmp_path / "a", VOCAB).name, BooksDataset(tmp_path / "b", VOCAB).name) == (
        f"a_books_{VOCAB}", f"b_books_{VOCAB}")  # the data root's name, unless a plain data/


def test_greedy_distribution_by_hand():
    # loads: [5,0] -> 3 to s1 -> [5,3] -> 4 to s1 -> [5,7] -> 1 to s0 -> [6,7] -> 2 to s0
    assert distribute([5, 3, 4, 1, 2], 2) == [[0, 3, 4], [1, 2]]
    assert distribute([1, 1, 1], 3) == [[0], [1], [2]]  # ties go to the lowest stream


def test_stream_is_books_joined_by_end_of_document_and_repeats(official):
    # One stream holds all train books: 7 + 3 + 5 + 4 tokens and 4 separators = 23 per cycle.
    batches = TrainBatches(official.books("train"), VOCAB, global_batch_size=1, seq_len=10)
    expected = np.concatenate([book(100, 7), [END_OF_DOC], book(200, 3), [END_OF_DOC],
                               book(300, 5), [END_OF_DOC], book(400, 4), [END_OF_DOC]])
    expected = np.concatenate([expected, expected])  # the stream repeats
    for step in range(3):
        x, y = batches(step)
        assert x.shape == y.shape == (1, 1, 10)
        np.testing.assert_array_equal(x[0, 0].numpy(), expected[step * 10: step * 10 + 10])
        np.testing.assert_array_equal(y[0, 0].numpy(), expected[step * 10 + 1: step * 10 + 11])


@pytest.mark.parametrize("world_size,micro_batches", [(2, 1), (4, 1), (2, 2), (1, 4)])
def test_one_process_with_accumulation_sees_the_data_of_many(tmp_path, world_size, micro_batches):
    lengths = [13, 7, 29, 5, 11, 17, 3, 23, 19, 2, 31, 8]
    write_official(tmp_path, {"train": [book(100 * i, n) for i, n in enumerate(lengths)]})
    books = BooksDataset(tmp_path, VOCAB).books("train")
    G, T = 4, 6
    single = TrainBatches(books, VOCAB, G, T, micro_batches=4)
    ranks = [TrainBatches(books, VOCAB, G, T, micro_batches, rank=r, world_size=world_size)
             for r in range(world_size)]
    for step in (0, 1, 7):
        reference = {s: row for s, row in zip(single.stream_ids, single(step)[0].reshape(G, T).numpy())}
        seen = {}
        for r in ranks:
            x = r(step)[0]
            assert x.shape == (micro_batches, G // world_size // micro_batches, T)
            seen.update(zip(r.stream_ids, x.reshape(-1, T).numpy()))
        assert seen.keys() == reference.keys()
        for s in reference:
            np.testing.assert_array_equal(seen[s], reference[s])


def test_eval_scores_every_target_once_and_masks_padding(official):
    books = official.books("test")  # 6 and 2 tokens -> two streams of 7 and 3 tokens
    got = list(eval_batches(books, VOCAB, batch_size=2, seq_len=4))
    assert len(got) == 2  # ceil((7 - 1) / 4)
    mask = np.concatenate([m.numpy() for _, _, m in got], axis=1)
    assert mask.sum() == (7 - 1) + (3 - 1)
    targets = np.concatenate([y.numpy() for _, y, _ in got], axis=1)
    np.testing.assert_array_equal(targets[0][mask[0]], np.r_[book(501, 5), END_OF_DOC])
    np.testing.assert_array_equal(targets[1][mask[1]], np.r_[book(601, 1), END_OF_DOC])


def test_eval_drops_empty_streams_and_caps_batches(official):
    got = list(eval_batches(official.books("stats"), VOCAB, batch_size=16, seq_len=2, max_batches=1))
    assert len(got) == 1 and got[0][0].shape == (1, 2)


@pytest.mark.parametrize("seq_len,stride", [(8, 2), (8, 8), (5, 3), (64, 16)])
def test_slow_eval_windows_score_each_target_once_with_long_context(official, seq_len, stride):
    books = official.books("train")
    stream = np.concatenate([np.r_[book(100, 7), END_OF_DOC], np.r_[book(200, 3), END_OF_DOC],
                             np.r_[book(300, 5), END_OF_DOC], np.r_[book(400, 4), END_OF_DOC]])
    scored = []
    windows = list(sliding_windows(books, VOCAB, seq_len, stride, batch_size=3))
    for x, y, mask in windows:
        for row_x, row_y, row_m in zip(x.numpy(), y.numpy(), mask.numpy()):
            scored.extend(row_y[row_m])
            positions = np.flatnonzero(row_m)
            if len(scored) > len(positions) and seq_len <= len(stream) - 1:  # not the first window
                assert positions.min() >= seq_len - stride  # at least seq_len - stride tokens of context
    np.testing.assert_array_equal(scored, stream[1:])


def test_sharded_slow_eval_covers_the_same_windows(official):
    books = official.books("train")
    whole = sum(int(m.sum()) for _, _, m in sliding_windows(books, VOCAB, 4, 2, 8))
    parts = sum(int(m.sum()) for r in range(3) for _, _, m in sliding_windows(books, VOCAB, 4, 2, 8, r, 3))
    assert whole == parts == 22


# -- bad data ------------------------------------------------------------------------------------------------
def test_missing_dataset_names_prepare_script(tmp_path):
    with pytest.raises(DataError, match="prepare_books.py"):
        BooksDataset(tmp_path, VOCAB)


def test_vocab_mismatch_names_the_vocab_found(official):
    with pytest.raises(DataError, match=f"books_{VOCAB}.*--vocab_size"):
        BooksDataset(official.data_root, 4096)


def test_token_outside_vocab_is_a_vocab_mismatch(tmp_path):
    write_official(tmp_path, {"train": [np.array([1, 2, 60000])]})
    batches = TrainBatches(BooksDataset(tmp_path, VOCAB).books("train"), VOCAB, 1, 2)
    with pytest.raises(DataError, match="different vocabularies"):
        batches(0)


def test_corrupt_file_list(official):
    (official.data_root / "file_list_train.npy").write_bytes(b"not a numpy file")
    with pytest.raises(DataError, match="Cannot read"):
        BooksDataset(official.data_root, VOCAB).books("train")


def test_missing_book(official):
    (official.dir / "files" / "train1.npy").unlink()
    with pytest.raises(DataError, match="train1.npy.*missing"):
        BooksDataset(official.data_root, VOCAB).books("train")


def test_truncated_book(official):
    np.save(official.dir / "files" / "train0.npy", book(100, 3).astype(np.uint16))
    batches = TrainBatches(BooksDataset(official.data_root, VOCAB).books("train"), VOCAB, 1, 4)
    with pytest.raises(DataError, match="corrupt"):
        batches(0)


def test_edited_file_list_fails_its_integrity_hash(official):
    (official.data_root / "integrity.json").write_text(json.dumps({"file_lists": {"file_list_train.npy": "0" * 64}}))
    with pytest.raises(DataError, match="hash"):
        BooksDataset(official.data_root, VOCAB)


def test_more_streams_than_books_is_explained(official):
    with pytest.raises(DataError, match="smaller --batch_size"):
        TrainBatches(official.books("train"), VOCAB, global_batch_size=8, seq_len=4)
