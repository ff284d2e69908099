"""The Neural Bloom Filter (Rae's thesis, chapter 5): a memory that meta-learns to compress a set in one shot,
against classical Bloom and cuckoo filters on space at a false-positive rate. Not a language model: it has no
train.py of the model contract; its script is bench.py (README.md)."""

LANGUAGE_MODEL = False  # tests/core/test_contract.py checks only the projects that are language models
