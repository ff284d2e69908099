"""Languini Books data: the official on-disk format and the stream batching of the paper (section 5).

On disk (read unchanged from the official release, and written by scripts/prepare_books.py):
    <data_root>/books_<vocab>/files/<name>.npy      one token array per book (uint16 when vocab < 65535)
    file_list_<split>.npy                            rows of (path, length), next to files/ or in <data_root>
A book's path in a file list is relative to books_<vocab>/ (or to books_<vocab>/files/).

Batching: the books of a split, in file-list order, are handed greedily to `n_streams` streams (each
book goes to the stream with the fewest tokens so far). A stream is its books joined by an end-of-document
token. Step s of training reads tokens [s*T, s*T + T + 1) of every stream, so a stateful model sees
contiguous text per stream, and the data of a step depends only on the step number (exact resume).
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

END_OF_DOC = 2  # SentencePiece's </s>, as in the official Languini code
PAD = 0  # pad positions are masked out of the loss; the id itself never matters

# Official file-list names for the official split names; any other split X lives in file_list_X.npy.
OFFICIAL_SPLIT_FILES = {
    "train": "file_list_train.npy",
    "test": "file_list_test_iid.npy",
    "langlearn": "file_list_test_langlearn.npy",
    "discworld": "file_list_test_discworld.npy",
    "java": "file_list_test_java.npy",
    "stats": "file_list_test_statistics.npy",
    "wood": "file_list_test_woodworking.npy",
}
INTEGRITY_FILE = "integrity.json"


class DataError(RuntimeError):
    """Missing, corrupt or mismatched data; the message says what to do."""


def split_file_name(split: str) -> str:
    return OFFICIAL_SPLIT_FILES.get(split, f"file_list_{split}.npy")


def split_name(file_name: str) -> str:
    for split, official in OFFICIAL_SPLIT_FILES.items():
        if file_name == official:
            return split
    return file_name[len("file_list_"):-len(".npy")]


def file_list_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Book:
    path: Path
    length: int  # tokens, without the end-of-document token


class BooksDataset:
    """A tokenised book collection in the official Languini layout."""

    def __init__(self, data_root: str | os.PathLike, vocab_size: int):
        self.data_root = Path(data_root)
        self.vocab_size = vocab_size
        self.dir = self.data_root / f"books_{vocab_size}"
        # for run names and results.json, beside the fingerprint: books_16384, default_corpus_books_2048
        root_name = self.data_root.resolve().name
        self.name = self.dir.name if root_name in ("data", "") else f"{root_name}_{self.dir.name}"
        prepare = "prepare it with: python scripts/prepare_books.py BOOKS_FOLDER --out " + str(self.data_root)
        if not self.dir.is_dir():
            found = sorted(p.name for p in self.data_root.glob("books_*")) if self.data_root.is_dir() else []
            hint = f" It holds {', '.join(found)}: pass the matching --vocab_size." if found else f" {prepare}."
            raise DataError(f"No dataset for vocab {vocab_size}: {self.dir} does not exist.{hint}")
        self.list_dir = self.dir if any(self.dir.glob("file_list_*.npy")) else self.data_root
        lists = sorted(self.list_dir.glob("file_list_*.npy"))
        if not lists:
            raise DataError(f"No file_list_<split>.npy in {self.dir} or {self.data_root}; {prepare}.")
        self.splits = [split_name(p.name) for p in lists]
        self._check_integrity()
        self._books: dict[str, list[Book]] = {}

    def _check_integrity(self):
        integrity = self.list_dir / INTEGRITY_FILE
        if not integrity.exists():
            return  # the official release ships no hashes
        expected = json.loads(integrity.read_text())["file_lists"]
        for split in self.splits:
            name = split_file_name(split)
            if name in expected and file_list_digest(self.list_dir / name) != expected[name]:
                raise DataError(f"{self.list_dir / name} does not match its hash in {integrity}: "
                                "the dataset is corrupt or was edited; prepare it again.")

    @functools.cached_property
    def fingerprint(self) -> str:
        """12 hex digits that name the tokenised data: a hash of the sha256 of every file list (the hashes
        prepare_books writes to integrity.json), so of every book's name and token count in every split.
        The official release, which ships no integrity.json, is fingerprinted the same way."""
        lists = sorted(split_file_name(s) for s in self.splits)
        digests = "".join(f"{name} {file_list_digest(self.list_dir / name)}\n" for name in lists)
        return hashlib.sha256(digests.encode()).hexdigest()[:12]

    def books(self, split: str) -> list[Book]:
        if split not in self.splits:
            raise DataError(f"Split '{split}' not in {self.list_dir}; available: {', '.join(self.splits)}.")
        if split not in self._books:
            path = self.list_dir / split_file_name(split)
            try:
                rows = np.load(path)
            except Exception as e:  # numpy raises several types for truncated or foreign files
                raise DataError(f"Cannot read {path} ({e}); prepare the dataset again.") from e
            if rows.ndim != 2 or rows.shape[1] != 2:
                raise DataError(f"{path} should hold rows of (path, length), found shape {rows.shape}.")
            self._books[split] = [Book(self._resolve(str(p)), int(n)) for p, n in rows]
        return self._books[split]

    def _resolve(self, rel: str) -> Path:
        for base in (self.dir, self.dir / "files"):
            if (base / rel).exists():
                return base / rel
        raise DataError(f"Book {rel} listed in the file lists of {self.dir} is missing; prepare the dataset again.")

    def tokenizer_path(self) -> Path | None:
        for p in (self.dir / "tokenizer.model", self.dir / f"books_{self.vocab_size}.model",
                  self.data_root / f"books_{self.vocab_size}.model"):
            if p.exists():
                return p
        return None


def distribute(lengths: list[int], n_streams: int) -> list[list[int]]:
    """Greedy assignment of books (in order) to the stream with the fewest tokens; ties go to the lowest id."""
    streams: list[list[int]] = [[] for _ in range(n_streams)]
    load = np.zeros(n_streams, dtype=np.int64)
    for i, n in enumerate(lengths):
        s = int(np.argmin(load))
        streams[s].append(i)
        load[s] += n
    return streams


class Stream:
    """Books joined by END_OF_DOC, addressed by token position; optionally repeating forever."""

    def __init__(self, books: list[Book], vocab_size: int, repeat: bool):
        self.books, self.vocab_size, self.repeat = books, vocab_size, repeat
        self.starts = np.cumsum([0] + [b.length + 1 for b in books]).tolist()
        self.length = self.starts[-1]  # one cycle, end-of-document tokens included
        self._open: tuple[int, np.ndarray] | None = None

    def _book(self, i: int) -> np.ndarray:
        if self._open is None or self._open[0] != i:
            book = self.books[i]
            try:
                tokens = np.load(book.path, mmap_mode="r")
            except Exception as e:
                raise DataError(f"Cannot read {book.path} ({e}); prepare the dataset again.") from e
            if tokens.ndim != 1 or len(tokens) != book.length:
                raise DataError(f"{book.path} holds {tokens.shape} tokens but its file list says {book.length}: "
                                "the dataset is corrupt; prepare it again.")
            self._open = (i, tokens)
        return self._open[1]

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n); past the end of a non-repeating stream the rest is missing (shorter)."""
        out = []
        pos, end = start, start + n
        if not self.repeat:
            end = min(end, self.length)
        while pos < end:
            cycle_pos = pos % self.length if self.repeat else pos
            i = bisect.bisect_right(self.starts, cycle_pos) - 1
            offset = cycle_pos - self.starts[i]
            take = min(end - pos, self.books[i].length + 1 - offset)
            book = self._book(i)
            piece = np.empty(take, dtype=np.int64)
            from_book = min(take, self.books[i].length - offset)
            piece[:from_book] = book[offset:offset + from_book]
            piece[from_book:] = END_OF_DOC  # at most one token: the separator after the book
            out.append(piece)
            pos += take
        tokens = np.concatenate(out) if out else np.empty(0, dtype=np.int64)
        if tokens.size and tokens.max() >= self.vocab_size:
            raise DataError(f"Token id {int(tokens.max())} >= vocab size {self.vocab_size} in the books of this "
                            "split: the model and the data use different vocabularies.")
        return tokens


