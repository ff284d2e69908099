"""Tokenise a folder of books into the official Languini Books layout, or check the official release.

    python scripts/prepare_books.py ../shared/data/pgbooks                   # data/books_16384, a 16384-token BPE
    python scripts/prepare_books.py BOOKS --tokenizer books_16384.model     # reuses a SentencePiece model
    python scripts/prepare_books.py --check data/books/books_16384           # the official integrity hash

BOOKS holds one sub-folder per split (train/, valid/, test/, ood_*/) with one .txt or .txt.gz file per book.
The dataset goes to the repository's data/ unless --out says otherwise; training finds it there by itself.
--check hashes the names and sizes of the files below a folder as the official integrity_test.py does, and
compares the hash with the official one for that folder's name (books_16384).
"""
import argparse
import sys
from pathlib import Path

from languini.books import OFFICIAL_LISTING_SHA256, DataError, listing_digest
from languini.flags import Parser, add_bool_flag
from languini.prepare import prepare_books

REPO_DATA = Path(__file__).resolve().parents[1] / "data"  # where train.py looks without --data_root


def check(folder: Path) -> bool:
    """Print the folder's integrity hash and whether it is the official one; True if it is or none is known."""
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder.")
    digest = listing_digest(folder)
    print(f"{digest}  {folder}")
    official = OFFICIAL_LISTING_SHA256.get(folder.name)
    if official is None:
        print(f"no official hash for a folder named {folder.name} (known: {', '.join(OFFICIAL_LISTING_SHA256)})")
        return True
    if digest == official:
        print(f"matches the official hash of {folder.name}")
        return True
    print(f"differs from the official hash of {folder.name}, {official}: a book is missing, extra or of another "
          "size (any other file below the folder, such as a tokenizer.model, counts too)")
    return False


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("books", nargs="?", help="folder with split sub-folders of .txt/.txt.gz books")
    parser.add_argument("--out", default=str(REPO_DATA),
                        help="data root; the dataset goes to OUT/books_<vocab>/ (default: the repository's data/)")
    parser.add_argument("--vocab_size", type=int, default=16384)
    parser.add_argument("--tokenizer", default=None, help="an existing SentencePiece .model instead of training one")
    parser.add_argument("--workers", type=int, default=None, help="tokenising processes (default: all cores)")
    add_bool_flag(parser, "--overwrite", False, "replace an existing dataset")
    parser.add_argument("--check", metavar="DIR", default=None,
                        help="print the integrity hash of a tokenised dataset, e.g. data/books/books_16384, and "
                             "compare it with the official one (exit status 1 if it differs)")
    args = parser.parse_args(argv)
    if (args.books is None) == (args.check is None):
        parser.error("give either BOOKS (a folder of books to tokenise) or --check DIR")
    try:
        if args.check is not None:
            if not check(Path(args.check)):
                sys.exit(1)
            return
        prepare_books(args.books, args.out, args.vocab_size, args.tokenizer, args.workers, args.overwrite)
    except DataError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
