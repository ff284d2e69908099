"""Which dataset a run trains on: --data_root, else a books_<vocab>/ prepared under data/, else the embedded
default corpus; and the SentencePiece model that counts its bytes."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch.distributed as dist

from languini import default_corpus, tokenizer
from languini.books import BooksDataset, DataError
from languini.prepare import find_books

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data"


def data_search_roots() -> list[Path]:
    """Where a prepared dataset is looked for without --data_root: the repository's data/ (and data/books/),
    then ./data."""
    roots = [DEFAULT_DATA, DEFAULT_DATA / "books"]  # data/books/books_16384: as the official download leaves it
    if (Path.cwd() / "data").resolve() != DEFAULT_DATA.resolve():
        roots += [Path.cwd() / "data", Path.cwd() / "data" / "books"]
    return roots


def prepared_datasets(root: Path) -> dict[int, Path]:
    """The books_<vocab>/ folders directly under root, by vocab size."""
    found = {}
    for path in sorted(root.glob("books_*")) if root.is_dir() else []:
        vocab = path.name[len("books_"):]
        if path.is_dir() and vocab.isdigit():
            found[int(vocab)] = path
    return found


def dataset_vocab(root: Path, config_vocab: int, vocab_given: bool) -> int | None:
    """The vocab of the dataset to train on under root: the config's if prepared (or given with --vocab_size),
    else the only one there; None when root holds no dataset."""
    found = prepared_datasets(root)
    if not found:
        return None
    if config_vocab in found or vocab_given:
        return config_vocab  # a --vocab_size with no dataset fails in BooksDataset, naming what is there
    if len(found) == 1:
        return next(iter(found))
    raise DataError(f"{root} holds several datasets ({', '.join(p.name for p in found.values())}) and none for the "
                    f"config's vocab {config_vocab}: choose one with --vocab_size.")


PREPARE = "python scripts/prepare_books.py ../shared/data/pgbooks"  # a folder of books with split sub-folders


def prepare_hint(out: Path | None = None) -> str:
    """The command that prepares a dataset (into `out`; None: the repository's data/, where runs find it)."""
    return PREPARE + (f" --out {out}" if out is not None else "") + " (or any folder of books: BOOKS/train/*.txt, ...)"


def misplaced_root(root: Path) -> str | None:
    """Why `root`, given as --data_root, is not a data root when it is what one might pass by mistake: a dataset
    folder itself (whose parent is the root), or a folder of raw books (to prepare, not to write into)."""
    if re.fullmatch(r"books_\d+", root.name) or any(root.glob("file_list_*.npy")):
        return (f"--data_root {root} is a dataset folder itself; --data_root is the folder that holds it: "
                f"--data_root {root.parent}.")
    try:
        find_books(root)
    except DataError:
        return None
    return (f"--data_root {root} holds raw books (split folders of .txt/.txt.gz), not a prepared dataset. Prepare "
            f"them with: python scripts/prepare_books.py {root} (the dataset goes to the repository's data/, where "
            "runs find it without --data_root).")


def load_data(data_root: str | None, model_cfg, vocab_given: bool, say, ddp, smoke_corpus: bool = True,
              dry_run: bool = False) -> tuple[BooksDataset | None, object]:
    """The dataset and the model config, its vocab set to the data's unless --vocab_size was given.

    `data_root` (--data_root), else a dataset prepared under data/ (data_search_roots), else, for a config sized
    for the smoke test (`smoke_corpus`: 'cpu', '*_cpu'), the embedded default corpus (built once, by rank 0 of
    `ddp`). A paper config never trains on that corpus: without prepared data a dry run gets (None, model_cfg),
    the config as published, and a run stops naming the command that prepares the data."""
    if data_root is not None:
        root = Path(data_root)
        if not root.is_dir():
            raise DataError(f"--data_root {root} does not exist. Prepare a dataset there with {prepare_hint(root)}.")
        vocab = dataset_vocab(root, model_cfg.vocab_size, vocab_given)
        if vocab is None:
            raise DataError(misplaced_root(root) or f"--data_root {root} holds no prepared dataset (no books_<vocab>/ "
                                                    f"folder). Prepare one with {prepare_hint(root)}.")
        ds = BooksDataset(root, vocab)
    else:
        roots = data_search_roots()
        ds = next((BooksDataset(root, vocab) for root in roots
                   if (vocab := dataset_vocab(root, model_cfg.vocab_size, vocab_given)) is not None), None)
        if ds is None and not smoke_corpus:
            where = " or ".join(map(str, roots))
            if dry_run:
                say(f"No dataset prepared in {where}: planning the config as published (vocab "
                    f"{model_cfg.vocab_size:,}). Training it needs book data: {prepare_hint()}.")
                return None, model_cfg
            raise DataError(f"No dataset prepared in {where}, and a paper config never trains on the embedded "
                            f"smoke-test corpus. Prepare the books first: {prepare_hint()}; or train a CPU-sized "
                            "config (--config cpu) on the default corpus.")
        if ds is None:
            if not ddp.main:
                dist.barrier()  # rank 0 builds the corpus once
            ds = default_corpus.ensure(DEFAULT_DATA / "default_corpus")
            if ddp.main and ddp.world_size > 1:
                dist.barrier()
            say(f"No dataset given (--data_root) or prepared in {' or '.join(map(str, roots))} "
                f"(books_<vocab>/ from scripts/prepare_books.py): using the {default_corpus.LABEL}.")
    vocab_note = ""
    if model_cfg.vocab_size != ds.vocab_size:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=ds.vocab_size)
        vocab_note = f"; the model's vocab set to its {ds.vocab_size}"
    say(f"Dataset {ds.name}: {ds.dir.resolve()} (fingerprint {ds.fingerprint}){vocab_note}.")
    return ds, model_cfg


def tokenizer_file(ds: BooksDataset, given: str | None) -> Path | None:
    """The data's SentencePiece model: `given` (--tokenizer), else the one inside the data folder."""
    return Path(given) if given else ds.tokenizer_path()


def load_tokenizer(ds: BooksDataset, given: str | None, vocab_size: int):
    """The data's SentencePiece model (tokenizer_file): normalised perplexity counts the bytes and characters it
    decodes to."""
    path = tokenizer_file(ds, given)
    if path is None or not path.exists():
        raise DataError(f"Normalised perplexity needs the data's SentencePiece model to count bytes; none in {ds.dir}. "
                        "Pass --tokenizer PATH/books_<vocab>.model.")
    sp = tokenizer.load(path)
    if sp.get_piece_size() != vocab_size:
        raise DataError(f"The tokenizer {path} has {sp.get_piece_size()} tokens but the model's vocab is {vocab_size}.")
    return sp
