"""Processes of one run that were given different flags stop at once, each naming the flags; a process that waits
for another longer than --dist_timeout_minutes fails instead of hanging.

The processes are launched as on several machines (RANK, WORLD_SIZE, MASTER_ADDR/PORT set by hand, one command
each), which is how they come to be given different flags."""
import datetime
import os
import socket
import subprocess
import sys
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from languini.experiment import REPO_ROOT, child_python_path
from languini.trainer import init_distributed

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--batch_size", "4", "--eval_max_batches", "1", "--slow_eval_max_windows", "1",
        "--run_name", "r"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_processes_given_different_flags_stop_at_once_naming_them(default_corpus_root, tmp_path):
    common = [*TINY, "--data_root", str(default_corpus_root), "--out_dir", str(tmp_path / "runs")]
    # before the check: different learning rates trained apart (exit 0), different budgets hung
    per_rank = [["--max_steps", "2", "--lr", "1e-3"], ["--max_steps", "3", "--lr", "2e-3"]]
    port = free_port()
    start = time.monotonic()
    processes = [subprocess.Popen([sys.executable, str(REPO_ROOT / "projects" / "gpt" / "train.py"), *common, *extra],
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path(),
                                       "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank, extra in enumerate(per_rank)]
    try:
        outputs = [p.communicate(timeout=120) for p in processes]
    finally:
        for p in processes:
            p.kill()
    seconds = time.monotonic() - start
    for p, (_, err) in zip(processes, outputs):
        assert p.returncode == 1, err[-3000:]
        assert "given different flags" in err, err[-3000:]
        assert "--lr (process 0: 0.001, process 1: 0.002)" in err and "--max_steps (process 0: 2, process 1: 3)" in err
        assert "--seed" not in err  # only the flags that differ
    assert not (tmp_path / "runs").exists()  # stopped before any training
    # two processes importing torch on a loaded 2-core machine take ~20 s; a hang would take the 120 s
    assert seconds < 60, seconds


def _wait_alone(rank, port, timeout_minutes, result):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_distributed(timeout_minutes)
    if rank == 0:  # the other process never joins this barrier
        start = time.monotonic()
        try:
            dist.barrier()
            result.put(("returned", time.monotonic() - start))
        except RuntimeError as e:
            result.put((str(e), time.monotonic() - start))
    else:
        time.sleep(20)  # alive (its connection open) well past the timeout


def test_a_process_waiting_past_the_timeout_fails_instead_of_hanging():
    context = mp.get_context("spawn")
    result = context.Queue()
    port = free_port()
    processes = [context.Process(target=_wait_alone, args=(rank, port, 0.05, result)) for rank in range(2)]
    for p in processes:
        p.start()
    try:
        error, seconds = result.get(timeout=60)
    finally:
        for p in processes:
            p.kill()
    assert error != "returned" and "timed out" in error.lower(), error
    assert datetime.timedelta(seconds=seconds) >= datetime.timedelta(minutes=0.05)  # 3 s
    assert seconds < 15
