import os

import pytest
import torch

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


@pytest.fixture
def single_thread():
    """Timing tiny models with 2 threads on a shared 2-core machine makes OpenMP spin for seconds per step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
