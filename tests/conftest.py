import os

import pytest

# The Triton interpreter must be switched on before any kernel is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def default_corpus_root(tmp_path_factory):
    """The embedded default corpus, built once per test session (a few seconds)."""
    from languini import default_corpus

    root = tmp_path_factory.mktemp("default_corpus")
    default_corpus.ensure(root)
    return root
