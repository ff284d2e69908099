"""Running a test on several processes: torch.distributed with gloo on CPU, and a timeout, so that a hang fails.

run_on_ranks(worker, world_size, *args) starts `world_size` processes, each calling worker(rank, world_size, *args)
inside an initialised process group; an exception in any of them fails the test with its traceback. The worker
must be a module-level function (the processes are spawned and import it).
"""
import os
import tempfile
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_SECONDS = 120


def _entry(rank, worker, world_size, store, args):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    worker(rank, world_size, *args)  # an exception ends this process; run_on_ranks fails the test and kills the rest
    # every process done before any tears its connections down: a process leaving while another still talks to it
    # was seen to abort ("terminate called without an active exception", about one run in eight)
    dist.barrier()
    dist.destroy_process_group()


def run_on_ranks(worker, world_size: int, *args, timeout: float = TIMEOUT_SECONDS) -> None:
    """worker(rank, world_size, *args) on world_size processes (gloo); fails the test after `timeout` seconds."""
    store = tempfile.mktemp(prefix="languini_gloo_")
    context = mp.start_processes(_entry, args=(worker, world_size, store, args), nprocs=world_size, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                pytest.fail(f"{worker.__name__} on {world_size} processes did not finish in {timeout} s (a hang?)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
        if os.path.exists(store):
            os.remove(store)
