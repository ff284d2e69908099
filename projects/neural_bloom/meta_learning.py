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
from dataclasses import dataclass, replace

import torch
from torch.nn import functional as F
from tqdm import tqdm

from projects.neural_bloom.classical import bloom_bits
from projects.neural_bloom.model import BITS_PER_FLOAT


def train(model, task, seconds: float, lr: float = 1e-3, batch_sets: int = 4, queries: int = 256, seed: int = 0,
          desc: str = "train", max_steps: int | None = None) -> dict:
    """Algorithm 3 for `seconds` of wall time (or `max_steps`). Returns steps and the mean loss of the last 20."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses, start = [], time.perf_counter()
    bar = tqdm(desc=desc, unit="step", leave=False, mininterval=2)
    while time.perf_counter() - start < seconds and (max_steps is None or len(losses) < max_steps):
        sets, qs, ys = task.train_batch(gen, batch_sets, queries)
        logits = model.read(model.write(task.train.inputs[sets]), task.train.inputs[qs])
        loss = F.binary_cross_entropy_with_logits(logits, ys.to(logits.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.4f}", refresh=False)
    bar.close()
    model.eval()
    return {"steps": len(losses), "loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
            "seconds": time.perf_counter() - start}


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
