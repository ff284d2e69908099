"""The check of a run's data before step 1, so a bad file fails the run at start and not after a day of training.

Every book of every split the run evaluates is read in full: a readable .npy of one row of integer token ids,
all below the vocab size, matching its SHA-256 when the dataset's integrity.json lists one (prepare_books.py
writes them). Training books are checked without reading their tokens (that would take as long as an epoch):
readable header, integer dtype, file as long as its header says. A list length that differs from the file's
token count is a warning: the official file lists are shared by every vocabulary, and the lengths only balance
the streams.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch.distributed as dist
from tqdm import tqdm

from languini.books import INTEGRITY_FILE, NPY_HEADER_LOCK, Book, BooksDataset, DataError, file_list_digest, load_npy

MAX_LISTED = 10  # bad files named in the error; the rest are counted


def eval_splits(dataset: BooksDataset) -> list[str]:
    """The splits a run evaluates: every split but train (all at the end; valid, else test, during training)."""
    return [s for s in dataset.splits if s != "train"]


def _header(path) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, bytes the file must have) from a .npy header, without reading the data."""
    with NPY_HEADER_LOCK, open(path, "rb") as f:  # the checking threads take turns at headers
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        return shape, dtype, f.tell() + int(np.prod(shape)) * dtype.itemsize


def check_book(book: Book, vocab_size: int, read_tokens: bool, sha256: str | None = None
               ) -> tuple[str | None, str | None]:
    """(what is wrong with the book's file or None, a warning or None)."""
    try:
        shape, dtype, size = _header(book.path)
    except Exception as e:  # numpy raises several types for truncated or foreign headers
        return f"cannot be read ({e})", None
    if len(shape) != 1:
        return f"holds an array of shape {shape}, not one row of token ids", None
    if dtype.kind not in "ui":
        return f"holds {dtype} values, not integer token ids (prepare_books.py writes uint16)", None
    actual = os.path.getsize(book.path)
    if actual < size:
        return f"is truncated: {actual:,} bytes where its header promises {size:,}", None
    warning = None if shape[0] == book.list_length else f"{shape[0]:,} tokens where the file list says {book.list_length:,}"
    if read_tokens and shape[0]:
        tokens = load_npy(book.path, mmap_mode="r")
        low, high = int(tokens.min()), int(tokens.max())
        if high >= vocab_size or low < 0:
            return (f"holds token id {high if high >= vocab_size else low}, outside the vocab 0..{vocab_size - 1}: "
                    "it was made with another tokenizer or is corrupt"), warning
    if read_tokens and sha256 is not None and file_list_digest(book.path) != sha256:
        return f"does not match its SHA-256 in {INTEGRITY_FILE}: the file is corrupt or was edited", warning
    return None, warning


def _file_hashes(dataset: BooksDataset) -> dict[str, str]:
    integrity = dataset.list_dir / INTEGRITY_FILE
    return json.loads(integrity.read_text()).get("files", {}) if integrity.exists() else {}


def check(dataset: BooksDataset, progress: bool = True) -> list[str]:
    """Raise one DataError naming every bad file (and what to do); return the warnings."""
    problems, warnings = [], []
    evaluated = eval_splits(dataset)
    if not {"valid", "test"} & set(evaluated):
        problems.append(f"no valid or test split in {dataset.list_dir}: the run evaluates one of them during "
                        "training")
    hashes = _file_hashes(dataset)
    jobs = []
    for split in ["train", *evaluated]:
        try:
            books = dataset.books(split)
        except DataError as e:  # an unreadable file list or a missing book
            problems.append(str(e))
            continue
        if not books and split != "train":  # an empty train split has its own error when batches are made
            problems.append(f"split {split} has no books; an evaluation of it would score nothing")
        for book in books:  # books resolve inside dataset.dir, where integrity.json's paths start
            jobs.append((split, book, split != "train", hashes.get(book.path.relative_to(dataset.dir).as_posix())))
    with ThreadPoolExecutor(8) as pool:  # file opens dominate on network filesystems
        results = pool.map(lambda job: check_book(job[1], dataset.vocab_size, job[2], job[3]), jobs)
        results = list(tqdm(results, total=len(jobs), desc="checking data", unit="book", disable=None if progress else True,
                            leave=False))
    mismatched: dict[str, list[str]] = {}
    for (split, book, _, _), (problem, warning) in zip(jobs, results):
        if problem:
            problems.append(f"{book.path} (split {split}) {problem}")
        if warning:
            mismatched.setdefault(split, []).append(f"{book.path.name}: {warning}")
    for split, found in mismatched.items():
        warnings.append(f"Warning: {len(found)} book(s) of split {split} hold another number of tokens than the "
                        f"file list says (first: {found[0]}); the list's lengths are used only to balance streams.")
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED])
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise DataError(f"The data check before training found {len(problems)} problem(s) in {dataset.dir}; "
                        f"nothing was trained:\n{listed}{more}\nPrepare the dataset again (python "
                        f"scripts/prepare_books.py BOOKS_FOLDER --out {dataset.data_root} --overwrite true), or "
                        "restore these files from where you got them.")
    return warnings


def check_run_data(dataset: BooksDataset, say=print, rank: int = 0, world_size: int = 1) -> None:
    """`check` on rank 0 with its warnings said; every process raises the same DataError when it fails."""
    failure = None
    if rank == 0:
        try:
            for warning in check(dataset):
                say(warning)
        except DataError as e:
            failure = str(e)
    if world_size > 1:
        box = [failure]
        dist.broadcast_object_list(box, src=0)
        failure = box[0]
    if failure is not None:
        raise DataError(failure)
