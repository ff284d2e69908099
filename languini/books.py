"""Languini Books data: the official on-disk format and the stream batching of the paper (section 5).

On disk (read unchanged from the official release, and written by scripts/prepare_books.py):
    <data_root>/books_<vocab>/files/<name>.npy      one token array per book (uint16 when vocab < 65535)
    file_list_<split>.npy                            rows of (path, length), next to files/ or in <data_root>
A book's path in a file list is relative to books_<vocab>/ (or to books_<vocab>/files/). The official
release keeps one set of file lists, in <data_root> beside every books_<vocab>/, so a list's length column
is not the token count of every vocabulary: as in the official loader, the lengths only balance books over
streams, and every book is read to the end of its token file.

Batching: the books of a split, in file-list order, are handed greedily to `n_streams` streams (each
book goes to the stream with the fewest tokens so far, by the list's lengths). A stream is its books joined
by an end-of-document token. Step s of training reads tokens [s*T, s*T + T + 1) of every stream, so a
stateful model sees contiguous text per stream, and the data of a step depends only on the step number
(exact resume).
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# Token 2 ends a document: <D> in the official vocabularies (a user-defined piece that decodes to the three
# characters "<D>"), </s> in the ones prepare_books.py trains (a control token that decodes to nothing).
END_OF_DOC = 2
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
# The official README's hash of `integrity_test.py data/books/books_16384` (see listing_digest).
OFFICIAL_LISTING_SHA256 = {"books_16384": "0957d626c108d0075c18a5a99fa766533a46b2fba833061fdce445c6066558f7"}


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


def listing_digest(folder: Path) -> str:
    """The official release's integrity hash of a folder: SHA-256 over one line "<size>\t<file name>\n" per
    file below it, sorted by name, then size. It sees names and sizes, not contents."""
    files = sorted((p.name, p.stat().st_size) for p in Path(folder).rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for name, size in files:
        digest.update(f"{size}\t{name}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Book:
    path: Path
    list_length: int  # the file list's length column: it only balances books over streams


class ListLengthWarning(UserWarning):
    """A file list's lengths differ from its token files (as in the official release, whose lists serve every
    vocabulary)."""


_warned_about_lengths: set[Path] = set()


def _warn_list_length(book: Book, tokens: int) -> None:
    folder = book.path.parent
    if folder in _warned_about_lengths:
        return
    _warned_about_lengths.add(folder)
    warnings.warn(f"{book.path} holds {tokens} tokens but its file list says {book.list_length} (the official "
                  "release has one set of lists for every vocabulary). As the official loader does, the lists' "
                  "lengths only balance books over streams and every book is read to its end. Shown once for "
                  f"{folder}.", ListLengthWarning, stacklevel=3)


# numpy parses .npy headers with ast.literal_eval, which CPython 3.11 and 3.12 do not make thread-safe ("AST
# constructor recursion depth mismatch" when two threads parse at once: the batch prefetch, an evaluation, the data
# check's readers): every header of the kitchen is parsed under this lock.
NPY_HEADER_LOCK = threading.Lock()


def load_npy(path: Path, mmap_mode: str | None = None) -> np.ndarray:
    """np.load with its header parsed under NPY_HEADER_LOCK (a memory map is made at once; reading it is free)."""
    with NPY_HEADER_LOCK:
        return np.load(path, mmap_mode=mmap_mode)


def token_count(path: Path) -> int:
    """Tokens in a book's .npy file, read from its header alone."""
    try:
        with NPY_HEADER_LOCK, open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, _ = read_header(f)
    except Exception as e:  # numpy raises several types for truncated or foreign files
        raise DataError(f"Cannot read {path} ({e}); prepare the dataset again.") from e
    if len(shape) != 1:
        raise DataError(f"{path} holds an array of shape {shape}, not a sequence of tokens; prepare it again.")
    return shape[0]


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
                rows = load_npy(path)
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
    """Books joined by END_OF_DOC, addressed by token position; optionally repeating forever.

    A book's length is read from its file's header when the stream first reaches it, so a stream of many
    thousand books opens instantly.
    """

    def __init__(self, books: list[Book], vocab_size: int, repeat: bool):
        self.books, self.vocab_size, self.repeat = books, vocab_size, repeat
        self.starts = [0]  # starts[i]: position of book i; one more entry per book measured so far
        self._open: tuple[int, np.ndarray] | None = None

    def _measure(self, until: int | None = None) -> None:
        """Read book lengths until position `until` lies inside a measured book (None: all of them)."""
        while len(self.starts) <= len(self.books) and (until is None or self.starts[-1] <= until):
            book = self.books[len(self.starts) - 1]
            tokens = token_count(book.path)
            if tokens != book.list_length:
                _warn_list_length(book, tokens)
            self.starts.append(self.starts[-1] + tokens + 1)

    @property
    def length(self) -> int:
        """Tokens in one cycle, end-of-document tokens included."""
        self._measure()
        return self.starts[-1]

    def _book(self, i: int) -> np.ndarray:
        if self._open is None or self._open[0] != i:
            try:
                tokens = load_npy(self.books[i].path, mmap_mode="r")
            except Exception as e:
                raise DataError(f"Cannot read {self.books[i].path} ({e}); prepare the dataset again.") from e
            self._open = (i, tokens)
        return self._open[1]

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n); past the end of a non-repeating stream the rest is missing (shorter)."""
        out = []
        pos, end = start, start + n
        if not self.repeat:
            end = min(end, self.length)
        while pos < end:
            self._measure(until=pos)
            cycle_pos = pos if pos < self.starts[-1] else pos % self.starts[-1]  # past one cycle: all measured
            i = bisect.bisect_right(self.starts, cycle_pos) - 1
            offset = cycle_pos - self.starts[i]
            book_tokens = self.starts[i + 1] - self.starts[i] - 1
            take = min(end - pos, book_tokens + 1 - offset)
            piece = np.empty(take, dtype=np.int64)
            from_book = min(take, book_tokens - offset)
            if from_book > 0:
                piece[:from_book] = self._book(i)[offset:offset + from_book]
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
    split into `micro_batches` groups of equal size for gradient accumulation. With a `schedule`
    (languini.stages) the length changes with the step and each stream continues at its running offset.
    """

    def __init__(self, books: list[Book], vocab_size: int, global_batch_size: int, seq_len: int,
                 micro_batches: int = 1, rank: int = 0, world_size: int = 1, schedule=None):
        if global_batch_size % world_size:
            raise ValueError(f"batch size {global_batch_size} is not divisible by {world_size} processes")
        local = global_batch_size // world_size
        if local % micro_batches:
            raise ValueError(f"per-process batch {local} is not divisible into {micro_batches} micro-batches")
        if not books:
            raise DataError("The training split holds no books.")
        assignment = distribute([b.list_length for b in books], global_batch_size)
        self.stream_ids = list(range(rank, global_batch_size, world_size))
        empty = [s for s in self.stream_ids if not assignment[s]]
        if empty:
            raise DataError(f"Only {len(books)} books for {global_batch_size} streams: streams {empty[:5]} are empty. "
                            "Use a smaller --batch_size or more books.")
        self.streams = [Stream([books[i] for i in assignment[s]], vocab_size, repeat=True) for s in self.stream_ids]
        self.seq_len, self.micro_batches, self.schedule = seq_len, micro_batches, schedule

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of shape (micro_batches, per_micro_batch, the step's seq_len); with a schedule whose
        stage reads r sequences per stream (languini.stages.rows_per_stream), a stream's r rows are adjacent."""
        if self.schedule is None:
            T, starts = self.seq_len, [step * self.seq_len]
        else:
            T, starts = self.schedule.seq_len_at(step), self.schedule.row_starts(step)
        seq = np.stack([s.read(start, T + 1) for s in self.streams for start in starts])
        seq = torch.from_numpy(seq).view(self.micro_batches, -1, T + 1)
        return seq[..., :-1], seq[..., 1:]


def eval_batches(books: list[Book], vocab_size: int, batch_size: int, seq_len: int,
                 rank: int = 0, world_size: int = 1, max_batches: int | None = None):
    """Each eval stream once, in windows of seq_len; yields (inputs, targets, mask) of shape (B_local, seq_len).

    Streams run out at different times: their missing positions are padded and masked out of the loss.
    """
    if batch_size % world_size:
        raise ValueError(f"eval batch size {batch_size} is not divisible by {world_size} processes")
    assignment = distribute([b.list_length for b in books], batch_size)
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


SLOW_EVAL_PROTOCOLS = ("last_n", "every_target")
# which windows a capped slow eval reads: evenly spaced over the split, or the split's first targets
SLOW_EVAL_SAMPLES = ("spread", "first")


def window_plan(stream_length: int, seq_len: int, last_n: int, protocol: str) -> list[tuple[int, int, int]]:
    """The windows of the slow eval over a stream of `stream_length` tokens, as (first input position, first
    and last scored target position), where target position t is predicted from the tokens before it.

    last_n (the official eval.py, which made the paper's tables): windows start at 0, last_n, 2 last_n, ...
    and each, the first included, scores only its last `last_n` targets, so every target from position
    seq_len - last_n + 1 on is scored once with at least seq_len - last_n tokens of context, and the first
    seq_len - last_n targets of the split are not scored; the last window may be short (padded).
    every_target: the first window scores all its targets, every later one, moved by last_n, its last
    last_n; the last window ends on the last target. Every target is scored once.
    """
    if protocol not in SLOW_EVAL_PROTOCOLS:
        raise ValueError(f"slow eval protocol must be one of {', '.join(SLOW_EVAL_PROTOCOLS)}, not {protocol!r}")
    if not 0 < last_n <= seq_len:
        raise ValueError(f"last_n must be in (0, seq_len={seq_len}], got {last_n}")
    last = stream_length - 1  # position of the last target
    if protocol == "last_n":
        first = seq_len - last_n + 1
        return [(start, start + first, min(start + seq_len, last)) for start in range(0, last - first + 1, last_n)]
    windows, end = [(0, 1, min(seq_len, last))], min(seq_len, last)
    while end < last:
        new_end = min(end + last_n, last)
        windows.append((max(new_end - seq_len, 0), end + 1, new_end))
        end = new_end
    return windows


def first_windows(windows: list[tuple[int, int, int]], targets: int) -> list[tuple[int, int, int]]:
    """The windows of a window_plan that score the stream's first `targets` targets (positions 1..targets), the
    last one cut there: with the every_target protocol, the same targets a stateful model's first
    targets / seq_len windows score."""
    kept = []
    for start, first, last in windows:
        if first > targets:
            break
        kept.append((start, first, min(last, targets)))
    return kept


def spread(items: list, count: int | None) -> list:
    """`count` of the items, evenly spaced from the first (all of them when count is None or not smaller): a
    capped slow evaluation samples the whole split, not only its start."""
    if count is None or count >= len(items):
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def sliding_windows(books: list[Book], vocab_size: int, seq_len: int, last_n: int, batch_size: int,
                    rank: int = 0, world_size: int = 1, max_windows: int | None = None, protocol: str = "last_n",
                    sample: str = "spread"):
    """The slow eval of section 4.2.1: the split as one stream, in windows of seq_len (see window_plan).

    Windows are independent, so they are batched (`batch_size` at a time) with the same numbers as batch 1
    and shared among `world_size` processes; `max_windows` of them, evenly spaced over the split (sample
    spread), or (sample first) those scoring the split's first max_windows x seq_len targets (first_windows).
    Yields (inputs, targets, mask) of shape (n, seq_len).
    """
    if sample not in SLOW_EVAL_SAMPLES:
        raise ValueError(f"slow eval sample must be one of {', '.join(SLOW_EVAL_SAMPLES)}, not {sample!r}")
    stream = Stream(books, vocab_size, repeat=False)
    plan = window_plan(stream.length, seq_len, last_n, protocol)
    windows = (first_windows(plan, max_windows * seq_len) if sample == "first" and max_windows is not None
               else spread(plan, max_windows))
    mine = windows[rank::world_size]
    for i in range(0, len(mine), batch_size):
        batch = mine[i:i + batch_size]
        seq = np.full((len(batch), seq_len + 1), PAD, dtype=np.int64)
        mask = np.zeros((len(batch), seq_len), dtype=bool)
        for row, (start, first, last) in enumerate(batch):
            tokens = stream.read(start, seq_len + 1)
            seq[row, :len(tokens)] = tokens
            mask[row, first - start - 1:last - start] = True  # the target at position t is column t - start - 1
        seq = torch.from_numpy(seq)
        yield seq[:, :-1], seq[:, 1:], torch.from_numpy(mask)
