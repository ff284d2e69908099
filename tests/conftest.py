"""Shared fixtures, and the device the kernel tests run on.

LANGUINI_TEST_DEVICE=cpu (the default) runs the Triton kernels under the interpreter on CPU;
LANGUINI_TEST_DEVICE=cuda compiles them for the GPU and the kernel tests put their inputs there
(scripts/gpu_session.sh runs them so). The tests in CPU_ONLY_TESTS are skipped on cuda.
"""
import os

import pytest
import torch

TEST_DEVICES = ("cpu", "cuda")
TEST_DEVICE = os.environ.get("LANGUINI_TEST_DEVICE", "cpu")

# The Triton interpreter must be switched on before any kernel is defined; on cuda it must stay off.
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# Under pytest-xdist (the README's `-n 2`) each worker has one core: one torch thread, inherited by its children.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Tests that run a Triton kernel on CPU tensors on purpose, so only under the interpreter.
CPU_ONLY_TESTS = {
    "tests/lram_gpt/test_model.py::test_profiler_sees_nothing_of_theta_on_either_path":
        "forces the Triton lookup on a CPU model",
    "tests/qlstm/test_bench_cells.py::test_bench_prints_one_row_per_implementation":
        "times the Triton scan on CPU",
}


def pytest_configure(config):
    if TEST_DEVICE not in TEST_DEVICES:
        raise pytest.UsageError(f"LANGUINI_TEST_DEVICE must be one of {TEST_DEVICES}, got {TEST_DEVICE!r}")
    if TEST_DEVICE == "cpu":
        _check_interpreter_numpy()
    if TEST_DEVICE == "cuda":
        if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on"):
            raise pytest.UsageError("LANGUINI_TEST_DEVICE=cuda tests the compiled kernels: unset TRITON_INTERPRET")
        if not torch.cuda.is_available():
            raise pytest.UsageError("LANGUINI_TEST_DEVICE=cuda but torch sees no CUDA device")


def pytest_collection_modifyitems(config, items):
    if TEST_DEVICE == "cpu":
        return
    for item in items:
        reason = CPU_ONLY_TESTS.get(item.nodeid.split("[")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"CPU only: {reason}"))


@pytest.fixture(scope="session")
def device():
    """Where the kernel tests put the inputs of the path under test (LANGUINI_TEST_DEVICE)."""
    return torch.device(TEST_DEVICE)


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


def _check_interpreter_numpy():
    """Triton 3.6's interpreter (measured; 3.8's works) fails on every loop with runtime bounds under NumPy 2.4."""
    import numpy
    import triton

    def version(module):
        return tuple(int(part) for part in module.__version__.split(".")[:2])

    if version(triton) < (3, 8) and version(numpy) >= (2, 4):
        raise pytest.UsageError(
            f"the Triton {triton.__version__} interpreter cannot run these kernels with NumPy {numpy.__version__} "
            f"('only 0-dimensional arrays can be converted to Python scalars'): pip install 'numpy<2.4', "
            f"or Triton >= 3.8")
