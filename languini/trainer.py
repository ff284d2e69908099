"""The one language-model trainer shared by all projects.

The model follows languini/model_contract.py: `model(x, state) -> (logits, state)`, or `(logits, state, aux)` with
auxiliary losses (see languini/aux_loss.py). The state of every micro-batch (its streams) is carried from step to
step, detached, and saved in checkpoints. A project changes the training step by subclassing Trainer and passing
it to languini.experiment.main(..., trainer_cls=...).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._pytree import tree_map
from tqdm import tqdm

from languini import (aux_loss, checkpoint, flops, frequency, hebbian, memory_layers, model_contract, model_parallel,
                      neural_cache, parallelize, stages)
from languini.books import SLOW_EVAL_PROTOCOLS, SLOW_EVAL_SAMPLES, BooksDataset, TrainBatches
from languini.compute_class import DEFAULT_REFERENCE_HARDWARE
from languini.evaluation import Evaluator, evaluate_splits
from languini.flags import arg
from languini.stages import STAGE_BATCHES
from languini.stop import StopSignals

DEFAULT_WARMUP = 200  # steps of linear warm-up of a run of 2,000 steps or more
# batches of each evaluation during training, the same for every run of a dataset, so learning curves compare
PROGRESS_BATCHES, CPU_PROGRESS_BATCHES = 50, 8


@dataclass
class TrainConfig:
    compute_class: str | None = arg(None, "training budget in reference-hardware time: 6h, 24h, 15m, 90s, ...")
    reference_hardware: str = arg(DEFAULT_REFERENCE_HARDWARE,
                                  "the hardware a compute class is measured on (a registry name)")
    tokens_per_second: float | None = arg(None, "throughput on the reference hardware, instead of the registry's")
    max_steps: int | None = arg(None, "train for this many steps instead of a compute class (debugging)")
    stages: str | None = arg(None, "sequence-length stages, e.g. 128:0.25,512: a quarter of the tokens at 128, the "
                                   "rest at 512, each charged at its own throughput (None: one stage at seq_len; "
                                   "a project may name schedules in its configs.STAGES)")
    stage_batch: str = arg("tokens", "with --stages, what a step's batch keeps fixed: tokens (the Shortformer "
                                     "authors': batch_size x the last stage's length, so a stage at a quarter of it "
                                     "trains 4 x batch_size sequences) or sequences (batch_size at every length)",
                           choices=STAGE_BATCHES)
    batch_size: int = arg(16, "global batch: sequences per optimiser step, whatever the processes and accumulation")
    micro_batches: int = arg(1, "gradient-accumulation steps per process")
    lr: float = arg(6e-4, "peak learning rate (memory values get the model's own multiple)")
    lr_schedule: str = arg("ramp_times_cosine",
                           "ramp_times_cosine (the official Languini code's): a linear warm-up ramp times a cosine "
                           "that decays over all steps from step 0; warmup_then_cosine: linear warm-up, then a "
                           "cosine over the remaining steps", choices=("ramp_times_cosine", "warmup_then_cosine"))
    warmup_steps: int | None = arg(None, f"linear warm-up steps; None: {DEFAULT_WARMUP}, or a tenth of the run if "
                                         "that is shorter, so that a short run reaches the peak lr "
                                         "(warmup_then_cosine: always at most a tenth of the run)")
    final_lr_fraction: float = arg(0.01, "cosine decay to this fraction of lr (the paper: 100x)")
    grad_clip: float | None = arg(None, "max gradient norm; None disables clipping")
    eval_every: int | None = arg(None, "steps between evaluations during training; None: ten per run")
    checkpoint_every: int | None = arg(None, "steps between checkpoints; None: at every evaluation")
    stop_at_step: int | None = arg(None, "save and exit after this step (split a run into several jobs)")
    log_every: int = arg(10, "steps between training log rows")
    eval_batch_size: int = arg(16, "streams per evaluation batch")
    eval_max_batches: int | None = arg(500, "fast eval: up to this many batches per split")
    eval_every_max_batches: int | None = arg(None, f"fast eval during training: the same first N batches of the "
                                                   f"valid split every time (at most --eval_max_batches); None: "
                                                   f"{PROGRESS_BATCHES}, or {CPU_PROGRESS_BATCHES} on a CPU (a "
                                                   "CPU-sized config without a GPU)")
    slow_eval_max_windows: int | None = arg(None, "slow eval: cap on windows per split, evenly spaced over it (a "
                                                  "stateful model's: the first ones); None: the whole split")
    slow_eval_sample: str = arg("spread", "a capped slow eval's sample: spread (--slow_eval_max_windows windows "
                                "evenly spaced over the split; a stateful model's: the first) or first (the split's "
                                "first max_windows x seq_len targets, which a stateless model reads with the "
                                "every_target protocol, so that every model scores the same targets; the caps "
                                "sized to a CPU class use it)", choices=SLOW_EVAL_SAMPLES)
    eval_budget: float | None = arg(None, "lower the eval caps so that evaluation is expected to take at most this "
                                          "fraction of the training time; None: 0.25 on a CPU (a CPU-sized config "
                                          "without a GPU), no limit on a GPU; 0: no limit")
    slow_eval: str = arg("last_n", "slow eval of stateless models: last_n (the official eval.py, the paper's tables): "
                         "every window, the first too, scores only its last slow_eval_last_n targets; every_target: "
                         "the first window scores all its targets, so every target counts once",
                         choices=SLOW_EVAL_PROTOCOLS)
    slow_eval_last_n: int | None = arg(None, "slow eval: windows move by this many tokens and score as many "
                                       "(None: seq_len // 4, the paper's 128 of 512)")
    precision: str = arg("auto", "auto (bf16 if supported, else fp16 with a grad scaler; fp32 on CPU), bf16, fp16, fp32")
    compile: bool = arg(False, "torch.compile the model (true/false)")
    fsdp: bool = arg(False, "with several processes: shard the dense weights, their gradients and Adam's state over "
                            "the processes (FSDP2) instead of a copy on each (DDP) (true/false)")
    activation_checkpointing: bool = arg(False, "recompute each block's forward in the backward instead of keeping "
                                                "its activations: less memory, one more forward of the "
                                                "blocks (true/false)")
    seed: int = arg(0, "seed of the model's initialisation")
    retime: bool = arg(False, "on a CPU (a CPU-sized config without a GPU): time the model on this machine before "
                              "the run even if a row exists, and keep the row in <out_dir>/throughput.csv for "
                              "later runs here (true/false)")
    # Hebbian Softmax and the neural cache (languini/hebbian.py, languini/neural_cache.py; Rae's thesis, chapter 4)
    hebbian_softmax: bool = arg(False, "Hebbian Softmax (Rae's thesis, Algorithm 1): after each optimiser step the "
                                       "output-layer row of every class seen, still under --hebbian_limit, is mixed "
                                       "with the mean activation that predicted it (true/false)")
    hebbian_limit: int = arg(hebbian.DEFAULT_LIMIT, "Hebbian Softmax T: a class's row mixes until it has occurred T "
                                                    "times in training (thesis: 500; 100 or 500 on Gutenberg)")
    hebbian_min_mix: float = arg(hebbian.DEFAULT_MIN_MIX, "Hebbian Softmax gamma: the least mixing weight, "
                                                          "lambda = max(1/count, gamma) (thesis: 0.1 on Gutenberg, "
                                                          "0.25 on WikiText-103)")
    hebbian_scale: str = arg("activation", "Hebbian Softmax: what a row mixes with, the mean activation as it is (the "
                                           "thesis) or rescaled to the mean norm of the layer's rows (rows: this "
                                           "kitchen's adaptation for activations much larger than trained rows)",
                             choices=hebbian.SCALES)
    eval_cache_size: int | None = arg(None, "neural cache (Grave et al. 2016) in the slow evaluation: the last N "
                                            "output-layer inputs of the stream, reported as mode slow_cache beside "
                                            "the plain slow eval (None: off; the thesis: 10000)")
    eval_cache_theta: float = arg(neural_cache.DEFAULT_THETA, "neural cache: inverse temperature of its softmax "
                                                              "over h_t . h_i (thesis: 0.3)")
    eval_cache_lambda: float = arg(neural_cache.DEFAULT_LAMBDA, "neural cache: its weight in the mixture with the "
                                                                "model's distribution (thesis: 0.1)")


class NonFiniteLoss(RuntimeError):
    pass


def eval_interval(tcfg: TrainConfig, total_steps: int) -> int:
    """Steps between the evaluations during training: --eval_every, or ten per run."""
    return tcfg.eval_every or max(total_steps // 10, 1)


def progress_evaluations(tcfg: TrainConfig, total_steps: int) -> int:
    """How many evaluations during training a run does: every eval_interval steps and after its last step."""
    interval = eval_interval(tcfg, total_steps)
    return total_steps // interval + (1 if total_steps % interval else 0)


def progress_split(splits: list[str]) -> str:
    """The split evaluated during training."""
    return "valid" if "valid" in splits else "test"


def eval_every_max_batches(tcfg: TrainConfig) -> int:
    """The batches of each evaluation during training: --eval_every_max_batches (PROGRESS_BATCHES if None), at most
    --eval_max_batches."""
    caps = [c for c in (tcfg.eval_every_max_batches or PROGRESS_BATCHES, tcfg.eval_max_batches) if c is not None]
    return min(caps)


PLAIN_PROGRESS_SECONDS = 30  # between the progress lines of a run whose output is not a terminal


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def detach(state):
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, state)


def step_optimizers(optimizers, scaler) -> None:
    """Step every optimiser, through the fp16 gradient scaler when there is one."""
    for opt in optimizers:
        if scaler:
            scaler.step(opt)
        else:
            opt.step()
    if scaler:
        scaler.update()


def ramp_times_cosine(step: int, total: int, warmup: int, final_fraction: float) -> float:
    """The official Languini schedule: a linear ramp over `warmup` steps times a cosine from 1 to final_fraction
    over all `total` steps, both from the start. Step 0 is the first optimiser step, which the official
    scheduler takes at its count 1 (it counts once when built)."""
    count = step + 1
    cosine = 0.5 * (1 + math.cos(math.pi * min(count, total) / total))
    ramp = min(count, warmup) / warmup if warmup > 0 else 1.0
    return ramp * (final_fraction + (1 - final_fraction) * cosine)


def warmup_then_cosine(step: int, total: int, warmup: int, final_fraction: float) -> float:
    """Linear warm-up, then cosine decay from 1 to final_fraction at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


