"""Tokenise a folder of books into the official Languini Books layout.

    python scripts/prepare_books.py ../shared/data/pgbooks                   # data/books_16384, a 16384-token BPE
    python scripts/prepare_books.py BOOKS --tokenizer books_16384.model     # reuses a SentencePiece model

BOOKS holds one sub-folder per split (train/, valid/, test/, ood_*/) with one .txt or .txt.gz file per book.
The dataset goes to the repository's data/ unless --out says otherwise; training finds it there by itself.
"""
import argparse
import sys
from pathlib import Path

from languini.books import DataError
from languini.flags import add_bool_flag
from languini.prepare import prepare_books

REPO_DATA = Path(__file__).resolve().parents[1] / "data"  # where train.py looks without --data_root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("books", help="folder with split sub-folders of .txt/.txt.gz books")
    parser.add_argument("--out", default=str(REPO_DATA),
                        help="data root; the dataset goes to OUT/books_<vocab>/ (default: the repository's data/)")
    parser.add_argument("--vocab_size", type=int, default=16384)
    parser.add_argument("--tokenizer", default=None, help="an existing SentencePiece .model instead of training one")
    parser.add_argument("--workers", type=int, default=None, help="tokenising processes (default: all cores)")
    add_bool_flag(parser, "--overwrite", False, "replace an existing dataset")
    args = parser.parse_args(argv)
    try:
        prepare_books(args.books, args.out, args.vocab_size, args.tokenizer, args.workers, args.overwrite)
    except DataError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
