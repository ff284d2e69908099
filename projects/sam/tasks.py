"""The NTM tasks of the thesis's section 3.4.2 (after Graves et al. 2014), with the exponential curriculum of 3.4.3.

Each episode is (inputs (B, T, in), targets (B, T, out), mask (B, T)): binary vectors in, binary vectors out,
the loss counted only where the mask is 1. A builder turns given content into an episode (the tests check them
against hand-worked examples); a generator draws the content at random.

- copy: a sequence of `length` random vectors of `bits` bits (length 1-20 in 3.4.2), then a delimiter; the model
  outputs the sequence while it reads blanks. Channels: the bits and the delimiter.
- associative recall: `pairs` random (key, value) pairs (3-6), each key and value a vector of `bits`, the keys of
  an episode distinct (so that the query has one answer), shown as a key step (key flag on) and a value step; then a query step (query flag on) with one of the keys; then one blank
  step at which the model outputs that key's value. Channels: the bits, the key flag, the query flag.
- priority sort: `items` random vectors (20) each with a priority drawn uniformly from [-1, 1] on its own channel,
  then a delimiter; the model outputs the `outputs` (16) vectors of highest priority, highest first, while it reads
  blanks. Channels: the bits, the priority, the delimiter.

Cost per sequence: the binary cross-entropy of the output bits, in bits, summed over the sequence (the NTM's
measure); errors: output bits wrong at threshold 0.5, per sequence.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

TASKS = ("copy", "recall", "sort")


@dataclass(frozen=True)
class TaskSpec:
    inputs: int  # input channels
    outputs: int  # output channels
    levels: tuple[int, int]  # the thesis's range of the task's size (3.4.2)


def spec(task: str, bits: int = 8) -> TaskSpec:
    if task == "copy":
        return TaskSpec(bits + 1, bits, (1, 20))
    if task == "recall":
        return TaskSpec(bits + 2, bits, (3, 6))
    if task == "sort":
        return TaskSpec(bits + 2, bits, (20, 20))
    raise ValueError(f"task must be one of {', '.join(TASKS)}, not {task!r}")


def copy_episode(sequence: torch.Tensor):
    """sequence (B, L, bits) -> inputs (B, 2L + 1, bits + 1), targets (B, 2L + 1, bits), mask (B, 2L + 1)."""
    B, L, bits = sequence.shape
    x = torch.zeros(B, 2 * L + 1, bits + 1)
    x[:, :L, :bits] = sequence
    x[:, L, bits] = 1.0
    y = torch.zeros(B, 2 * L + 1, bits)
    y[:, L + 1:] = sequence
    mask = torch.zeros(B, 2 * L + 1)
    mask[:, L + 1:] = 1.0
    return x, y, mask


def recall_episode(keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor):
    """keys, values (B, P, bits); query (B,) the index of the pair asked for -> inputs (B, 2P + 2, bits + 2),
    targets (B, 2P + 2, bits), mask (B, 2P + 2): only the last step is scored."""
    B, P, bits = keys.shape
    T = 2 * P + 2
    x = torch.zeros(B, T, bits + 2)
    x[:, 0:2 * P:2, :bits] = keys
    x[:, 0:2 * P:2, bits] = 1.0
    x[:, 1:2 * P:2, :bits] = values
    x[:, 2 * P, :bits] = keys[torch.arange(B), query]
    x[:, 2 * P, bits + 1] = 1.0
    y = torch.zeros(B, T, bits)
    y[:, -1] = values[torch.arange(B), query]
    mask = torch.zeros(B, T)
    mask[:, -1] = 1.0
    return x, y, mask


def sort_episode(vectors: torch.Tensor, priorities: torch.Tensor, outputs: int):
    """vectors (B, n, bits), priorities (B, n) -> inputs (B, n + 1 + outputs, bits + 2), targets, mask: the
    `outputs` vectors of highest priority, highest first, after the delimiter."""
    B, n, bits = vectors.shape
    T = n + 1 + outputs
    x = torch.zeros(B, T, bits + 2)
    x[:, :n, :bits] = vectors
    x[:, :n, bits] = priorities
    x[:, n, bits + 1] = 1.0
    order = priorities.argsort(dim=1, descending=True)[:, :outputs]
    y = torch.zeros(B, T, bits)
    y[:, n + 1:] = vectors.gather(1, order[..., None].expand(-1, -1, bits))
    mask = torch.zeros(B, T)
    mask[:, n + 1:] = 1.0
    return x, y, mask


def episode(task: str, batch: int, level: int, generator: torch.Generator, bits: int = 8):
    """A random episode of size `level` (copy: the sequence length; recall: the pairs; sort: the items, of which
    the top 80% are output, 16 of 20 as in 3.4.2)."""
    def random_bits(*shape):
        return torch.randint(0, 2, shape, generator=generator).float()

    if task == "copy":
        return copy_episode(random_bits(batch, level, bits))
    if task == "recall":
        if level > 2 ** bits:
            raise ValueError(f"{level} pairs need distinct keys: at most 2^{bits} = {2 ** bits}")
        keys = random_bits(batch, level, bits)
        while True:  # redraw the episodes with a repeated key: the answer to its query would be ambiguous
            repeated = (keys[:, :, None] == keys[:, None]).all(-1).triu(1).any(-1).any(-1)
            if not repeated.any():
                break
            keys[repeated] = random_bits(int(repeated.sum()), level, bits)
        query = torch.randint(level, (batch,), generator=generator)
        return recall_episode(keys, random_bits(batch, level, bits), query)
    if task == "sort":
        priorities = torch.rand(batch, level, generator=generator) * 2 - 1
        return sort_episode(random_bits(batch, level, bits), priorities, max(1, round(0.8 * level)))
    raise ValueError(f"task must be one of {', '.join(TASKS)}, not {task!r}")


def cost_per_sequence(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over the batch of the summed binary cross-entropy of the scored output bits, in bits."""
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    return (bce * mask).sum(1).mean() / torch.log(torch.tensor(2.0))


def errors_per_sequence(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """Output bits wrong at threshold 0.5, per sequence (mean over the batch)."""
    wrong = ((logits > 0).float() != targets).float().sum(-1)
    return float((wrong * mask).sum(1).mean())


class Curriculum:
    """3.4.3: the level of each minibatch is drawn uniformly from [1, h], the thesis's U(0, h) without level 0 (an
    episode with nothing to score: no vector to copy, no pair to ask for, nothing to sort); h starts at `start`
    (default max(low, 2)) and doubles (up to `high`) once the mean training cost per sequence of the last `window`
    minibatches is below `threshold`. Without a curriculum (`enabled` False) levels are drawn from the task's
    range [low, high] (3.4.2)."""

    def __init__(self, low: int, high: int, threshold: float, window: int = 50, enabled: bool = True,
                 start: int | None = None):
        self.low, self.high, self.threshold, self.window, self.enabled = low, high, threshold, window, enabled
        self.h = min(high, start or max(low, 2)) if enabled else high
        self.recent = []

    def level(self, generator: torch.Generator) -> int:
        return int(torch.randint(1 if self.enabled else self.low, self.h + 1, (1,), generator=generator))

    def record(self, cost: float) -> bool:
        """Record a minibatch's cost; True when the level's bound h doubled."""
        if not self.enabled or self.h >= self.high:
            return False
        self.recent = (self.recent + [cost])[-self.window:]
        if len(self.recent) == self.window and sum(self.recent) / self.window < self.threshold:
            self.h, self.recent = min(self.high, 2 * self.h), []
            return True
        return False
