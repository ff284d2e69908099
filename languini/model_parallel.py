"""Parameters owned by a model-parallel group: split over the processes of a group instead of copied to each.

The value table of a memory layer (split along its columns; languini/memory_layers.py) and the experts of a
mixture-of-experts layer (split by expert; projects/switch_gpt) are this codebase's model-parallel parameters.
Under torchrun with W processes and a group size S (W a multiple of S), processes S*i .. S*i + S - 1 form one
shard group, each holding 1/S of every such tensor, and the processes with the same place in their groups form
a replica group: the W / S copies of that part, data parallel among themselves. The rest of the model is copied
to every process and trained with DDP as before.

What the trainer (languini/trainer.py) does with them:
- DDP leaves them out (ddp_ignored); after a step's last backward each one's gradient is summed over its replica
  group and divided by W (finish_gradients): the mean over processes that DDP gives a copied parameter;
- the optimiser is built on the local parts, so their state lives with their shard;
- gradient clipping uses the norm of the whole gradient over all processes (clip_grad_norm_);
- checkpoints store them with torch.distributed.checkpoint (languini/checkpoint.py), so a run continues under
  another layout (2 processes to 1 or 4);
- an evaluation runs as many forward passes on every process (lockstep), since their forward talks to the group;
  a process that has run out of batches reads padding.

A config field that only sets a group size says how the model is laid out, not what it computes: a config
dataclass names such fields in its LAYOUT_FIELDS (a ClassVar), which model fingerprints and checkpoint checks
leave out (model_fields). Without torch.distributed, and inside single_process() (counting FLOPs on one process,
scripts/evaluate.py), every group has size 1: the model holds whole tensors.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from languini.books import PAD

# The initialisation draws a tensor in blocks of whole rows of at most this many elements (1 GiB of fp32 at most
# in flight), the same blocks on every layout, so every layout starts from the same numbers.
INIT_BLOCK_ELEMENTS = 2 ** 26
SHARD_DIM, REPLICA_DIM = "shard", "replica"


@dataclass(frozen=True, eq=False)
class ShardGroup:
    """The processes that split a model-parallel tensor: `size` of them, this one at place `rank`. `mesh` is the
    (replica, shard) DeviceMesh over all processes (None for a group of one, which holds whole tensors)."""
    size: int = 1
    rank: int = 0
    mesh: object = None

    @property
    def group(self):
        """The process group of the shards."""
        return self.mesh.get_group(SHARD_DIM)

    @property
    def replicas(self):
        """The process group of the processes holding the same part."""
        return self.mesh.get_group(REPLICA_DIM)

    @property
    def replica_count(self) -> int:
        return self.mesh.size(0)


WHOLE = ShardGroup()
_meshes: dict[tuple, object] = {}
_single_process = False


@contextlib.contextmanager
def single_process():
    """Models built inside hold whole tensors and talk to no other process (a FLOP count on one process)."""
    global _single_process
    previous, _single_process = _single_process, True
    try:
        yield
    finally:
        _single_process = previous


def shard_group(size: int, flag: str) -> ShardGroup:
    """The shard group of `size` processes this process belongs to (every process must ask for it in the same
    order, as building a model does); the whole-tensor group without torch.distributed or inside single_process().
    flag: the option that set the size, for the errors."""
    if size < 1:
        raise ValueError(f"{flag} must be at least 1, got {size}")
    if size == 1 or _single_process or not (dist.is_available() and dist.is_initialized()):
        return WHOLE
    world = dist.get_world_size()
    if world % size:
        raise ValueError(f"{flag} {size} splits over groups of {size} processes, but the run has {world}: start "
                         f"it with a multiple of {size} processes (torchrun --nproc_per_node), or change {flag}.")
    key = (id(dist.group.WORLD), size)  # a process group started again gets meshes of its own
    if key not in _meshes:
        from torch.distributed.device_mesh import init_device_mesh

        device_type = "cuda" if "nccl" in dist.get_backend() else "cpu"
        _meshes[key] = init_device_mesh(device_type, (world // size, size), mesh_dim_names=(REPLICA_DIM, SHARD_DIM))
    mesh = _meshes[key]
    return ShardGroup(size, mesh.get_local_rank(SHARD_DIM), mesh)


# -- model-parallel parameters ------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Sharding:
    """How a parameter is split: along `dim` over `shards`, the whole tensor of shape `full_shape`."""
    shards: ShardGroup
    dim: int
    full_shape: tuple[int, ...]

    @property
    def part(self) -> int:
        """Length of each process's part along dim."""
        return self.full_shape[self.dim] // self.shards.size


