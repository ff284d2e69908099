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


def save(run_dir: Path, state: dict) -> Path:
    path = run_dir / CHECKPOINT
    tmp = run_dir / (CHECKPOINT + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(run_dir: Path, device: torch.device) -> dict:
    path = run_dir / CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"--resume true but there is no checkpoint at {path}.")
    # weights_only=False: the checkpoint holds RNG states (numpy arrays, tuples) that we wrote ourselves
    return torch.load(path, map_location=device, weights_only=False)
