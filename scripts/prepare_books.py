"""Tokenise a folder of books into the official Languini Books layout.

    python scripts/prepare_books.py ../shared/data/pgbooks --out data            # trains a 16384-token BPE
    python scripts/prepare_books.py BOOKS --out data --tokenizer books_16384.model  # reuses a SentencePiece model

BOOKS holds one sub-folder per split (train/, valid/, test/, ood_*/) with one .txt or .txt.gz file per book.
"""
import argparse
import sys

from languini.books import DataError
from languini.flags import parse_bool
from languini.prepare import prepare_books


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("books", help="folder with split sub-folders of .txt/.txt.gz books")
    parser.add_argument("--out", default="data", help="data root; the dataset goes to OUT/books_<vocab>/")
    parser.add_argument("--vocab_size", type=int, default=16384)
    parser.add_argument("--tokenizer", default=None, help="an existing SentencePiece .model instead of training one")
    parser.add_argument("--workers", type=int, default=None, help="tokenising processes (default: all cores)")
    parser.add_argument("--overwrite", type=parse_bool, default=False, help="replace an existing dataset (true/false)")
    args = parser.parse_args(argv)
    try:
        prepare_books(args.books, args.out, args.vocab_size, args.tokenizer, args.workers, args.overwrite)
    except DataError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
