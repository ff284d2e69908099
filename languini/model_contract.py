"""What the shared trainer, evaluation and FLOP count ask of a project's `Model`, written down in one place.

Required: `Model(cfg)`, `forward(x, state) -> (logits, state)` or `(logits, state, aux)`, and the class
attribute `stateful`. Expected: the output layer `head`, a torch.nn.Linear from the last hidden layer to the
vocabulary whose output is the logits (every project has it; the after-step hook, --hebbian_softmax and
--eval_cache_size use its inputs and rows and refuse a model without it). Optional (a model that does not define
one gets the default behaviour, at no cost): `optimizer_groups`, `extra_flops`, `reset_memory_stats`/
`memory_stats`, the after-step hook `after_step`, and the class attributes `checkpoint_state_dtype` (the dtype
checkpoints store the carried state in; see checkpoint_state_dtype below) and `weights_used_outside_blocks` (see
weights_used_outside_blocks below). tests/core/test_contract.py checks every
project under projects/ against it.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

CONTRACT = "languini/model_contract.py"


class ContractError(TypeError):
    """A project's Model does not follow this contract."""


@runtime_checkable
class LanguageModel(Protocol):
    """The required part of the contract."""

    # True: the model carries a state from one batch of a stream to the next (a recurrent cell's, a cache);
    # the trainer then carries it, and the slow evaluation reads each split once as one stream. False: every
    # forward starts afresh and returns None as its state.
    stateful: bool

    def forward(self, x: torch.Tensor, state=None) -> tuple:
        """x: (batch, time) token ids; state: what the previous call returned for these streams, or None.

        Returns (logits of shape (batch, time, vocab), state) or (logits, state, aux), where aux maps a name to
        a scalar loss already weighted by its coefficient: the trainer adds it to the training loss and logs
        it, but no perplexity counts it. logits[:, t] may depend only on x[:, :t + 1] and the state.
        """
        ...


@runtime_checkable
class WithOptimizerGroups(Protocol):
    def optimizer_groups(self, lr: float) -> list[dict]:
        """torch.optim parameter groups holding every parameter exactly once; a group marked "sparse": True
        (row-sparse gradients) gets a lazy SparseAdam. Default: one group of all parameters at lr."""
        ...


@runtime_checkable
class WithExtraFlops(Protocol):
    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs of one sequence at batch 1 that DeepSpeed's profiler cannot see (Triton kernels,
        elementwise recurrences). Default: 0."""
        ...


@runtime_checkable
class WithMemoryStats(Protocol):
    def reset_memory_stats(self) -> None:
        """Start recording the memory reads of every eval-mode forward until the next reset."""
        ...

    def memory_stats(self) -> dict:
        """Statistics of the reads since reset_memory_stats (over all processes when distributed): a dict for
        results.json, nested dicts and lists allowed, every number finite."""
        ...


@runtime_checkable
class WithTrainMetrics(Protocol):
    def train_metrics(self) -> dict:
        """Numbers about the last training forward (e.g. the share of tokens a mixture of experts dropped), written
        into each train row of log.jsonl; not losses (those go through the aux dict of forward)."""
        ...


@runtime_checkable
class WithAfterStep(Protocol):
    def after_step(self, hidden: torch.Tensor, targets: torch.Tensor) -> None:
        """Called by the trainer once per optimiser step, after the parameters changed, under no_grad.

        hidden: (batch, time, width), the inputs of the model's output layer `head` in the training forwards of
        that step (this process's micro-batches, concatenated along the batch, detached); targets: (batch,
        time) the tokens they predict. Hebbian softmax moves the output embedding towards them. Under data
        parallelism every process gets its own batch: a hook that changes parameters must agree across
        processes itself. The trainer records `hidden` only for models that define this method.
        """
        ...


def stateful(model_cls) -> bool:
    """The declared `stateful` of a model class (or of an instance, which may refine it: a Shortformer without a
    cache is stateless); one clear error when it has none."""
    value = getattr(model_cls, "stateful", None)
    if not isinstance(value, bool):
        name = getattr(model_cls, "__name__", type(model_cls).__name__)
        raise ContractError(f"{name} must declare the class attribute `stateful = True` (it carries a state from batch "
                        f"to batch) or `stateful = False` (it returns None as its state): see {CONTRACT}.")
    return value


def checkpoint_state_dtype(model) -> torch.dtype | None:
    """The floating dtype a model's carried states are stored in by checkpoints: its attribute
    `checkpoint_state_dtype` (e.g. torch.bfloat16 for memories of many gigabytes), or None, the default, which
    stores them as they are. The trainer casts every floating tensor of the state (nested lists, tuples and dicts
    of tensors, None entries allowed; integer tensors untouched) to it when saving and back to its dtype in memory
    when loading, so a resumed run continues with its states rounded to that dtype: not bit-exactly."""
    value = getattr(model, "checkpoint_state_dtype", None)
    if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
        name = getattr(model, "__name__", type(model).__name__)
        raise ContractError(f"{name}.checkpoint_state_dtype must be a floating torch dtype (torch.bfloat16) or None "
                            f"(store the carried states as they are), not {value!r}: see {CONTRACT}.")
    return value


def weights_used_outside_blocks(model) -> bool:
    """Whether the model reads the weights of its `blocks` outside the blocks' own forward calls (its attribute
    `weights_used_outside_blocks`; default False): compressive updates its memories with a block's compression
    and attention weights, feedback computes its blocks in its own segment. --fsdp (languini/parallelize.py) then
    gathers every weight for the model's whole forward instead of block by block."""
    value = getattr(model, "weights_used_outside_blocks", False)
    if not isinstance(value, bool):
        raise ContractError(f"{type(model).__name__}.weights_used_outside_blocks must be True or False, not "
                            f"{value!r}: see {CONTRACT}.")
    return value


def output_head(model, needed_by: str = "after_step") -> torch.nn.Module:
    """The output layer `head`, a Linear from the last hidden layer to the vocabulary: an after-step hook and the
    neural cache receive its inputs, the Hebbian Softmax moves its rows."""
    head = getattr(model, "head", None)
    if not isinstance(head, torch.nn.Linear):
        raise ContractError(f"{type(model).__name__} is used with {needed_by}, which works with the output layer: it "
                            f"needs that layer as the torch.nn.Linear `head` (see {CONTRACT}).")
    return head