def parameter(full_shape, shards: ShardGroup, dim: int, dtype: torch.dtype | None = None,
              what: str = "the tensor") -> nn.Parameter:
    """An (uninitialised) parameter holding this process's part of a tensor of full_shape split along dim over
    `shards`; with a group of one, the whole tensor as an ordinary parameter. `what` names the split dimension
    for the error when it does not divide."""
    full_shape = tuple(full_shape)
    if full_shape[dim] % shards.size:
        raise ValueError(f"{what} ({full_shape[dim]}) must be a multiple of the {shards.size} shards it is split "
                         f"over")
    shape = list(full_shape)
    shape[dim] //= shards.size
    param = nn.Parameter(torch.empty(shape, dtype=dtype))
    if shards.size > 1:
        param.model_parallel = Sharding(shards, dim, full_shape)
    return param


def sharding(tensor: torch.Tensor) -> Sharding | None:
    """How a parameter is split over a model-parallel group; None for a parameter copied to every process."""
    return getattr(tensor, "model_parallel", None)


def sharded_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The model-parallel parameters of a model with their names (each once, shared ones under their first name)."""
    return [(name, p) for name, p in model.named_parameters() if sharding(p)]


def collective_forward(model: nn.Module) -> bool:
    """Whether the model's forward talks to other processes: it holds parts of model-parallel parameters, or FSDP
    gathers its weights (languini/parallelize.py)."""
    from torch.distributed.tensor import DTensor

    return bool(sharded_parameters(model)) or any(isinstance(p, DTensor) for p in model.parameters())


def parameter_count(model: nn.Module) -> int:
    """The model's parameters, each model-parallel one at its whole size and each shared one once."""
    return sum(math.prod(sharding(p).full_shape) if sharding(p) else p.numel() for p in model.parameters())


def local_part(full: torch.Tensor, s: Sharding) -> torch.Tensor:
    """This process's part of a whole tensor."""
    return full.narrow(s.dim, s.shards.rank * s.part, s.part)


@torch.no_grad()
def init_(param: torch.Tensor, fill: Callable[[torch.Tensor], object]) -> None:
    """fill(tensor) (an in-place init such as nn.init.normal_) applied to the whole tensor, drawn in blocks of
    whole rows (dim 0) of at most INIT_BLOCK_ELEMENTS, each process keeping its part: the same numbers whatever
    the layout, drawn from the same random stream. A whole tensor of one block is filled in place."""
    if param.is_meta:  # no storage to fill (a meta model counts parameters); drawing it block by block takes long
        return
    s = sharding(param)
    full_shape = s.full_shape if s else tuple(param.shape)
    rows = max(1, INIT_BLOCK_ELEMENTS // max(math.prod(full_shape[1:]), 1))
    if s is None and full_shape[0] <= rows:
        fill(param)
        return
    for start in range(0, full_shape[0], rows):
        block = torch.empty((min(rows, full_shape[0] - start), *full_shape[1:]), dtype=param.dtype,
                            device=param.device)
        fill(block)
        if s is None:
            param[start:start + block.shape[0]].copy_(block)
        elif s.dim > 0:
            param[start:start + block.shape[0]].copy_(local_part(block, s))
        else:  # split by rows: the rows of this block that are this process's
            first, last = s.shards.rank * s.part, (s.shards.rank + 1) * s.part
            lo, hi = max(first, start), min(last, start + block.shape[0])
            if lo < hi:
                param[lo - first:hi - first].copy_(block[lo - start:hi - start])


# -- collectives with gradients -----------------------------------------------------------------------

class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts, group):
        ctx.send_counts, ctx.recv_counts, ctx.group = send_counts, recv_counts, group
        return _all_to_all(x, send_counts, recv_counts, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.recv_counts, ctx.send_counts, ctx.group), None, None, None


def _all_to_all(x, send_counts, recv_counts, group):
    global _bytes_sent
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=group)
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    _bytes_sent += (sum(send_counts) - send_counts[dist.get_rank(group)]) * row_bytes
    return out


_bytes_sent = 0  # what this process's all-to-alls have sent to other processes (benchmarks read it)


def bytes_sent() -> int:
    """Bytes this process has sent to other processes through all_to_all (forward and backward) so far."""
    return _bytes_sent