LR_SCHEDULES = {"ramp_times_cosine": ramp_times_cosine, "warmup_then_cosine": warmup_then_cosine}


def precision_for(device: torch.device, precision: str):
    """(autocast context factory, grad scaler or None, name)."""
    if precision == "auto":
        if device.type == "cuda":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            precision = "fp32"
    if precision == "fp32":
        return contextlib.nullcontext, None, precision
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"--precision must be auto, bf16, fp16 or fp32, not {precision}")
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("fp16 autocast with loss scaling needs a GPU; use --precision bf16 or fp32 on CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU has no bf16; use --precision fp16")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler, precision


def build_optimizers(model: torch.nn.Module, lr: float, device: torch.device):
    """Adam (betas 0.9, 0.95) over the model's parameter groups, and the dense parameters (for clipping).

    Groups marked "sparse" (memory values with row-sparse gradients) get a lazy SparseAdam: only rows read move.
    """
    groups = (model.optimizer_groups(lr) if isinstance(model, model_contract.WithOptimizerGroups)
              else [{"params": list(model.parameters()), "lr": lr}])
    dense = [{k: v for k, v in g.items() if k != "sparse"} for g in groups if not g.get("sparse")]
    sparse = [{k: v for k, v in g.items() if k != "sparse"} for g in groups if g.get("sparse")]
    optimizers = [torch.optim.Adam(dense, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")]
    if sparse:
        optimizers.append(torch.optim.SparseAdam(sparse, lr=lr, betas=(0.9, 0.95), eps=1e-8))
    return optimizers, [p for g in dense for p in g["params"]]


def warmup_steps(tcfg: TrainConfig, total_steps: int) -> int:
    """The warm-up of a run of total_steps: --warmup_steps, else DEFAULT_WARMUP or a tenth of the run if shorter;
    warmup_then_cosine caps any warm-up at a tenth of the run."""
    tenth = max(total_steps // 10, 1)
    if tcfg.warmup_steps is None:
        return min(DEFAULT_WARMUP, tenth)
    return min(tcfg.warmup_steps, tenth) if tcfg.lr_schedule == "warmup_then_cosine" else tcfg.warmup_steps


def build_schedulers(optimizers, tcfg: TrainConfig, total_steps: int) -> list:
    """One LambdaLR per optimiser following --lr_schedule over `total_steps` steps."""
    if tcfg.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"--lr_schedule must be one of {', '.join(LR_SCHEDULES)}, not {tcfg.lr_schedule}")
    lr_factor, warmup = LR_SCHEDULES[tcfg.lr_schedule], warmup_steps(tcfg, total_steps)
    return [torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, total_steps, warmup, tcfg.final_lr_fraction)) for opt in optimizers]


