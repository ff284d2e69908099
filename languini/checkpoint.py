"""Checkpoints that survive a crash: flushed to disk before an atomic rename, with the previous one kept.

A run folder holds `checkpoint.pt` (the latest) and `checkpoint_previous.pt` (the one before); data-parallel
runs also hold each process's recurrent states, `states_rank<r>.pt` and `states_rank<r>_previous.pt`. A model may
store its carried states in a smaller floating dtype (model_contract.checkpoint_state_dtype): pack_states casts
them for saving and records their dtypes, unpack_states casts them back on loading.

A run with split parameters (languini/model_parallel.py: memory value shards, experts spread over processes; and
the dense weights FSDP shards, languini/parallelize.py) keeps them and their optimiser state in `checkpoint_shards/`
(and `checkpoint_shards_previous/`), a torch.distributed.checkpoint folder every process writes its part into;
checkpoint.pt holds InShards(key) in their place and what every process holds alike (step, schedulers, RNG).
torch.distributed.checkpoint records each tensor's whole shape and every part's place in it, so the folder is read
back under any layout: whole tensors on one process, other parts on more processes.

Every file of a checkpoint has a sha256 checksum, verified before it is read: a file and its previous one share
`<name>.sha256.json` beside them, and a shards folder holds `sha256.json` for the files in it. A file that is missing,
truncated or changed makes its checkpoint unusable, and the previous one is used instead (files saved before
checksums were are read unchecked).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from torch.utils._pytree import tree_flatten, tree_unflatten

from languini import model_parallel
from languini.atomic_write import fsync_dir, write_atomically  # noqa: F401  (checkpoint.write_atomically)

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint_previous.pt"
SHARDS = "checkpoint_shards"  # the model-parallel tensors, a torch.distributed.checkpoint folder
SHARDS_STEP = "step"  # the file in a shards folder naming the step it was saved at
SHARDS_CHECKSUMS = "sha256.json"  # the file in a shards folder with the sha256 of every other file in it


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


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in blocks (a checkpoint may not fit in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums_path(path: Path) -> Path:
    """The checksums of a file and of its previous one: checkpoint.pt -> checkpoint.sha256.json."""
    return path.with_name(f"{path.stem}.sha256.json")


def _recorded(checksums: Path) -> dict | None:
    """The checksums a file records ({} where there is no such file; None where it cannot be read)."""
    if not checksums.exists():
        return {}
    try:
        return json.loads(checksums.read_text())
    except (OSError, ValueError):
        return None


def _save_keeping_previous(state, path: Path, keep_previous: bool) -> Path:
    """Write `state` to path; the file it replaces becomes path's previous one unless keep_previous is False
    (after a fallback: the latest could not be read, and the previous one is the good one to keep)."""
    tmp = _write_flushed(path, lambda f: torch.save(state, f))
    previous = previous_path(path)
    recorded = _recorded(checksums_path(path)) or {}
    kept = recorded.get(path.name) if keep_previous else recorded.get(previous.name)
    # written before the renames, for both names: until they are done either name may hold either file
    write_atomically(checksums_path(path), lambda f: f.write(json.dumps(
        {path.name: sha256_of(tmp), previous.name: kept}).encode()))
    if keep_previous and path.exists():
        os.replace(path, previous)
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


def _checksum_problem(path: Path, checksums: Path) -> str | None:
    """Why `path` is not a file `checksums` records (None: it is, or it was saved before checksums were)."""
    recorded = _recorded(checksums)
    if recorded is None:
        return f"{checksums.name}, the checksums of {path.name}, cannot be read"
    if recorded.get(path.name) is not None and sha256_of(path) not in recorded.values():
        return f"{path.name} does not match its checksum in {checksums.name} (a corrupted or truncated file)"
    return None


def _problem(path: Path, device: torch.device, checksums: Path):
    """(checkpoint, None) or (None, why it cannot be used); `checksums`: the file recording its sha256."""
    if not path.exists():
        return None, f"{path.name} is missing"
    why_not = _checksum_problem(path, checksums)
    if why_not is not None:
        return None, why_not
    try:
        return _read(path, device), None
    except Exception as e:  # torch raises several types for truncated or foreign files
        return None, f"{path.name} cannot be read ({type(e).__name__}: {e})"


def _usable(path: Path, run_dir: Path, device: torch.device):
    """(checkpoint, None) or (None, why it cannot be used): the file itself, and its shards folder if it has one."""
    ckpt, why_not = _problem(path, device, checksums_path(run_dir / CHECKPOINT))
    if ckpt is None or next(_in_shards(ckpt), None) is None:
        return ckpt, why_not
    folder, found = _find_shards(run_dir, ckpt["step"])
    why_not = _shards_problem(folder) if folder else f"no model-parallel tensors for step {ckpt['step']} ({found})"
    return (None, why_not) if why_not else (ckpt, None)


def load(run_dir: Path, device: torch.device, warn: Callable[[str], None] = print,
         merge_shards: bool = True) -> tuple[dict, Path]:
    """The latest readable checkpoint and its path: checkpoint.pt, else (with a warning) the previous one.

    merge_shards: the whole tensors of its shards folder replace its InShards entries (on this process alone:
    what a tool reading a model-parallel run on one process needs); False leaves them for restore_shards.
    """
    latest, why_not_latest = _usable(run_dir / CHECKPOINT, run_dir, device)
    if latest is not None:
        return (_merged(latest, run_dir, device) if merge_shards else latest), run_dir / CHECKPOINT
    previous, why_not_previous = _usable(run_dir / PREVIOUS, run_dir, device)
    if previous is not None:
        warn(f"Warning: {why_not_latest}; continuing from the previous checkpoint {run_dir / PREVIOUS} "
             f"(step {previous['step']}), so the steps after it are trained again.")
        return (_merged(previous, run_dir, device) if merge_shards else previous), run_dir / PREVIOUS
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
        saved, why_not = _problem(candidate, device, checksums_path(path))
        if saved is not None and saved["step"] == step:
            return unpack_states(saved["states"], saved.get("state_dtypes"))
        found.append(why_not or f"{candidate.name} holds step {saved['step']}")
    raise CheckpointError(f"No recurrent states of process {rank} for step {step} in {run_dir} ({'; '.join(found)}): "
                          "resume with as many processes as the run was started with, or train it again with "
                          "--overwrite true.")


# -- model-parallel tensors ---------------------------------------------------------------------------

@dataclass(frozen=True)
class InShards:
    """What checkpoint.pt holds in place of a tensor of a model-parallel parameter (or of its optimiser state):
    the tensor is in the shards folder under `key` ("model/<name>" or "optimizer<i>/<name>/<state>")."""
    key: str


def _names(model: torch.nn.Module) -> dict[str, str]:
    """Every parameter name of the model (a shared parameter under each of its names) -> its first name."""
    first = {id(p): name for name, p in model.named_parameters()}
    return {name: first[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}


def _optimizer_entries(optimizers, model):
    """(optimizer index, position in its state_dict, parameter, the parameter's first name) of every parameter."""
    first = {id(p): name for name, p in model.named_parameters()}
    for i, opt in enumerate(optimizers):
        for position, p in enumerate(p for group in opt.param_groups for p in group["params"]):
            yield i, position, p, first[id(p)]


def _split(param) -> bool:
    """Whether each process holds a part of the parameter: model-parallel, or sharded by FSDP (a DTensor)."""
    from torch.distributed.tensor import DTensor

    return model_parallel.sharding(param) is not None or isinstance(param, DTensor)


def move_to_shards(state: dict, model: torch.nn.Module, optimizers) -> dict[str, torch.Tensor]:
    """Take the split tensors (_split: model-parallel or FSDP's) out of a trainer state (state["model"],
    state["optimizers"]; changed in place, the live optimiser state untouched): each becomes InShards(key).
    Returns key -> this process's part as a DTensor (its place in the whole tensor), for save_shards."""
    params = dict(model.named_parameters())
    tensors = {}
    for name, first in _names(model).items():
        if _split(params[first]):
            state["model"][name] = InShards(f"model/{first}")
            tensors[f"model/{first}"] = _as_part(params[first].detach(), params[first])
    for i, position, p, name in _optimizer_entries(optimizers, model):
        entry = state["optimizers"][i]["state"].get(position)
        if entry is None or not _split(p):
            continue
        entry = state["optimizers"][i]["state"][position] = dict(entry)  # a copy: state_dict shares the live one
        for key, value in entry.items():
            if torch.is_tensor(value) and value.shape == p.shape:  # Adam's moments; its step count stays here
                entry[key] = InShards(f"optimizer{i}/{name}/{key}")
                tensors[entry[key].key] = _as_part(value, p)
    return tensors


def _as_part(tensor: torch.Tensor, param) -> torch.Tensor:
    """A tensor of a parameter as torch.distributed.checkpoint should see it: a model-parallel one as a DTensor
    sharing the local tensor's memory (its place in the whole tensor), any other (FSDP's are DTensors already) as
    it is."""
    s = model_parallel.sharding(param)
    if s is None:
        return tensor
    from torch.distributed.tensor import DTensor, Replicate, Shard

    return DTensor.from_local(tensor, s.shards.mesh, [Replicate(), Shard(s.dim)], run_check=False)


def _in_shards(ckpt: dict):
    """(container, key, InShards) of every InShards entry of a checkpoint's model and optimiser states."""
    for name, value in ckpt.get("model", {}).items():
        if isinstance(value, InShards):
            yield ckpt["model"], name, value
    for opt in ckpt.get("optimizers", []):
        for entry in opt["state"].values():
            for key, value in entry.items():
                if isinstance(value, InShards):
                    yield entry, key, value


def prepare_restore(ckpt: dict, model: torch.nn.Module, optimizers) -> list[str]:
    """Make a checkpoint's model and optimiser states loadable (load_state_dict) under this process's layout,
    in place: an InShards entry becomes a placeholder of the live shape, filled afterwards by restore_shards
    (the keys returned); the whole tensor of a parameter that is split now is cut to this process's part (a run
    saved on one process continuing on several)."""
    params = dict(model.named_parameters())
    names = _names(model)
    for name, value in list(ckpt["model"].items()):
        if name in names:
            ckpt["model"][name] = _part_of_whole(value, params[names[name]])
    for i, position, p, _ in _optimizer_entries(optimizers, model):
        entry = ckpt["optimizers"][i]["state"].get(position, {}) if i < len(ckpt["optimizers"]) else {}
        for key, value in entry.items():
            entry[key] = _part_of_whole(value, p)
    keys = []
    for container, key, ref in list(_in_shards(ckpt)):
        name = ref.key.split("/")[1]
        container[key] = torch.zeros_like(params[name]) if ref.key.startswith("optimizer") else params[name].detach()
        keys.append(ref.key)
    return sorted(set(keys))


def _part_of_whole(value, param):
    """This process's part of `value` if it is a whole tensor of a parameter split here, else value as it is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    s = model_parallel.sharding(param)
    if s is not None and torch.is_tensor(value) and tuple(value.shape) == s.full_shape:
        return model_parallel.local_part(value, s)
    if isinstance(param, DTensor) and torch.is_tensor(value) and not isinstance(value, DTensor) \
            and value.shape == param.shape:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value


def restore_shards(run_dir: Path, step: int, keys: list[str], model: torch.nn.Module, optimizers) -> None:
    """Read the tensors `keys` of the shards folder saved at `step` into the live model and optimiser state
    (after prepare_restore and load_state_dict), each process its part of each, whatever layout saved them."""
    params = dict(model.named_parameters())
    tensors = {}
    for key in keys:
        kind, name, *state_key = key.split("/")
        p = params[name]
        live = p.detach() if kind == "model" else optimizers[int(kind[len("optimizer"):])].state[p][state_key[0]]
        tensors[key] = _as_part(live, p)
    _dcp_load(tensors, shards_folder(run_dir, step))


def save_shards(run_dir: Path, step: int, tensors: dict[str, torch.Tensor], keep_previous: bool = True,
                main: bool = True) -> Path:
    """Write every process's part of `tensors` (move_to_shards) into checkpoint_shards/ through a temporary
    folder; the folder it replaces becomes checkpoint_shards_previous/ unless keep_previous is False. Every
    process calls it; `main`: the one that renames (the first)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    folder, tmp = run_dir / SHARDS, run_dir / f"{SHARDS}.tmp"
    if main:
        if tmp.exists():  # left by a crash
            shutil.rmtree(tmp)
        tmp.mkdir()
        write_atomically(tmp / SHARDS_STEP, lambda f: f.write(str(step).encode()))
    if dist.is_initialized():
        dist.barrier()
    dcp.save(tensors, checkpoint_id=tmp)  # returns once the folder is complete (its metadata written)
    checksums = _folder_checksums(tmp)
    if main:
        write_atomically(tmp / SHARDS_CHECKSUMS, lambda f: f.write(json.dumps(checksums).encode()))
        previous = previous_path(folder)
        if folder.exists():
            if keep_previous:
                shutil.rmtree(previous, ignore_errors=True)
                os.replace(folder, previous)
            else:
                shutil.rmtree(folder)
        os.replace(tmp, folder)
        fsync_dir(run_dir)
    if dist.is_initialized():
        dist.barrier()  # no process writes the next checkpoint into a folder still being renamed
    return folder


def _folder_checksums(folder: Path) -> dict[str, str]:
    """The sha256 of every file in a complete shards folder (its name inside it -> the hash), the files shared
    among the processes (every process calls it) to hash them side by side."""
    import torch.distributed as dist

    names = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
    if not dist.is_initialized():
        return {name: sha256_of(folder / name) for name in names}
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {name: sha256_of(folder / name) for name in names[rank::world]}
    every = [None] * world
    dist.all_gather_object(every, mine)
    return {name: digest for part in every for name, digest in part.items()}


def _shards_problem(folder: Path) -> str | None:
    """Why a shards folder is not the one saved (a file missing, truncated or changed; None: it is, or it was saved
    before checksums were)."""
    recorded = _recorded(folder / SHARDS_CHECKSUMS)
    if recorded is None:
        return f"{folder.name}/{SHARDS_CHECKSUMS}, the checksums of its files, cannot be read"
    for name, digest in recorded.items():
        if not (folder / name).is_file():
            return f"{folder.name}/{name} is missing"
        if sha256_of(folder / name) != digest:
            return f"{folder.name}/{name} does not match its checksum (a corrupted or truncated file)"
    return None


def _find_shards(run_dir: Path, step: int) -> tuple[Path | None, str | None]:
    """(the shards folder saved with the checkpoint of `step`, the latest or the previous one, None) or (None, what
    the two folders hold instead)."""
    folder, found = run_dir / SHARDS, []
    for candidate in (folder, previous_path(folder)):
        try:
            saved = int((candidate / SHARDS_STEP).read_text())
        except (OSError, ValueError):
            found.append(f"{candidate.name} is missing or unfinished")
            continue
        if saved == step:
            return candidate, None
        found.append(f"{candidate.name} holds step {saved}")
    return None, "; ".join(found)


def shards_folder(run_dir: Path, step: int) -> Path:
    """The shards folder saved with the checkpoint of `step` (the latest or the previous one)."""
    folder, why_not = _find_shards(run_dir, step)
    if folder is None:
        raise CheckpointError(f"No model-parallel tensors for step {step} in {run_dir} ({why_not}): train the run "
                              "again with --overwrite true.")
    return folder


def _merged(ckpt: dict, run_dir: Path, device: torch.device) -> dict:
    """The checkpoint with the whole tensors of its shards folder in place of its InShards entries."""
    refs = list(_in_shards(ckpt))
    if not refs:
        return ckpt
    import torch.distributed.checkpoint as dcp

    folder = shards_folder(run_dir, ckpt["step"])
    shapes = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    tensors = {ref.key: torch.empty(shapes[ref.key].size, dtype=shapes[ref.key].properties.dtype, device=device)
               for _, _, ref in refs}
    _dcp_load(tensors, folder, alone=True)
    for container, key, ref in refs:
        container[key] = tensors[ref.key]
    return ckpt


def _dcp_load(tensors: dict, folder: Path, alone: bool = False) -> None:
    """torch.distributed.checkpoint.load into `tensors`, with every process (or this one alone: without
    torch.distributed, or asked to), in place."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    alone = alone or not dist.is_initialized()
    with warnings.catch_warnings():  # one process reading alone is what is meant here, not a slip
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(tensors, checkpoint_id=folder, no_dist=alone)