def all_to_all(x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    """torch.distributed.all_to_all_single with gradients: the first send_counts[0] rows of x go to process 0 of
    the group, the next send_counts[1] to process 1, ...; returns the rows received, recv_counts[j] from process j,
    in process order. The backward sends each row's gradient back the way the row came."""
    return _AllToAll.apply(x, list(send_counts), list(recv_counts), group)


def exchange_counts(send_counts: torch.Tensor, group) -> list[int]:
    """How many rows each process of the group will send to this one, given how many this one sends to each
    (send_counts, one integer per process, on the group's device)."""
    return _all_to_all(send_counts.to(torch.int64), [1] * send_counts.numel(), [1] * send_counts.numel(),
                       group).tolist()


def gather_rows(x: torch.Tensor, shards: ShardGroup) -> tuple[torch.Tensor, list[int]]:
    """The rows x of every process of the group, in process order, and how many came from each (the counts are
    exchanged first, so they may differ). The backward sums each row's gradients over the processes and returns
    them to the process the row came from."""
    counts = exchange_counts(torch.full((shards.size,), x.shape[0], device=x.device), shards.group)
    copies = x.repeat(shards.size, *([1] * (x.dim() - 1)))  # one copy per process; repeat's backward sums them
    return all_to_all(copies, [x.shape[0]] * shards.size, counts, shards.group), counts


# -- what the trainer does ----------------------------------------------------------------------------

def ddp_ignored(module: nn.Module) -> list[str]:
    """Names of the model-parallel parameters of the module DDP wraps: DDP must not average them. A shared one
    under each of its names: DDP finds parameters module by module, so it would average one under a name left out."""
    return [name for name, p in module.named_parameters(remove_duplicate=False) if sharding(p)]


def finish_gradients(params: Iterable[nn.Parameter], world_size: int) -> None:
    """After a step's last backward: the gradient of each model-parallel parameter in `params` summed over its
    replica group and divided by the number of processes, as DDP's mean over processes treats a copied
    parameter. A part no token reached gets a zero gradient, as on one process, so that every process joins the
    same sums."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        shards = sharding(p).shards
        if shards.replica_count > 1:
            dist.all_reduce(p.grad, group=shards.replicas)
        p.grad.div_(world_size)


def clip_grad_norm_(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ whose norm is that of the whole gradient of the run: the copied
    parameters' (the same on every process) and the model-parallel parts' summed over their shard groups.
    Returns the norm before clipping."""
    params = [p for p in params if p.grad is not None]
    by_group: dict[int, tuple[ShardGroup, list]] = {}
    for p in params:
        if sharding(p):
            shards = sharding(p).shards
            by_group.setdefault(id(shards.mesh), (shards, []))[1].append(p.grad)
    if not by_group:  # every part is here
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    copied = [p.grad for p in params if not sharding(p)]
    device = params[0].grad.device if params else torch.device("cpu")
    squared = _whole(torch.nn.utils.get_total_norm(copied)).square() if copied else torch.zeros((), device=device)
    for shards, grads in by_group.values():
        part = torch.nn.utils.get_total_norm(grads).square()
        dist.all_reduce(part, group=shards.group)
        squared = squared + part
    total = squared.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor: a DTensor's whole value (the norm of FSDP's sharded gradients is one), any other as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def lockstep(batches: Iterable[tuple], model: nn.Module, device: torch.device) -> Iterator[tuple]:
    """The batches (x, y, mask) of this process and then, for a model whose forward talks to other processes,
    batches of padding (mask all False, nothing scored) until every process has run out: each process then runs
    as many forward passes, and no batch is empty (a model need not accept one). The padding has the shape of
    this process's last batch: the rows one process pads for streams that have ended, so what a model counts of
    its inputs (memory statistics) sums to one process's; one position where this process had no batch."""
    if not (collective_forward(model) and dist.is_initialized()):
        yield from batches
        return
    batches = iter(batches)
    last = (torch.full((1, 1), PAD), torch.full((1, 1), PAD), torch.zeros(1, 1, dtype=torch.bool))
    while True:
        batch = next(batches, None)
        left = torch.tensor(batch is not None, dtype=torch.int32, device=device)
        dist.all_reduce(left, op=dist.ReduceOp.MAX)
        if not left:
            return
        if batch is None:
            x, y, mask = last
            batch = (torch.full_like(x, PAD), torch.full_like(y, PAD), torch.zeros_like(mask))
        last = batch
        yield batch


# -- config fields that set a layout ------------------------------------------------------------------

def layout_fields(config) -> tuple[str, ...]:
    """The fields of a config dataclass that say how the model is laid out over processes, not what it computes."""
    return tuple(getattr(type(config), "LAYOUT_FIELDS", ()))


def model_fields(config) -> dict:
    """The config's fields as a dict, without its layout fields: what the model computes."""
    layout = layout_fields(config)
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in layout}


def same_model(saved: dict, config) -> bool:
    """Whether a saved config (a dict) describes the model `config` does, whatever the layout of either. A field
    the saved config lacks was added to the config since it was saved: it stands at its default, the behaviour
    the model had before the field existed (so a run saved earlier still resumes and reports finished)."""
    layout = layout_fields(config)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(config)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    return {k: v for k, v in saved.items() if k not in layout} == model_fields(config)
