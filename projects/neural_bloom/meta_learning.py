"""Algorithm 3 (meta-learning a one-shot set-membership model) and the space accounting of thesis 5.5-5.6.1.

Training: each step samples sets and queries from the task, writes every set (in parallel), scores the queries
and takes an Adam step on the binary cross-entropy.

Space: for a target false-positive rate alpha, the model works at eps = alpha / 2: its threshold is the score
that 1 - eps of the test sets' negative queries (50,000 by default, as the thesis) stay at or below; fresh sets
check that rate again. The model misses n_fn of each test set's elements on average; they go into a backup
Bloom filter at delta = alpha / 2, so

    TOTAL_SPACE = 32 x (floats of the state) + n_fn x SPACE(Bloom, alpha / 2) / element

and the combined false-positive rate is eps_measured + (1 - eps_measured) delta.
"""
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from languini.atomic_write import write_atomically
from projects.neural_bloom.classical import bloom_bits
from projects.neural_bloom.model import BITS_PER_FLOAT


@dataclass(frozen=True)
class Curriculum:
    """Set sizes growing geometrically from `start` to the task's own over the first `steps` training steps:
    small contiguous ranges first (their two ends are close), then the full size."""
    start: int
    steps: int

    def __post_init__(self):
        if self.start < 1 or self.steps < 1:
            raise ValueError(f"a curriculum starts at a set size >= 1 and lasts >= 1 step, not {self}")

    def largest(self, step: int, full: int) -> int:
        """The largest set size of training step `step` (0-based) when the task's own is `full`."""
        if step >= self.steps or self.start >= full:
            return full
        return round(self.start * (full / self.start) ** (step / self.steps))


def run_identity(identity: dict, lr: float, batch_sets: int, queries: int, seed: int,
                 curriculum: Curriculum | None) -> dict:
    """What a checkpoint of `train` must agree on to be continued or evaluated: the caller's (model, task) and the
    training flags (the budget is not: a finished run continues when given more)."""
    return {**identity, "lr": lr, "batch_sets": batch_sets, "queries": queries, "seed": seed,
            "curriculum": curriculum and asdict(curriculum)}


def train(model, task, seconds: float, lr: float = 1e-3, batch_sets: int = 4, queries: int = 256, seed: int = 0,
          desc: str = "train", max_steps: int | None = None, curriculum: Curriculum | None = None,
          checkpoint: Path | None = None, save_every: float = 60.0, identity: dict | None = None) -> dict:
    """Algorithm 3 for `seconds` of training time (or `max_steps`). Returns steps, the mean loss of the last 20 and
    the training seconds.

    With `checkpoint`, the model, optimizer, sampler and losses are saved there atomically every `save_every`
    seconds and at the end, and a run finds its checkpoint and continues from it: stopped and started again it
    reaches the state of one run (the budget counts the training time of every part). `identity` (what defines
    the run: model, task, flags) is stored with it and a checkpoint of another run is refused."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    identity = run_identity(identity or {}, lr, batch_sets, queries, seed, curriculum)
    losses, before = [], 0.0
    if checkpoint is not None and checkpoint.exists():
        saved = load_checkpoint(checkpoint, identity)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        gen.set_state(saved["generator"])
        losses, before = saved["losses"], saved["seconds"]
        print(f"{desc}: resumed from {checkpoint} at step {len(losses)} ({before:.0f} s trained)", flush=True)

    start = saved_at = time.perf_counter()

    def elapsed():
        return before + time.perf_counter() - start

    def save(seconds: float):
        state = {"identity": identity, "model": model.state_dict(), "optimizer": opt.state_dict(),
                 "generator": gen.get_state(), "losses": losses, "seconds": seconds}
        write_atomically(checkpoint, lambda f: torch.save(state, f))

    model.train()
    full = max(task.set_sizes)
    bar = tqdm(desc=desc, unit="step", leave=False, mininterval=2, initial=len(losses), total=max_steps)
    while elapsed() < seconds and (max_steps is None or len(losses) < max_steps):
        largest = curriculum.largest(len(losses), full) if curriculum else None
        sets, qs, ys = task.train_batch(gen, batch_sets, queries, largest=largest)
        logits = model.read(model.write(task.train.inputs[sets]), task.train.inputs[qs])
        loss = F.binary_cross_entropy_with_logits(logits, ys.to(logits.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{recent_loss(losses):.4f}", refresh=False)
        if checkpoint is not None and time.perf_counter() - saved_at >= save_every:
            save(elapsed())
            saved_at = time.perf_counter()
            # a line per save: a log redirected to a file shows the progress the bar cannot
            print(f"{desc}: step {len(losses)}, loss {recent_loss(losses):.4f}, {elapsed():.0f} s, saved", flush=True)
    bar.close()
    seconds = elapsed()
    if checkpoint is not None:
        save(seconds)
    model.eval()
    return trained_stats({"losses": losses, "seconds": seconds})


def load_checkpoint(path: Path, identity: dict) -> dict:
    """The checkpoint `train` saved at `path`, refused if it is of another run than `identity` (as `train`
    completes it: the model's, task's and training flags)."""
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint {path}: its training has not saved one yet")
    saved = torch.load(path, weights_only=False)
    if saved["identity"] != identity:
        changed = sorted(k for k in identity.keys() | saved["identity"].keys()
                         if identity.get(k) != saved["identity"].get(k))
        raise ValueError(f"{path} is the checkpoint of another run ({', '.join(changed)} differ: saved "
                         f"{ {k: saved['identity'].get(k) for k in changed} }, this run "
                         f"{ {k: identity.get(k) for k in changed} }); use another folder or delete it")
    return saved


def trained_stats(saved: dict) -> dict:
    """What `train` returns, of a saved checkpoint."""
    losses = saved["losses"]
    return {"steps": len(losses), "loss": recent_loss(losses), "seconds": saved["seconds"]}


def recent_loss(losses: list) -> float:
    """The mean of the last 20 losses (0 before the first)."""
    return sum(losses[-20:]) / max(1, len(losses[-20:]))


@torch.no_grad()
def score(model, universe, members, queries, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of the set's own elements, logits of `queries`) after writing the set once."""
    state = model.write(universe.inputs[members][None])

    def read(idx):
        return torch.cat([model.read(state, universe.inputs[idx[i:i + chunk]][None])[0]
                          for i in range(0, len(idx), chunk)]).cpu()

    return read(members), read(queries)


