"""The dense weights sharded over the processes (FSDP2) and activation checkpointing, block by block.

A model's blocks are its `blocks` (an nn.ModuleList: every project's transformer or recurrent layers).

- `--fsdp true` (torchrun with several processes): instead of a copy of every dense weight on every process (DDP),
  each process holds 1/W of each, with its gradient and Adam's two moments (torch.distributed.fsdp.fully_shard,
  FSDP2, over a DeviceMesh of all W processes). A block's weights are gathered just before its forward and freed
  after it (and again for its backward); the gradients are reduce-scattered, each process keeping the mean over
  the processes of its part. The embedding, output layer and final norm are the root's unit. A block whose weights
  are also used outside it (a memory table read by several blocks: --share_memory) stays in the root's unit, since
  one unit must own a weight; a model that reads its blocks' weights outside their forward (the class attribute
  `weights_used_outside_blocks`, languini/model_contract.py: compressive's memory updates, feedback's own segment)
  or has no blocks (sam) is one unit. Model-parallel parameters (languini/model_parallel.py: value shards, experts) are
  left to their own group, as DDP leaves them. The weights become DTensors: checkpoints keep each process's part
  through torch.distributed.checkpoint (languini/checkpoint.py), so a run saved on N processes continues on M.
- `--activation_checkpointing true`: each block keeps only its inputs in the forward and runs its forward again
  in the backward (torch.utils.checkpoint, non-reentrant, the random state replayed), trading one more forward of
  the blocks (a third more of their FLOPs, a backward being twice a forward) for their activations. What a forward counts (switch_gpt's expert load) is not
  counted again in the recomputation: such a count asks recomputing(). Under --compile the backward graph
  recomputes the count's addition too (switch_gpt's raw counts double; the drop rate and load CV it logs are ratios
  of them, unchanged). A model whose blocks have no forward of their own (feedback computes them in its segment,
  which recomputes by itself) is refused.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from languini import model_contract, model_parallel

_recomputing = False


def recomputing() -> bool:
    """Whether the forward running now is activation checkpointing's recomputation in the backward."""
    return _recomputing


@contextlib.contextmanager
def _recomputation():
    global _recomputing
    previous, _recomputing = _recomputing, True
    try:
        yield
    finally:
        _recomputing = previous


def blocks(model: nn.Module, flag: str) -> nn.ModuleList:
    """The model's blocks (model.blocks); flag names the option that needs them, for the error."""
    found = getattr(model, "blocks", None)
    if not isinstance(found, nn.ModuleList) or len(found) == 0:
        raise ValueError(f"{flag} works block by block and {type(model).__name__} has no `blocks` (an "
                         "nn.ModuleList of its layers).")
    return found


def checkpoint_activations(model: nn.Module) -> None:
    """Every block of the model recomputes its forward in the backward (while gradients are on) instead of keeping
    its activations. The blocks keep their names: checkpoints are the same with or without it."""
    for block in blocks(model, "--activation_checkpointing"):
        if type(block).forward is nn.Module.forward:
            raise ValueError(f"--activation_checkpointing recomputes a block by calling it, and {type(model).__name__} "
                             "computes its blocks itself (they have no forward): train it with "
                             "--activation_checkpointing false.")
        forward = block.forward

        def checkpointed(*args, _forward=forward, **kwargs):
            if not torch.is_grad_enabled():  # evaluation keeps nothing for a backward anyway
                return _forward(*args, **kwargs)
            if torch.compiler.is_compiling():  # compiled, the backward graph recomputes: no Python runs again
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False,
                              context_fn=lambda: (contextlib.nullcontext(), _recomputation()), **kwargs)

        block.forward = checkpointed


def _owners(model: nn.Module) -> dict[int, set]:
    """id(parameter) -> where it is used: the index of a block of model.blocks, or None for the rest."""
    owners: dict[int, set] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        parts = name.split(".")
        owners.setdefault(id(p), set()).add(int(parts[1]) if parts[0] == "blocks" else None)
    return owners


def fully_shard_dense(model: nn.Module, world_size: int, device: torch.device) -> None:
    """FSDP2 on the model's dense weights over all `world_size` processes (in place): a unit per block that owns
    its weights, the root for the rest; model-parallel parameters are ignored."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if isinstance(model, model_contract.WithAfterStep):
        raise ValueError("--fsdp shards the weights that the model's after-step hook changes in place; train this "
                         "model with --fsdp false.")
    units = getattr(model, "blocks", None)  # without blocks (sam), one unit
    if not isinstance(units, nn.ModuleList) or model_contract.weights_used_outside_blocks(model):
        units = []
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("fsdp",))
    ignored = {p for _, p in model_parallel.sharded_parameters(model)}
    owners = _owners(model)
    for i, block in enumerate(units):
        own = [p for p in block.parameters() if p not in ignored]
        if own and all(owners[id(p)] == {i} for p in own):
            fully_shard(block, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)


def sharded_dense(model: nn.Module) -> bool:
    """Whether the model's dense weights are sharded by FSDP2 (fully_shard_dense)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def no_sync(model: nn.Module, train_model: nn.Module):
    """A micro-batch whose gradients are not yet exchanged (all but the last of a step): DDP's no_sync, or FSDP2's
    gradient reduction switched off (model: the module itself, train_model: what runs the forward)."""
    if sharded_dense(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with train_model.no_sync():
            yield