class TrainStep:
    """One optimiser step over the micro-batches of a batch: the step Trainer trains with and the step
    languini/measure.py times for a throughput row, so a row is the speed of what trains.

    model: the module itself (its after-step hook); train_model: what runs the forward (compiled, DDP-wrapped).
    hebbian: the Hebbian Softmax of the model's output layer (languini.hebbian), applied after the optimiser step.
    For a model with an after-step hook, or with hebbian, the output layer's inputs are recorded until close().
    """

    def __init__(self, model: torch.nn.Module, train_model: torch.nn.Module, optimizers: list, dense_params: list,
                 schedulers: list, autocast, scaler, grad_clip: float | None, micro_batches: int,
                 device: torch.device, world_size: int = 1, hebbian: hebbian.HebbianSoftmax | None = None):
        self.model, self.train_model, self.optimizers, self.dense_params = model, train_model, optimizers, dense_params
        self.schedulers, self.autocast, self.scaler, self.grad_clip = schedulers, autocast, scaler, grad_clip
        self.micro_batches, self.device, self.world_size = micro_batches, device, world_size
        self.hebbian = hebbian
        self.sharded = [p for _, p in model_parallel.sharded_parameters(model)]  # not averaged by DDP
        self.hidden = None  # the output layer's inputs of this step, for an after-step hook; else None
        self._hook = None
        # a trainer's own objective (languini/distill.py): (micro-batch index, x, logits, y, cross-entropy) ->
        # (the loss to train on in place of the cross-entropy, auxiliary losses to add and log); None: none
        self.objective = None
        if isinstance(model, model_contract.WithAfterStep) or hebbian is not None:
            self.hidden = []
            self._hook = model_contract.output_head(model).register_forward_hook(self._record_hidden)

    def close(self) -> None:
        """Stop recording the output layer's inputs (a step built for one measurement)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook, self.hidden = None, None

    def _record_hidden(self, head, args, output) -> None:
        if head.training:
            self.hidden.append(args[0].detach())

    @torch.no_grad()
    def after_step(self, y: torch.Tensor) -> None:
        """The Hebbian Softmax, then the model's after-step hook, with this step's hidden states and targets
        (model_contract.WithAfterStep)."""
        hidden, self.hidden = torch.cat(self.hidden), []
        targets = y.flatten(0, 1).to(self.device)
        if self.hebbian is not None:
            self.hebbian.update(hidden, targets)
        if isinstance(self.model, model_contract.WithAfterStep):
            self.model.after_step(hidden, targets)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, states: list, after_step=None) -> tuple[float, dict]:
        """Train on x, y of shape (micro_batches, batch, seq_len), carrying `states` (one per micro-batch, updated
        in place). Returns the mean language-model loss and the mean auxiliary losses over the global batch
        (all processes). after_step: what runs the model's after-step hook (default self.after_step)."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        aux_totals = {}
        M = self.micro_batches
        for m in range(M):
            sync = m == M - 1 or self.world_size == 1
            ctx = contextlib.nullcontext() if sync else parallelize.no_sync(self.model, self.train_model)
            with ctx:
                xm, ym = x[m].to(self.device, non_blocking=True), y[m].to(self.device, non_blocking=True)
                with self.autocast():
                    logits, state, aux = aux_loss.unpack(self.train_model(xm, states[m]))
                loss = F.cross_entropy(logits.float().flatten(0, 1), ym.flatten())
                trained = loss
                if self.objective is not None:
                    trained, extra = self.objective(m, xm, logits, ym, loss)
                    aux = {**aux, **extra}
                objective = (trained + aux_loss.total(aux)) / M
                (self.scaler.scale(objective) if self.scaler else objective).backward()
            states[m] = detach(state)
            total += loss.detach() / M
            for name, value in aux.items():
                aux_totals[name] = aux_totals.get(name, 0.0) + value.detach().float() / M
        if self.sharded:
            model_parallel.finish_gradients(self.sharded, self.world_size)
        if self.grad_clip:
            if self.scaler:
                self.scaler.unscale_(self.optimizers[0])
            # The norm covers dense gradients only (model-parallel parts of every process included); row-sparse
            # value gradients are not clipped.
            model_parallel.clip_grad_norm_(self.dense_params, self.grad_clip)
        step_optimizers(self.optimizers, self.scaler)
        for sched in self.schedulers:
            sched.step()
        if self.hidden is not None:
            (after_step or self.after_step)(y)
        if self.world_size > 1:
            for value in (total, *aux_totals.values()):
                dist.all_reduce(value)  # SUM: gloo (CPU) has no AVG
                value /= self.world_size
        return total.item(), {name: value.item() for name, value in aux_totals.items()}


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


