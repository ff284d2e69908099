"""Atomic checkpoints: written to a temporary file, then renamed, so a crash never leaves a half-written one."""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

CHECKPOINT = "checkpoint.pt"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_atomically(state, path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def save(run_dir: Path, state: dict) -> Path:
    return _save_atomically(state, run_dir / CHECKPOINT)


def save_rank_states(run_dir: Path, rank: int, step: int, states) -> Path:
    """The recurrent states of one data-parallel process's streams (each process owns other streams)."""
    return _save_atomically({"step": step, "states": states}, run_dir / f"states_rank{rank}.pt")


def load_rank_states(run_dir: Path, rank: int, step: int, device: torch.device):
    path = run_dir / f"states_rank{rank}.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: resume with as many processes as the run was started with.")
    saved = torch.load(path, map_location=device, weights_only=False)
    if saved["step"] != step:
        raise ValueError(f"{path} holds step {saved['step']} but the checkpoint step {step}; the run folder is "
                         "inconsistent (a crash while saving): restart the run.")
    return saved["states"]


def load(run_dir: Path, device: torch.device) -> dict:
    path = run_dir / CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"--resume true but there is no checkpoint at {path}.")
    # weights_only=False: the checkpoint holds RNG states (numpy arrays, tuples) that we wrote ourselves
    return torch.load(path, map_location=device, weights_only=False)