@dataclass(frozen=True)
class Operating:
    """One model at one target rate alpha (5.5)."""
    alpha: float
    threshold: float  # a query is "in the set" when its logit is above this
    state_bits: int
    false_negatives: float  # mean per test set: the backup filter's elements
    model_fpr: float  # measured over the test sets' negatives
    negatives: int
    check_fpr: float = math.nan  # the same threshold on fresh sets: how far the operating point carries

    @property
    def backup_bits(self) -> float:
        return self.false_negatives * bloom_bits(1, self.alpha / 2)

    @property
    def total_bits(self) -> float:
        return self.state_bits + self.backup_bits

    @property
    def combined_fpr(self) -> float:
        return self.model_fpr + (1 - self.model_fpr) * self.alpha / 2


def threshold_at(negative_scores: torch.Tensor, eps: float) -> float:
    """The smallest score that at most a fraction eps of `negative_scores` exceed."""
    ordered = negative_scores.sort(descending=True).values
    return float(ordered[min(len(ordered) - 1, math.floor(eps * len(ordered)))])


def operating_point(alpha, threshold, state_bits, member_scores, negative_scores) -> Operating:
    """Accounting over test sets: member_scores a list of per-set tensors, negative_scores one tensor."""
    misses = [float((s <= threshold).sum()) for s in member_scores]
    return Operating(alpha, threshold, state_bits, sum(misses) / len(misses),
                     float((negative_scores > threshold).float().mean()), len(negative_scores))


def draw_sets(task, n: int, sets: int, negatives: int, gen: torch.Generator) -> list:
    """`sets` (set, negatives) pairs of the evaluation universe, `negatives` negative queries in all."""
    return [task.eval_set(gen, n, math.ceil(negatives / sets)) for _ in range(sets)]


def evaluate(model, task, n: int, rates, test_sets: int = 10, negatives: int = 50_000, check_sets: int = 4,
             seed: int = 1) -> tuple[dict, list]:
    """({alpha: Operating}, the test draws for the classical filters to use the same sets and queries).

    As in thesis 5.6.1 the threshold of each rate is set on the test sets' own negatives (one number fitted to
    `negatives` queries); `check_sets` fresh sets (as many negatives each) measure it again: check_fpr."""
    gen = torch.Generator().manual_seed(seed)
    draws = draw_sets(task, n, test_sets, negatives, gen)
    scored = [score(model, task.eval, m, q) for m, q in tqdm(draws, desc="evaluate", leave=False)]
    members = [s for s, _ in scored]
    neg = torch.cat([q for _, q in scored])
    check = torch.cat([score(model, task.eval, m, q)[1]
                       for m, q in draw_sets(task, n, check_sets, negatives * check_sets // test_sets, gen)]) \
        if check_sets else None
    bits = model.state_floats(n) * BITS_PER_FLOAT
    points = {}
    for alpha in rates:
        point = operating_point(alpha, threshold_at(neg, alpha / 2), bits, members, neg)
        if check is not None:
            point = replace(point, check_fpr=float((check > point.threshold).float().mean()))
        points[alpha] = point
    return points, draws
