"""What a run does with its run folder: continue the run there, start it, refuse, or report it finished.

A folder holds a run once it has a checkpoint or results.json. A fresh start never appends to an old log: a
folder whose run stopped before its first checkpoint (only log.jsonl) is started again, anything more is only
replaced with --overwrite true.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
from pathlib import Path

from languini import checkpoint, model_parallel
from languini.flags import parse_bool

RESULTS = "results.json"
LOG = "log.jsonl"
RUN_CONFIG = "config.json"  # the run's configs and its plan, written at its start


def resume_mode(value: str | bool) -> str:
    """--resume as one of true, false, auto (true/false accept what boolean flags accept)."""
    text = str(value).strip().lower()
    if text == "auto":
        return text
    try:
        return "true" if parse_bool(text) else "false"
    except Exception:
        raise ValueError(f"--resume must be true, false or auto, not '{value}'.") from None


def run_files(run_dir: Path) -> list[Path]:
    """What a run writes into its folder (W&B's offline folder excepted: it has its own run ids)."""
    names = [LOG, RESULTS, checkpoint.CHECKPOINT, checkpoint.PREVIOUS, checkpoint.SHARDS,
             checkpoint.previous_path(Path(checkpoint.SHARDS)).name, "tensorboard"]
    found = [run_dir / n for n in names if (run_dir / n).exists()]
    return found + sorted(run_dir.glob("states_rank*.pt")) + sorted(run_dir.glob("*.tmp"))


LOCK = ".lock"  # inside the run folder, held by the process training into it
_held_locks = {}  # run folder -> its open lock file: closing the file releases the lock


def lock(run_dir: Path) -> None:
    """Hold the (existing) run folder for this process, or stop if another process holds it: two runs writing into
    one folder would interleave their logs and overwrite each other's checkpoints. Released by release(), or when
    the process ends, however it ends."""
    key = Path(run_dir).resolve()
    if key in _held_locks:
        return
    path = key / LOCK
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise FileExistsError(f"{run_dir} is in use by another run (process {holder}); wait for it to end, or give "
                               "this one another --run_name.") from None
        try:  # the last holder removes the file on release: the lock counts only on the file that is there now
            if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _held_locks[key] = handle


def release(run_dir: Path) -> None:
    """Give the run folder up, leaving nothing of the lock in it."""
    key = Path(run_dir).resolve()
    handle = _held_locks.pop(key, None)
    if handle is not None:
        (key / LOCK).unlink(missing_ok=True)
        handle.close()


@contextlib.contextmanager
def locks_released_on_exit():
    """Release the locks taken inside (a run in a process that goes on, e.g. a test, then another that continues
    the run in a child process)."""
    before = set(_held_locks)
    try:
        yield
    finally:
        for key in set(_held_locks) - before:
            release(key)


def start_or_continue(run_dir: Path, resume: str | bool, overwrite: bool, say=print, main: bool = True) -> bool:
    """Whether to continue the run in run_dir (True) or start it (False, the folder cleared of an old run)."""
    mode = resume_mode(resume)
    if overwrite and mode != "false":
        raise ValueError("--overwrite true trains the run again from step 1; it cannot be combined with --resume "
                         f"{mode}.")
    has_run = checkpoint.exists(run_dir) or (run_dir / RESULTS).exists()
    if mode == "true" and not has_run:
        raise FileNotFoundError(f"--resume true but {run_dir} has no checkpoint to continue from; start the run "
                                "with --resume auto (what a requeued job should pass) or false.")
    if has_run and mode != "false":
        return True
    if has_run and not overwrite:
        raise FileExistsError(f"{run_dir} already holds a run; continue it with --resume true (or auto), replace it "
                              "with --overwrite true, or start another with --run_name NAME.")
    old = run_files(run_dir) if run_dir.is_dir() else []
    if old and main:
        if overwrite:
            say(f"Replacing the run in {run_dir} (--overwrite true).")
        else:
            say(f"{run_dir} holds a run stopped before its first checkpoint: starting it again, its {LOG} replaced.")
        for path in old:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    return False


def finished_results(run_dir: Path, model_config, steps: int) -> dict | None:
    """The results of a finished run in run_dir (None if unfinished); an error if they belong to another run (of
    another model config, a dataclass, whatever the layout; or another budget)."""
    path = run_dir / RESULTS
    if not path.exists():
        return None
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}); delete it to evaluate the run's last checkpoint again.") from e
    if not model_parallel.same_model(results.get("model_config", {}), model_config) or results.get("steps") != steps:
        raise ValueError(f"The run in {run_dir} was trained with another model config or budget; resume with the "
                         "same flags or choose another --run_name.")
    return results


def continue_command(project: str, argv: list[str], world_size: int = 1, drop_flags: tuple[str, ...] = (),
                     script: str | None = None) -> str:
    """The command line that continues a stopped run: the same script (the project's train.py unless given) and
    flags with --resume auto (and no --overwrite, nor any of drop_flags)."""
    dropped = ("--resume", "--overwrite", *drop_flags)
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in dropped:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in dropped)):
            kept.append(arg)
    launcher = ["torchrun", "--nproc_per_node", str(world_size)] if world_size > 1 else ["python"]
    return shlex.join([*launcher, script or f"projects/{project}/train.py", *kept, "--resume", "auto"])
