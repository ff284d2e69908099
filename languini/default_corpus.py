"""The embedded default corpus: synthetic, deterministic books for smoke tests. NEVER a benchmark.

It exists so that `train.py` runs on a fresh machine with no dataset. The books are generated from a seed with
book-like structure: chapters, a cast of recurring names, a refrain that returns in every chapter, and an
out-of-distribution "series" split whose books share one cast and refrain (long-range repetition across books).
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

from languini.books import BooksDataset

VOCAB_SIZE = 2048
SEED = 1234
SPLITS = {"train": 80, "valid": 3, "test": 3, "ood_series": 3}
# One chapter per held-out book (about 3,600 tokens a split): the fast and slow evaluation of every split
# stays a small part of a CPU smoke run (`train.py --compute_class 2m`), for every project.
HELD_OUT_CHAPTERS = 1
VERSION = 2  # of the generated text; a corpus built by another version is built again
LABEL = "embedded default corpus (synthetic smoke-test data, not a benchmark)"

FUNCTION_WORDS = ["the", "a", "of", "and", "to", "in", "with", "from", "under", "beyond", "near"]
ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v", "w"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "m"]
ROMAN = ["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII", "XIII", "XIV"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables))


class _Lexicon:
    def __init__(self, rng: random.Random):
        self.nouns = [_word(rng, rng.randint(1, 2)) for _ in range(400)]
        self.verbs = [_word(rng, rng.randint(1, 2)) + "ed" for _ in range(150)]
        self.adjectives = [_word(rng, rng.randint(1, 3)) + "ish" for _ in range(120)]
        self.places = [_word(rng, 2).capitalize() for _ in range(80)]
        self.names = [_word(rng, rng.randint(2, 3)).capitalize() for _ in range(300)]

    @staticmethod
    def zipf(rng: random.Random, words: list[str]) -> str:
        # Zipf-like frequencies, as in natural text: the k-th word is drawn with weight 1/k.
        return words[min(int(len(words) ** rng.random()) - 1, len(words) - 1)]


def _sentence(rng: random.Random, lex: _Lexicon, cast: list[str]) -> str:
    z = lex.zipf
    name = rng.choice(cast)
    other = rng.choice(cast)
    forms = [
        f"{name} {z(rng, lex.verbs)} the {z(rng, lex.adjectives)} {z(rng, lex.nouns)} of {rng.choice(lex.places)}.",
        f"\"The {z(rng, lex.nouns)} is {z(rng, lex.adjectives)},\" said {name} to {other}.",
        f"In the {z(rng, lex.nouns)} {rng.choice(FUNCTION_WORDS)} {z(rng, lex.nouns)} there was a "
        f"{z(rng, lex.adjectives)} {z(rng, lex.nouns)}.",
        f"{name} and {other} {z(rng, lex.verbs)} {rng.choice(FUNCTION_WORDS)} the {z(rng, lex.nouns)}.",
        f"It was {rng.randint(2, 99)} days before {name} {z(rng, lex.verbs)} again.",
    ]
    return rng.choice(forms)


def _book(rng: random.Random, lex: _Lexicon, title: str, cast: list[str], refrain: str, chapters: int) -> str:
    parts = [title.upper(), "", f"by {rng.choice(lex.names)} {rng.choice(lex.names)}", ""]
    for c in range(chapters):
        parts += [f"CHAPTER {ROMAN[c]}. THE {lex.zipf(rng, lex.nouns).upper()}", "", refrain, ""]
        for _ in range(rng.randint(15, 25)):
            sentences = [_sentence(rng, lex, cast) for _ in range(rng.randint(3, 7))]
            parts += [" ".join(sentences), ""]
        parts += [refrain, ""]
    return "\n".join(parts)


def write_text(folder: Path, seed: int = SEED) -> None:
    """Write <folder>/<split>/<book>.txt for every split, deterministically from `seed`."""
    rng = random.Random(seed)
    lex = _Lexicon(rng)

    def new_cast():
        return rng.sample(lex.names, 6)

    def new_refrain(cast):
        return _sentence(rng, lex, cast).replace(".", ", and so it was.", 1)

    for split, n_books in SPLITS.items():
        (folder / split).mkdir(parents=True)
        series_cast = new_cast()
        series_refrain = new_refrain(series_cast)
        for i in range(n_books):
            cast = series_cast if split.startswith("ood") else new_cast()
            refrain = series_refrain if split.startswith("ood") else new_refrain(cast)
            title = f"The {lex.zipf(rng, lex.nouns)} of {rng.choice(lex.places)}"
            chapters = rng.randint(8, 12) if split == "train" else HELD_OUT_CHAPTERS
            (folder / split / f"{split}_{i:02d}.txt").write_text(_book(rng, lex, title, cast, refrain, chapters))


def ensure(data_root: str | os.PathLike) -> BooksDataset:
    """Build the corpus under data_root once (text, tokenizer, token files) and return it; a corpus of
    another VERSION is replaced."""
    from languini.prepare import prepare_books

    data_root = Path(data_root)
    marker = data_root / "corpus_version"
    built = (data_root / f"books_{VOCAB_SIZE}").is_dir()
    if not built or not marker.exists() or marker.read_text().strip() != str(VERSION):
        text = data_root / f".text-{os.getpid()}"
        shutil.rmtree(text, ignore_errors=True)
        try:
            write_text(text)
            prepare_books(text, data_root, VOCAB_SIZE, workers=2, quiet=True, overwrite=built)
        finally:
            shutil.rmtree(text, ignore_errors=True)
        marker.write_text(f"{VERSION}\n")
    return BooksDataset(data_root, VOCAB_SIZE)
