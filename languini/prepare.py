"""Turn a folder of books (split sub-folders of .txt / .txt.gz files) into the official Languini Books layout."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from languini import tokenizer
from languini.atomic_write import write_atomically
from languini.books import INTEGRITY_FILE, DataError, file_list_digest, split_file_name

SUFFIXES = (".txt.gz", ".txt")


def book_name(path: Path) -> str:
    return next(path.name[:-len(s)] for s in SUFFIXES if path.name.endswith(s))


def find_books(src: Path) -> dict[str, list[Path]]:
    """Books per split sub-folder, sorted by file name (the order of the file lists)."""
    if not src.is_dir():
        raise DataError(f"Books folder {src} does not exist.")
    splits = {}
    for sub in sorted(p for p in src.iterdir() if p.is_dir()):
        files = sorted(p for p in sub.iterdir() if p.name.endswith(SUFFIXES))
        if files:
            splits[sub.name] = files
    if not splits:
        raise DataError(f"{src} has no split sub-folders (train/, test/, ...) with .txt or .txt.gz books.")
    names = [book_name(p) for files in splits.values() for p in files]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DataError(f"Book names must be unique across splits; repeated: {', '.join(duplicates[:5])}.")
    return splits


def read_text(path: Path) -> str:
    """The book's text; a DataError naming the book when it cannot be read, is not UTF-8 or holds no text."""
    try:
        data = gzip.open(path).read() if path.name.endswith(".gz") else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz raises any of these
        raise DataError(f"Cannot read the book {path} ({type(e).__name__}: {e}); fix or remove it.") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}).") from e
    if not text.strip():
        raise DataError(f"The book {path} holds no text; remove it (an empty book would count as a book of the "
                        "split with no tokens).")
    return text


def check_out_folder(src: Path, out_root: Path):
    """Refuse an --out that would write into the books folder or nest a dataset in a dataset folder."""
    if out_root.resolve().is_relative_to(src.resolve()):
        raise DataError(f"--out {out_root} is inside the books folder {src}: the dataset would be written into the "
                        "raw corpus. Leave --out out (the repository's data/) or give a folder outside it.")
    if re.fullmatch(r"\.?books_\d+", out_root.name):
        raise DataError(f"--out {out_root} looks like a dataset folder; --out is the data root that will hold "
                        f"books_<vocab>/: pass --out {out_root.parent}.")


def _lines(paths: list[Path]):
    for p in paths:
        for line in read_text(p).split("\n"):
            if line.strip():
                yield line


_sp = None


def _init_worker(model_path: str):
    global _sp
    _sp = tokenizer.load(model_path)


def _tokenise(job: tuple[Path, Path, str]) -> tuple[int, int]:
    src, dst, dtype = job
    text = read_text(src)
    ids = np.asarray(_sp.encode(text), dtype=dtype)
    write_atomically(dst, lambda file: np.save(file, ids))
    return len(text.encode("utf-8")), len(ids)


def prepare_books(src: str | os.PathLike, out_root: str | os.PathLike, vocab_size: int = 16384,
                  tokenizer_model: str | os.PathLike | None = None, workers: int | None = None,
                  overwrite: bool = False, quiet: bool = False) -> Path:
    """Write <out_root>/books_<vocab>/ (files/, file lists, tokenizer.model, manifest.tsv, integrity.json).

    Everything is built in a temporary folder that is renamed at the end, so a crash leaves nothing half-written.
    """
    src, out_root = Path(src), Path(out_root)
    splits = find_books(src)
    check_out_folder(src, out_root)
    final = out_root / f"books_{vocab_size}"
    if final.exists() and not overwrite:
        raise DataError(f"{final} already exists; pass --overwrite true to replace it.")
    tmp = out_root / f".books_{vocab_size}.tmp-{os.getpid()}"
    created = [p for p in (out_root, *out_root.parents) if not p.exists()]  # removed again if this fails
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "files").mkdir(parents=True)
    try:
        model_path = tmp / "tokenizer.model"
        if tokenizer_model is not None:
            shutil.copyfile(tokenizer_model, model_path)
        else:
            if "train" not in splits:
                raise DataError(f"{src} has no train/ folder to train the tokenizer on; pass --tokenizer MODEL.")
            t0 = time.time()
            if not quiet:
                print(f"Training a {vocab_size}-token BPE model on {len(splits['train'])} train books ...")
            tokenizer.train_bpe(_lines(splits["train"]), model_path, vocab_size)
            if not quiet:
                print(f"  done in {time.time() - t0:.0f}s")
        size = tokenizer.load(model_path).get_piece_size()
        if size != vocab_size:
            raise DataError(f"The tokenizer has {size} tokens but --vocab_size is {vocab_size}.")
        dtype = "uint16" if vocab_size < np.iinfo(np.uint16).max else "uint32"

        jobs = [(p, tmp / "files" / f"{book_name(p)}.npy", dtype) for files in splits.values() for p in files]
        with ProcessPoolExecutor(workers or os.cpu_count(), initializer=_init_worker,
                                 initargs=(str(model_path),)) as pool:
            counts = list(tqdm(pool.map(_tokenise, jobs), total=len(jobs), desc="tokenising", unit="book",
                               disable=True if quiet else None))

        manifest = ["split\tname\tsource\tbytes\ttokens"]
        digests, file_digests, i = {}, {}, 0
        for split, files in splits.items():
            rows = []
            for p in files:
                n_bytes, n_tokens = counts[i]
                i += 1
                rows.append((f"files/{book_name(p)}.npy", str(n_tokens)))
                file_digests[rows[-1][0]] = file_list_digest(tmp / rows[-1][0])  # checked before training
                manifest.append(f"{split}\t{book_name(p)}\t{p.relative_to(src)}\t{n_bytes}\t{n_tokens}")
            list_path = tmp / split_file_name(split)
            np.save(list_path, np.array(rows))
            digests[list_path.name] = file_list_digest(list_path)
        (tmp / "manifest.tsv").write_text("\n".join(manifest) + "\n")
        integrity = {"file_lists": digests, "files": file_digests}
        (tmp / INTEGRITY_FILE).write_text(json.dumps(integrity, indent=1) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:  # innermost first: a failed run leaves no empty output folders behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    if not quiet:
        total_bytes = sum(c[0] for c in counts)
        total_tokens = sum(c[1] for c in counts)
        print(f"Wrote {final}: {len(jobs)} books, {total_tokens:,} tokens, "
              f"{total_bytes / max(total_tokens, 1):.2f} bytes per token.")
    return final
