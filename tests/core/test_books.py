"""The loader: official layout, stream distribution, batches, 1-GPU-vs-N-GPU equivalence, eval coverage, bad data."""
import hashlib
import json
import warnings

import numpy as np
import pytest

from languini.books import (END_OF_DOC, BooksDataset, DataError, ListLengthWarning, TrainBatches, distribute,
                            eval_batches, sliding_windows, window_plan)

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
    assert [b.list_length for b in official.books("train")] == [7, 3, 5, 4]
    assert [b.path.name for b in official.books("test")] == ["test0.npy", "test1.npy"]


@pytest.mark.parametrize("lists_in_root,with_files_prefix", [(False, True), (True, False)])
def test_lists_beside_files_and_bare_names(tmp_path, lists_in_root, with_files_prefix):
    write_official(tmp_path, {"train": [book(1, 4)], "test": [book(9, 2)]}, lists_in_root, with_files_prefix)
    ds = BooksDataset(tmp_path, VOCAB)
    assert [b.list_length for b in ds.books("train")] == [4]


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


TRAIN_STREAM = np.concatenate([np.r_[book(100, 7), END_OF_DOC], np.r_[book(200, 3), END_OF_DOC],
                               np.r_[book(300, 5), END_OF_DOC], np.r_[book(400, 4), END_OF_DOC]])  # 23 tokens


def scored_targets(windows, seq_len):
    """Targets scored, in order, and the context (tokens seen) of each."""
    targets, contexts = [], []
    for _, y, mask in windows:
        for row_y, row_m in zip(y.numpy(), mask.numpy()):
            targets.extend(row_y[row_m])
            contexts.extend(np.flatnonzero(row_m) + 1)
    return np.array(targets), np.array(contexts)


@pytest.mark.parametrize("seq_len,last_n", [(8, 2), (8, 8), (5, 3), (64, 16)])
def test_every_target_protocol_scores_each_target_once_with_long_context(official, seq_len, last_n):
    windows = sliding_windows(official.books("train"), VOCAB, seq_len, last_n, batch_size=3, protocol="every_target")
    targets, contexts = scored_targets(windows, seq_len)
    np.testing.assert_array_equal(targets, TRAIN_STREAM[1:])
    if seq_len < len(TRAIN_STREAM) - 1:  # after the first window, at least seq_len - last_n tokens of context
        assert (contexts[seq_len:] > seq_len - last_n).all()


@pytest.mark.parametrize("seq_len,last_n", [(8, 2), (8, 8), (5, 3), (12, 4), (64, 16)])
def test_last_n_protocol_scores_only_the_last_n_of_every_window(official, seq_len, last_n):
    # The official eval.py: window k reads tokens [k * last_n, k * last_n + seq_len] and scores its last last_n
    # targets, the first window too; the last window is cut short by the end of the stream.
    windows = sliding_windows(official.books("train"), VOCAB, seq_len, last_n, batch_size=3, protocol="last_n")
    targets, contexts = scored_targets(windows, seq_len)
    np.testing.assert_array_equal(targets, TRAIN_STREAM[seq_len - last_n + 1:])  # the first targets: never
    assert (contexts > seq_len - last_n).all()


def test_last_n_window_plan_by_hand():
    # 23 tokens (targets 1..22), windows of 8 scoring their last 2: targets 7..8, 9..10, ..., 21..22.
    assert window_plan(23, 8, 2, "last_n") == [(s, s + 7, s + 8) for s in range(0, 15, 2)]
    # Windows of 12 moved by 4: targets 9..12, 13..16, 17..20, then 21..22 in a window cut short at token 22.
    assert window_plan(23, 12, 4, "last_n") == [(0, 9, 12), (4, 13, 16), (8, 17, 20), (12, 21, 22)]
    assert window_plan(8, 8, 2, "last_n") == [(0, 7, 7)]  # targets 1..7: only 7 is among a window's last 2
    assert window_plan(7, 8, 2, "last_n") == []  # targets 1..6: all in the first window's unscored part
    assert window_plan(23, 12, 4, "every_target") == [(0, 1, 12), (4, 13, 16), (8, 17, 20), (10, 21, 22)]


def test_sharded_slow_eval_covers_the_same_windows(official):
    books = official.books("train")
    for protocol, scored in (("every_target", 22), ("last_n", 22 - 2)):
        whole = sum(int(m.sum()) for _, _, m in sliding_windows(books, VOCAB, 4, 2, 8, protocol=protocol))
        parts = sum(int(m.sum()) for r in range(3)
                    for _, _, m in sliding_windows(books, VOCAB, 4, 2, 8, r, 3, protocol=protocol))
        assert whole == parts == scored


