"""Checkpoints that survive a crash: flushed to disk before an atomic rename, with the previous one kept.

A run folder holds `checkpoint.pt` (the latest) and `checkpoint_previous.pt` (the one before); data-parallel
runs also hold each process's recurrent states, `states_rank<r>.pt` and `states_rank<r>_previous.pt`. A model may
store its carried states in a smaller floating dtype (model_contract.checkpoint_state_dtype): pack_states casts
them for saving and records their dtypes, unpack_states casts them back on loading.
"""
from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from torch.utils._pytree import tree_flatten, tree_unflatten

from languini.atomic_write import fsync_dir, write_atomically  # noqa: F401  (checkpoint.write_atomically)
from languini.memory_layers import check_renamed

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint_previous.pt"


class CheckpointError(RuntimeError):
    """No checkpoint of a run folder can be read; the message says what to do."""


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def previous_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}_previous{path.suffix}")


def _write_flushed(path: Path, write: Callable) -> Path:
    """`write(file)` into path.tmp, flushed to disk; returns the temporary path."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _save_keeping_previous(state, path: Path, keep_previous: bool) -> Path:
    """Write `state` to path; the file it replaces becomes path's previous one unless keep_previous is False
    (after a fallback: the latest could not be read, and the previous one is the good one to keep)."""
    tmp = _write_flushed(path, lambda f: torch.save(state, f))
    if keep_previous and path.exists():
        os.replace(path, previous_path(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def save(run_dir: Path, state: dict, keep_previous: bool = True) -> Path:
    return _save_keeping_previous(state, run_dir / CHECKPOINT, keep_previous)


def exists(run_dir: Path) -> bool:
    """Whether the run folder has a checkpoint to continue from (the latest or the previous one)."""
    return (run_dir / CHECKPOINT).exists() or (run_dir / PREVIOUS).exists()


def _read(path: Path, device: torch.device):
    # weights_only=False: checkpoints hold RNG states (numpy arrays, tuples) that we wrote ourselves
    return torch.load(path, map_location=device, weights_only=False)


def _problem(path: Path, device: torch.device):
    """(checkpoint, None) or (None, why it cannot be used)."""
    if not path.exists():
        return None, f"{path.name} is missing"
    try:
        return _read(path, device), None
    except Exception as e:  # torch raises several types for truncated or foreign files
        return None, f"{path.name} cannot be read ({type(e).__name__}: {e})"


def load(run_dir: Path, device: torch.device, warn: Callable[[str], None] = print) -> tuple[dict, Path]:
    """The latest readable checkpoint and its path: checkpoint.pt, else (with a warning) the previous one.

    A checkpoint whose model config uses the memory layers' old names fails with a ValueError naming the new ones.
    """
    latest, why_not_latest = _problem(run_dir / CHECKPOINT, device)
    if latest is not None:
        check_renamed(latest.get("model_config", {}))
        return latest, run_dir / CHECKPOINT
    previous, why_not_previous = _problem(run_dir / PREVIOUS, device)
    if previous is not None:
        check_renamed(previous.get("model_config", {}))
        warn(f"Warning: {why_not_latest}; continuing from the previous checkpoint {run_dir / PREVIOUS} "
             f"(step {previous['step']}), so the steps after it are trained again.")
        return previous, run_dir / PREVIOUS
    if not exists(run_dir):
        raise CheckpointError(f"--resume true but {run_dir} has no checkpoint ({CHECKPOINT}); "
                              "start the run with --resume auto or false.")
    raise CheckpointError(f"Cannot resume {run_dir}: {why_not_latest}, and {why_not_previous}. Nothing in the "
                          "folder was changed. Train the run again with --overwrite true, or under another "
                          "--run_name.")


def _floating(leaf) -> bool:
    return torch.is_tensor(leaf) and leaf.is_floating_point()


def pack_states(states, dtype: torch.dtype | None) -> tuple:
    """The carried states as a checkpoint stores them: (states with every floating tensor cast to dtype, the
    dtypes to restore, one per leaf of the nested lists/tuples/dicts, None for a leaf left as it is). dtype None:
    (states as they are, None), so they resume bit-exactly. Integer tensors and None entries are never cast."""
    if dtype is None:
        return states, None
    leaves, spec = tree_flatten(states)
    dtypes = [leaf.dtype if _floating(leaf) else None for leaf in leaves]
    return tree_unflatten([leaf.to(dtype) if _floating(leaf) else leaf for leaf in leaves], spec), dtypes


def unpack_states(states, dtypes: list | None):
    """The states pack_states stored, each floating tensor back in its dtype in memory (its values rounded)."""
    if dtypes is None:
        return states
    leaves, spec = tree_flatten(states)
    if len(leaves) != len(dtypes):
        raise CheckpointError(f"The checkpoint's carried states have {len(leaves)} entries but record the dtypes of "
                              f"{len(dtypes)}: the file is not one this code wrote. Train the run again with "
                              "--overwrite true.")
    return tree_unflatten([leaf if dtype is None else leaf.to(dtype) for leaf, dtype in zip(leaves, dtypes)], spec)


def save_rank_states(run_dir: Path, rank: int, step: int, states, keep_previous: bool = True,
                     dtype: torch.dtype | None = None) -> Path:
    """The recurrent states of one data-parallel process's streams (each process owns other streams), their
    floating tensors stored in dtype (None: as they are)."""
    packed, dtypes = pack_states(states, dtype)
    return _save_keeping_previous({"step": step, "states": packed, "state_dtypes": dtypes},
                                  run_dir / f"states_rank{rank}.pt", keep_previous)


def load_rank_states(run_dir: Path, rank: int, step: int, device: torch.device):
    """This process's states saved with the checkpoint of `step` (the latest or the previous file)."""
    path = run_dir / f"states_rank{rank}.pt"
    found = []
    for candidate in (path, previous_path(path)):
        saved, why_not = _problem(candidate, device)
        if saved is not None and saved["step"] == step:
            return unpack_states(saved["states"], saved.get("state_dtypes"))
        found.append(why_not or f"{candidate.name} holds step {saved['step']}")
    raise CheckpointError(f"No recurrent states of process {rank} for step {step} in {run_dir} ({'; '.join(found)}): "
                          "resume with as many processes as the run was started with, or train it again with "
                          "--overwrite true.")
