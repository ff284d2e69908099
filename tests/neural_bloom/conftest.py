"""A small book folder written here (no ../shared): 1000 distinct words in two books."""
import gzip
import itertools

import pytest


@pytest.fixture
def books(tmp_path):
    syllables = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze"]
    words = ["".join(w) for w in itertools.product(syllables, repeat=3)]
    for i in range(2):
        with gzip.open(tmp_path / f"book{i}.txt.gz", "wt", encoding="utf-8") as f:
            f.write(" ".join(words[i::2]) + ".\n")
    return tmp_path