# -- the official release, as its download script leaves it -------------------------------------------------
OFFICIAL_LISTS = ["file_list_train.npy", "file_list_test_iid.npy", "file_list_test_java.npy",
                  "file_list_test_langlearn.npy", "file_list_test_statistics.npy",
                  "file_list_test_woodworking.npy", "file_list_test_discworld.npy"]


@pytest.fixture
def official_download(tmp_path):
    """data/books/file_list_*.npy (one set for every vocabulary) beside data/books/books_16384/files/*.npy.

    Rows are (files/<book>.npy, length): the official loader joins the path to books_16384/. The lengths are
    not this vocabulary's token counts, as in the official release.
    """
    books_dir = tmp_path / "data" / "books"
    (books_dir / f"books_{VOCAB}" / "files").mkdir(parents=True)
    tokens = {}
    for i, name in enumerate(OFFICIAL_LISTS):
        rows = []
        counts, listed = ([5, 2, 4, 3], [2, 5, 4, 3]) if name == "file_list_train.npy" else ([3, 6], [4, 8])
        for j, (n, n_listed) in enumerate(zip(counts, listed)):
            title = f"Book {i}-{j} (A Novel).epub"
            tokens[title] = book(1000 * i + 100 * j, n)
            np.save(books_dir / f"books_{VOCAB}" / "files" / f"{title}.npy", tokens[title].astype(np.uint16))
            rows.append((f"files/{title}.npy", str(n_listed)))
        np.save(books_dir / name, np.array(rows))
    return books_dir, tokens


def test_official_download_loads_with_list_lengths_only_for_balancing(official_download):
    books_dir, tokens = official_download
    ds = BooksDataset(books_dir, VOCAB)
    assert sorted(ds.splits) == ["discworld", "java", "langlearn", "stats", "test", "train", "wood"]
    train = ds.books("train")
    assert [b.list_length for b in train] == [2, 5, 4, 3]
    # Greedy by the listed lengths: 2 -> s0, 5 -> s1, 4 -> s0 (2 < 5), 3 -> s1 (5 < 6). By the files' token
    # counts (5, 2, 4, 3) it would be s0 = books 0, 3 and s1 = books 1, 2: the lists decide, as officially.
    with pytest.warns(ListLengthWarning, match="read to its end") as caught:
        batches = TrainBatches(train, VOCAB, global_batch_size=2, seq_len=4)
        x, y = batches(0)
        x, y = batches(3)  # every book read to the end of its file: cycles of 5 + 4 + 2 and 2 + 3 + 2 tokens
    assert len([w for w in caught if w.category is ListLengthWarning]) == 1  # once, not once per book
    t = [tokens[f"Book 0-{j} (A Novel).epub"] for j in range(4)]
    s0 = np.concatenate([t[0], [END_OF_DOC], t[2], [END_OF_DOC]] * 3)
    s1 = np.concatenate([t[1], [END_OF_DOC], t[3], [END_OF_DOC]] * 3)
    np.testing.assert_array_equal(x[0].numpy(), np.stack([s0[12:16], s1[12:16]]))
    np.testing.assert_array_equal(y[0].numpy(), np.stack([s0[13:17], s1[13:17]]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ListLengthWarning)
        (_, y, mask), = eval_batches(ds.books("test"), VOCAB, batch_size=1, seq_len=16)
    np.testing.assert_array_equal(y[0][mask[0]].numpy(), np.r_[tokens["Book 1-0 (A Novel).epub"][1:], END_OF_DOC,
                                                               tokens["Book 1-1 (A Novel).epub"], END_OF_DOC])


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


def test_truncated_book_file(official):
    path = official.dir / "files" / "train0.npy"
    path.write_bytes(path.read_bytes()[:-4])  # the header promises 7 tokens, the file holds 5
    batches = TrainBatches(BooksDataset(official.data_root, VOCAB).books("train"), VOCAB, 1, 4)
    with pytest.raises(DataError, match="Cannot read.*train0.npy"):
        batches(0)


def test_edited_file_list_fails_its_integrity_hash(official):
    (official.data_root / "integrity.json").write_text(json.dumps({"file_lists": {"file_list_train.npy": "0" * 64}}))
    with pytest.raises(DataError, match="hash"):
        BooksDataset(official.data_root, VOCAB)


def test_more_streams_than_books_is_explained(official):
    with pytest.raises(DataError, match="smaller --batch_size"):
        TrainBatches(official.books("train"), VOCAB, global_batch_size=8, seq_len=4)