DIST_TIMEOUT_MINUTES = 30.0  # a process waits this long for the others (a slow evaluation, a checkpoint)


def init_distributed(timeout_minutes: float = DIST_TIMEOUT_MINUTES) -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; DDP then synchronises the gradients of the copied parameters
    (languini/model_parallel.py those of the model-parallel ones). A collective that waits longer than
    timeout_minutes for another process fails the run instead of hanging it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not timeout_minutes > 0:
        raise ValueError(f"--dist_timeout_minutes must be positive, got {timeout_minutes}.")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return Dist(dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0")))


def check_same_flags(flags: dict, world_size: int) -> None:
    """Every process of a run must be given the same flags (resolved: `flags`, name -> value), or they train apart
    or wait for each other forever. Each process compares a hash of its flags with the others'; where any differ,
    every process fails with the same ValueError naming the flags and each process's value."""
    if world_size == 1:
        return
    digest = hashlib.sha256(json.dumps(flags, sort_keys=True, default=repr).encode()).hexdigest()
    digests = [None] * world_size
    dist.all_gather_object(digests, digest)
    if len(set(digests)) == 1:
        return
    every = [None] * world_size
    dist.all_gather_object(every, flags)
    differing = sorted(name for name in set().union(*every) if len({repr(f.get(name)) for f in every}) > 1)
    described = "; ".join(f"--{name} (" + ", ".join(f"process {r}: {f.get(name)}" for r, f in enumerate(every)) + ")"
                          for name in differing)
    raise ValueError(f"The processes of this run were given different flags: {described}. Start every process "
                     "with the same command.")


CLOSE_GRACE_SECONDS = 0.2  # a pause for gloo's thread to free the finished barrier (a few destructor calls)


def close_distributed(ddp: Dist) -> None:
    """Ends the process group of a torchrun run: every process done before any tears its connections down (a gloo
    process left by the other mid-talk aborts, "terminate called without an active exception").

    After the barrier the process waits a moment without the GIL: gloo's worker thread frees the barrier's work
    (and the last collective's Python tensors it holds) and needs the GIL for it, while the process group's
    destructor, run later when the DDP model is freed, joins that thread holding the GIL (a deadlock, seen on
    the CPU with gloo)."""
    if ddp.world_size > 1 and dist.is_initialized():
        dist.barrier()
        time.sleep(CLOSE_GRACE_SECONDS)
        dist.destroy_process_group()


class Trainer:
    """Trains one model for `total_steps` steps and evaluates it; the run's records are languini/experiment.py's.

    tokens_per_second: throughput on the reference hardware (None: accelerator time unknown); flops_per_forward
    and peak_flops (of the local device): for the MFU of the log rows, when both are known.
    """

    def __init__(self, *, project: str, config_name: str, model_cfg, model_cls, tcfg: TrainConfig,
                 dataset: BooksDataset, bytes_per_token: torch.Tensor, run_dir: Path, total_steps: int,
                 tokens_per_second: float | None, flops_per_forward: float | None = None,
                 peak_flops: float | None = None, device: torch.device | None = None, ddp: Dist | None = None,
                 decode=None, resume: bool = False, schedule: stages.Schedule | None = None):
        self.project, self.config_name, self.model_cfg, self.tcfg = project, config_name, model_cfg, tcfg
        self.dataset, self.run_dir, self.total_steps = dataset, run_dir, total_steps
        self.tokens_per_second, self.flops_per_forward, self.peak_flops = tokens_per_second, flops_per_forward, peak_flops
        self.stateful = model_contract.stateful(model_cls)
        self.ddp = ddp or Dist()
        self.device = device or torch.device("cpu")
        self.seq_len = model_cfg.seq_len
        # the length of each step (without --stages, seq_len throughout) and each stage's reference throughput
        self.schedule = schedule or stages.schedule_for_steps(tcfg.stages, self.seq_len, total_steps, tokens_per_second,
                                                              tcfg.stage_batch)

        torch.manual_seed(tcfg.seed)
        self.model = model_cls(model_cfg).to(self.device)
        self.stateful = model_contract.stateful(self.model)  # an instance may refine its class's (no cache: False)
        self.checkpoint_state_dtype = model_contract.checkpoint_state_dtype(self.model)
        if tcfg.activation_checkpointing:
            parallelize.checkpoint_activations(self.model)
        self.fsdp = tcfg.fsdp and self.ddp.world_size > 1  # one process has nothing to shard with
        if self.fsdp:
            if tcfg.hebbian_softmax:
                raise ValueError("--hebbian_softmax changes the output layer's rows in place, which --fsdp shards; "
                                 "train with one of the two.")
            parallelize.fully_shard_dense(self.model, self.ddp.world_size, self.device)
        self.optimizers, self.dense_params = build_optimizers(self.model, tcfg.lr, self.device)
        if len(self.optimizers) > 1 and self.ddp.world_size > 1:
            raise ValueError("Row-sparse value gradients are single-process only; use --sparse_values false with DDP.")
        self.schedulers = build_schedulers(self.optimizers, tcfg, total_steps)
        self.autocast, self.scaler, self.precision = precision_for(self.device, tcfg.precision)

        self.train_model = self.model
        if tcfg.compile:
            self.train_model = torch.compile(self.model)
        if self.ddp.world_size > 1 and not self.fsdp:
            ids = [self.device.index] if self.device.type == "cuda" else None
            DDP = torch.nn.parallel.DistributedDataParallel
            # model-parallel parts differ between processes: DDP neither broadcasts nor averages them
            DDP._set_params_and_buffers_to_ignore_for_model(self.train_model,
                                                            model_parallel.ddp_ignored(self.train_model))
            self.train_model = DDP(self.train_model, device_ids=ids)
        self.hebbian = hebbian.for_run(self.model, tcfg, self.ddp.world_size)
        self.step_runner = TrainStep(self.model, self.train_model, self.optimizers, self.dense_params, self.schedulers,
                                     self.autocast, self.scaler, tcfg.grad_clip, tcfg.micro_batches, self.device,
                                     self.ddp.world_size, self.hebbian)
        if self.scaler and self.step_runner.sharded:  # each process would skip steps on its own parts' overflows
            raise ValueError("fp16 with a gradient scaler is not supported with parameters split over processes "
                             "(--memory_shards, --expert_parallel); use --precision bf16 or fp32.")

        self.batches = TrainBatches(dataset.books("train"), model_cfg.vocab_size, tcfg.batch_size, self.seq_len,
                                    tcfg.micro_batches, self.ddp.rank, self.ddp.world_size, self.schedule)
        self.states = [None] * tcfg.micro_batches
        # every eval row reports perplexity by training frequency (Rae's thesis, Table 4.2)
        self.frequency = frequency.FrequencyBuckets.of_dataset(dataset, model_cfg.vocab_size, self.ddp.main)

        def evaluator(max_batches, cache=None):
            return Evaluator(bytes_per_token, model_cfg.vocab_size, self.seq_len, self.device, tcfg.eval_batch_size,
                             max_batches, tcfg.slow_eval_max_windows, self.autocast, self.ddp.rank, self.ddp.world_size,
                             decode, tcfg.slow_eval, tcfg.slow_eval_last_n, frequency=self.frequency, cache=cache,
                             slow_sample=tcfg.slow_eval_sample)

        self.evaluator = evaluator(tcfg.eval_max_batches, neural_cache.settings(tcfg))
        self.progress_evaluator = evaluator(eval_every_max_batches(tcfg))  # the smaller evaluations during training
        self.eval_split = progress_split(dataset.splits)
        self.last_progress = None  # the last evaluation during training (progress_evaluation)
        self.step = 0
        self.train_seconds = 0.0  # wall time of the training steps so far, evaluations and checkpoints apart
        # wall time over all jobs of the run (kept in checkpoints); _clock is the last accounting while training
        self.wall_seconds = {"training": 0.0, "evaluation_during_training": 0.0, "final_evaluation": 0.0}
        self._clock = None
        self.log_rows = None  # rows of log.jsonl when the checkpoint resumed from was saved
        self.keep_previous_checkpoint = True
        if resume:
            ckpt, path = checkpoint.load(run_dir, self.device, warn=print if self.ddp.main else lambda _: None,
                                         merge_shards=False)
            # after a fallback the unreadable latest is overwritten and the good previous one kept
            self.keep_previous_checkpoint = path.name == checkpoint.CHECKPOINT
            self.load_state_dict(ckpt)
            if self.ddp.main:
                print(f"Resuming from {path} at step {self.step:,} of {total_steps:,}.")

    # -- bookkeeping -------------------------------------------------------------------------------------
    def position(self, step: int) -> dict:
        tokens = self.schedule.tokens(step, self.tcfg.batch_size)
        seconds = self.schedule.accelerator_seconds(step, self.tcfg.batch_size)  # None: throughput unknown
        return {"step": step, "tokens": tokens, "accelerator_seconds": seconds}

    def state_dict(self) -> dict:
        """Everything an exact resume needs: model, optimisers, schedules, RNGs, the carried states, the clocks.
        The states are stored in the model's checkpoint_state_dtype, if it has one (then the resume is not exact).
        Model-parallel parameters appear as this process's parts (save() puts them in the shards folder)."""
        states, state_dtypes = checkpoint.pack_states(self.states, self.checkpoint_state_dtype)
        return {"model": self.model.state_dict(), "optimizers": [o.state_dict() for o in self.optimizers],
                "schedulers": [s.state_dict() for s in self.schedulers],
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "rng": checkpoint.rng_state(), "step": self.step, "states": states, "state_dtypes": state_dtypes,
                "world_size": self.ddp.world_size,
                "model_config": dataclasses.asdict(self.model_cfg), "total_steps": self.total_steps,
                "stage_steps": self._stage_steps(),
                "train_wall_seconds": self.train_seconds, "wall_seconds": dict(self.wall_seconds),
                "hebbian": self.hebbian.state_dict() if self.hebbian else None}

    def _stage_steps(self) -> list[tuple]:
        """(length, steps) of each stage, and its rows per stream where more than one (--stage_batch tokens)."""
        return [(length, n) if r == 1 else (length, n, r)
                for length, n, r in zip(self.schedule.seq_lens, self.schedule.steps, self.schedule.rows)]

    def load_state_dict(self, ckpt: dict) -> None:
        """Continue from a state_dict() (a checkpoint) of a run with the same model config and budget."""
        stage_steps = [list(s) for s in ckpt.get("stage_steps", self._stage_steps())]
        memory_layers.check_renamed(ckpt["model_config"], type(self.model_cfg))
        if (not model_parallel.same_model(ckpt["model_config"], self.model_cfg)
                or ckpt["total_steps"] != self.total_steps
                or stage_steps != [list(s) for s in self._stage_steps()]):
            raise ValueError(f"The checkpoint in {self.run_dir} was trained with another model config or budget; "
                             "resume with the same flags or choose another --run_name.")
        saved_on = ckpt.get("world_size")  # None: a checkpoint written before it was recorded
        if self.stateful and saved_on is not None and saved_on != self.ddp.world_size:
            raise checkpoint.CheckpointError(
                f"The checkpoint in {self.run_dir} carries the recurrent states of the streams of {saved_on} "
                f"process(es), not {self.ddp.world_size}: resume with as many processes as the run was started with, "
                "or train it again with --overwrite true.")
        if not self.stateful:  # nothing carried: any number of processes may continue the run
            states = [None] * self.tcfg.micro_batches
        elif self.ddp.world_size > 1:  # every process carries the states of its own streams
            states = checkpoint.load_rank_states(self.run_dir, self.ddp.rank, ckpt["step"], self.device)
        else:
            states = checkpoint.unpack_states(ckpt["states"], ckpt.get("state_dtypes"))
        if (ckpt.get("hebbian") is None) != (self.hebbian is None):
            raise ValueError(f"The checkpoint in {self.run_dir} was trained with --hebbian_softmax "
                             f"{str(ckpt.get('hebbian') is not None).lower()}; resume with the same flags.")
        if self.hebbian:
            self.hebbian.load_state_dict(ckpt["hebbian"])
        # model-parallel tensors: cut to this layout's parts, or read from the shards folder after the rest
        from_shards = checkpoint.prepare_restore(ckpt, self.model, self.optimizers)
        self.model.load_state_dict(ckpt["model"])
        for opt, state in zip(self.optimizers, ckpt["optimizers"], strict=True):
            opt.load_state_dict(state)
        if from_shards:
            checkpoint.restore_shards(self.run_dir, ckpt["step"], from_shards, self.model, self.optimizers)
        for sched, state in zip(self.schedulers, ckpt["schedulers"], strict=True):
            sched.load_state_dict(state)
        if self.scaler and ckpt["scaler"]:
            self.scaler.load_state_dict(ckpt["scaler"])
        checkpoint.set_rng_state(ckpt["rng"])
        self.step, self.states, self.log_rows = ckpt["step"], states, ckpt.get("log_rows")
        self.train_seconds = ckpt.get("train_wall_seconds", 0.0)
        self.wall_seconds.update(ckpt.get("wall_seconds", {}))

    def _account_wall(self, kind: str) -> None:
        """Add the wall time since the last accounting to `kind`; nothing while not training."""
        now = time.perf_counter()
        if self._clock is not None:
            self.wall_seconds[kind] += now - self._clock
        self._clock = now

    def save(self, log_rows: int | None = None):
        """Checkpoint the state after the last completed step; log_rows: rows of log.jsonl written by then."""
        self._account_wall("training")  # the checkpoint holds the time spent until now
        keep = self.keep_previous_checkpoint
        state = None
        if self.step_runner.sharded or self.fsdp:  # every process writes its parts of the split tensors
            state = self.state_dict()
            parts = checkpoint.move_to_shards(state, self.model, self.optimizers)
            checkpoint.save_shards(self.run_dir, self.step, parts, keep, self.ddp.main)
        if self.ddp.world_size > 1:
            checkpoint.save_rank_states(self.run_dir, self.ddp.rank, self.step, self.states, keep,
                                        self.checkpoint_state_dtype)
            dist.barrier()  # the main checkpoint only once every process has its states on disk
        if self.ddp.main:
            checkpoint.save(self.run_dir, {**(state or self.state_dict()), "log_rows": log_rows}, keep)
        self.keep_previous_checkpoint = True

    def _checkpoint(self, log):
        log.sync()
        self.save(log.rows)

    # -- training ----------------------------------------------------------------------------------------
    @property
    def step_hidden(self) -> list | None:
        """The output layer's inputs of this step, for an after-step hook; None for a model without one."""
        return self.step_runner.hidden

    def after_step(self, y: torch.Tensor) -> None:
        """The model's after-step hook with this step's hidden states and targets (model_contract.WithAfterStep)."""
        self.step_runner.after_step(y)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimiser step over the micro-batches; returns the mean language-model loss over the global batch.
        The model's auxiliary losses join the backward but not the returned loss; their means over the global
        batch are left in self.aux_losses."""
        loss, self.aux_losses = self.step_runner(x, y, self.states, self.after_step)
        return loss

    def train(self, log, stop: StopSignals | None = None) -> None:
        """Train to the last step (or --stop_at_step); after a stop signal, to the end of the current step."""
        tcfg, total = self.tcfg, self.total_steps
        eval_every = eval_interval(tcfg, total)
        ckpt_every = tcfg.checkpoint_every or eval_every
        last = min(total, tcfg.stop_at_step) if tcfg.stop_at_step else total
        # disable=None: a bar only on a terminal, so that redirected logs hold lines, not carriage returns
        bar = tqdm(total=total, initial=self.step, desc=f"{self.project}/{self.config_name}", unit="step",
                   disable=None if self.ddp.main else True, dynamic_ncols=True)
        prefetch = ThreadPoolExecutor(1)  # batches depend only on the step, so the next one loads meanwhile
        future = prefetch.submit(self.batches, self.step)
        t_mark = time.perf_counter()  # the end of the last step or pause
        self._clock = t_mark
        step_logged, seconds_logged = self.step, self.train_seconds
        saved_step = self.step  # the step of the checkpoint on disk (or of the start)
        # without a bar (a redirected log) a line now and then says how far the run is
        plain = self.ddp.main and bar.disable
        first_step, loop_start, line_at = self.step, time.perf_counter(), time.perf_counter()
        try:
            while self.step < last:
                if stop is not None and stop.agreed(self.ddp.world_size, self.device):
                    break  # all processes stop after the same step
                x, y = future.result()
                if self.step + 1 < last:
                    future = prefetch.submit(self.batches, self.step + 1)
                if self.schedule.resets_state_at(self.step):  # the rows of a stream change: none continues a text
                    self.states = [None] * tcfg.micro_batches
                loss = self.train_step(x, y)
                if not math.isfinite(loss):
                    raise NonFiniteLoss(
                        f"Loss is {loss} at step {self.step + 1}. Training stopped; the last good checkpoint in "
                        f"{self.run_dir} is kept. Try a lower --lr, --grad_clip 1.0 or --precision bf16/fp32.")
                self.step += 1
                self.train_seconds += time.perf_counter() - t_mark
                bar.update(1)
                if self.step % tcfg.log_every == 0 or self.step == last:
                    tokens = self.position(self.step)["tokens"] - self.position(step_logged)["tokens"]
                    tok_s = tokens / (self.train_seconds - seconds_logged)
                    step_logged, seconds_logged = self.step, self.train_seconds
                    row = {"event": "train", **self.position(self.step),
                           "seq_len": self.schedule.seq_len_at(self.step - 1), "loss": loss,
                           "lr": self.schedulers[0].get_last_lr()[0], "tokens_per_second_local": tok_s,
                           "train_wall_seconds": self.train_seconds,
                           **{f"aux_{name}": value for name, value in self.aux_losses.items()},
                           **(self.model.train_metrics()
                              if isinstance(self.model, model_contract.WithTrainMetrics) else {})}
                    if self.flops_per_forward and self.peak_flops:
                        row["mfu"] = flops.mfu(self.flops_per_forward, self.seq_len, tok_s, self.peak_flops)
                    log.write(row)
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}",
                                    **({"mfu": f"{row['mfu']:.1%}"} if "mfu" in row else {}))
                    now = time.perf_counter()
                    if plain and (now - line_at >= PLAIN_PROGRESS_SECONDS or self.step == last):
                        line_at = now
                        left = (last - self.step) * (now - loop_start) / (self.step - first_step)
                        print(f"step {self.step:,}/{total:,} ({self.step / total:.0%}): loss {loss:.3f}, "
                              f"{tok_s:,.0f} tokens/s" + (f", MFU {row['mfu']:.1%}" if "mfu" in row else "")
                              + f", {_clock(now - loop_start)} elapsed, about {_clock(left)} left", flush=True)
                if self.step % eval_every == 0 or self.step == total:
                    self._account_wall("training")
                    started = time.perf_counter()
                    result = self.last_progress = self.progress_evaluation()
                    log.write({"event": "eval", **self.position(self.step), **result,
                               "wall_seconds": time.perf_counter() - started})
                    if self.ddp.main:  # tqdm.write prints even where the bar is disabled
                        bar.write(f"step {self.step}: {self.eval_split} normalised perplexity "
                                  f"{result['normalised_perplexity']:.4f}")
                    self._account_wall("evaluation_during_training")
                if self.step % ckpt_every == 0 or self.step == last:
                    self._checkpoint(log)
                    saved_step = self.step
                t_mark = time.perf_counter()  # throughput and training time leave out logging, evaluations, checkpoints
            if self.step != saved_step:  # stopped by a signal between checkpoints
                self._checkpoint(log)
        finally:
            prefetch.shutdown(wait=True)
            bar.close()
            self._account_wall("training")
            self._clock = None

    def progress_evaluation(self) -> dict:
        """The evaluation during training: the fast eval of the first --eval_every_max_batches batches of the
        valid split (or test), the same subset every time, the last step's included, so that a learning curve
        compares like with like (the final evaluation reads more)."""
        result = self.progress_evaluator.fast(self.model, self.dataset.books(self.eval_split)).as_dict()
        return {"split": self.eval_split, "mode": "fast", **result, "max_batches": self.progress_evaluator.max_batches,
                "progress": True}

    def final_evaluation(self, log) -> dict:
        say = print if self.ddp.main else (lambda *a, **k: None)
        start = time.perf_counter()
        evals = evaluate_splits(self.evaluator, self.model, self.dataset,
                                [s for s in self.dataset.splits if s != "train"], self.stateful,
                                write_row=lambda row: log.write({"event": "eval", **self.position(self.step), **row}),
                                say=say)
        # the last point of the learning curve, on the subset of every evaluation during training
        evals["progress_eval"] = {"step": self.step, **(self.last_progress or self.progress_evaluation())}
        self.wall_seconds["final_evaluation"] += time.perf_counter() - start
        return evals


def write_json(path: Path, data: dict) -> None:
    checkpoint.write_atomically(path, lambda f: f.write((json.dumps(data, indent=2) + "\n").encode()))