class TrainBatches:
    """Training batches of one data-parallel rank, as a pure function of the step number.

    The global batch has `global_batch_size` streams; rank r of W owns streams r, r+W, ...; its streams are
    split into `micro_batches` groups of equal size for gradient accumulation.
    """

    def __init__(self, books: list[Book], vocab_size: int, global_batch_size: int, seq_len: int,
                 micro_batches: int = 1, rank: int = 0, world_size: int = 1):
        if global_batch_size % world_size:
            raise ValueError(f"batch size {global_batch_size} is not divisible by {world_size} processes")
        local = global_batch_size // world_size
        if local % micro_batches:
            raise ValueError(f"per-process batch {local} is not divisible into {micro_batches} micro-batches")
        if not books:
            raise DataError("The training split holds no books.")
        assignment = distribute([b.length for b in books], global_batch_size)
        self.stream_ids = list(range(rank, global_batch_size, world_size))
        empty = [s for s in self.stream_ids if not assignment[s]]
        if empty:
            raise DataError(f"Only {len(books)} books for {global_batch_size} streams: streams {empty[:5]} are empty. "
                            "Use a smaller --batch_size or more books.")
        self.streams = [Stream([books[i] for i in assignment[s]], vocab_size, repeat=True) for s in self.stream_ids]
        self.seq_len, self.micro_batches = seq_len, micro_batches

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of shape (micro_batches, per_micro_batch, seq_len)."""
        T = self.seq_len
        seq = np.stack([s.read(step * T, T + 1) for s in self.streams])
        seq = torch.from_numpy(seq).view(self.micro_batches, -1, T + 1)
        return seq[..., :-1], seq[..., 1:]


def eval_batches(books: list[Book], vocab_size: int, batch_size: int, seq_len: int,
                 rank: int = 0, world_size: int = 1, max_batches: int | None = None):
    """Each eval stream once, in windows of seq_len; yields (inputs, targets, mask) of shape (B_local, seq_len).

    Streams run out at different times: their missing positions are padded and masked out of the loss.
    """
    if batch_size % world_size:
        raise ValueError(f"eval batch size {batch_size} is not divisible by {world_size} processes")
    assignment = distribute([b.length for b in books], batch_size)
    # Streams without books (fewer books than the batch) would only add rows of padding.
    streams = [Stream([books[i] for i in assignment[s]], vocab_size, repeat=False)
               for s in range(rank, batch_size, world_size) if assignment[s]]
    longest = max((s.length for s in streams), default=1)
    n_batches = -(-(longest - 1) // seq_len)  # every token but the first of a stream is a target once
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for b in range(n_batches):
        seq = np.full((len(streams), seq_len + 1), PAD, dtype=np.int64)
        valid = np.zeros((len(streams), seq_len + 1), dtype=bool)
        for i, s in enumerate(streams):
            tokens = s.read(b * seq_len, seq_len + 1)
            seq[i, :len(tokens)] = tokens
            valid[i, :len(tokens)] = True
        seq, valid = torch.from_numpy(seq), torch.from_numpy(valid)
        yield seq[:, :-1], seq[:, 1:], valid[:, 1:]


def sliding_windows(books: list[Book], vocab_size: int, seq_len: int, stride: int, batch_size: int,
                    rank: int = 0, world_size: int = 1, max_windows: int | None = None):
    """The slow eval of section 4.2.1: the split as one stream, windows of seq_len moved by `stride`.

    The first window scores all its predictions, every later one only its last `stride`, so every target is
    scored exactly once and, after the first window, with at least seq_len - stride tokens of context.
    Windows are independent, so they are batched (`batch_size` at a time) with the same numbers as batch 1.
    Yields (inputs, targets, mask) of shape (n, seq_len).
    """
    if not 0 < stride <= seq_len:
        raise ValueError(f"stride must be in (0, seq_len], got {stride}")
    stream = Stream(books, vocab_size, repeat=False)
    last = stream.length - 1  # index of the last target
    ends, e = [], min(seq_len, last)
    ends.append(e)
    while e < last:
        e = min(e + stride, last)
        ends.append(e)
    if max_windows is not None:
        ends = ends[:max_windows]
    mine = list(range(rank, len(ends), world_size))
    for i in range(0, len(mine), batch_size):
        seq = np.full((len(mine[i:i + batch_size]), seq_len + 1), PAD, dtype=np.int64)
        mask = np.zeros((seq.shape[0], seq_len), dtype=bool)
        for row, k in enumerate(mine[i:i + batch_size]):
            start = max(ends[k] - seq_len, 0)
            tokens = stream.read(start, ends[k] + 1 - start)
            seq[row, :len(tokens)] = tokens
            first_scored = 1 if k == 0 else ends[k - 1] + 1  # absolute index of the first new target
            mask[row, first_scored - start - 1:len(tokens) - 1] = True
        seq = torch.from_numpy(seq)
        yield seq[:, :-1], seq[:, 1:], torch.from_numpy(mask)
