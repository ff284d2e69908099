"""The set-membership tasks of thesis 5.6-5.7, sampled as indices into a universe of elements.

A `Universe` holds the model inputs of its elements (padded bytes or vectors) and each element's key for the
classical filters. A task samples, from its training universe, batches of (set, queries, targets) for
Algorithm 3, and from its evaluation universe single sets with negative queries (elements not in the set) for
the space accounting of 5.5.

- `DatabaseTask` (5.6.4, 5.7): the universe is the sorted unique words of a book folder, shuffled and split into
  a training and a held-out universe, each sorted (Appendix C.3); a set is a contiguous range of n words (an
  SSTable), queries are uniform over the universe.
- `ClassTask`, `HeavyHitterTask`, `UniformTask` (5.6.2): a deterministic synthetic class structure (see
  `synthetic_classes`) instead of MNIST: sets from one class (negatives from other classes), sets drawn with
  p(i-th element) ~ 0.999^i (queries uniform, evaluated on the training universe as the thesis does), or sets
  drawn uniformly (no structure).
"""
import gzip
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch

WORD = re.compile(r"\w+")


@dataclass
class Universe:
    inputs: torch.Tensor  # (N, max_len) uint8 bytes or (N, dim) float vectors
    keys: list  # N bytes objects: what the classical filters hash
    classes: torch.Tensor | None = None  # (N,) class of each element (class-structured universes)

    def __len__(self):
        return len(self.keys)


def read_words(folder) -> list[str]:
    """The sorted unique words (runs of Unicode word characters, case kept) of every *.txt.gz file in `folder`."""
    files = sorted(Path(folder).glob("*.txt.gz"))
    if not files:
        raise FileNotFoundError(f"no *.txt.gz books in {folder} (the database task reads a pgbooks split folder)")
    words = set()
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            words.update(WORD.findall(f.read()))
    return sorted(words)


def split_words(words: list[str], held_out: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """Shuffle (seeded) and cut into (training, held-out) universes, each sorted again (Appendix C.3)."""
    if not 0 < held_out < 1:
        raise ValueError(f"the held-out fraction must be in (0, 1), not {held_out}")
    shuffled = sorted(words)
    random.Random(seed).shuffle(shuffled)
    cut = round(len(shuffled) * (1 - held_out))
    return sorted(shuffled[:cut]), sorted(shuffled[cut:])


def encode_bytes(words: list[str], max_len: int) -> torch.Tensor:
    """(len(words), max_len) uint8: each word's UTF-8 bytes, cut to max_len, padded with 0."""
    out = torch.zeros(len(words), max_len, dtype=torch.uint8)
    for i, word in enumerate(words):
        data = word.encode()[:max_len]
        out[i, :len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def word_universe(words: list[str], max_len: int) -> Universe:
    if sorted(words) != list(words) or len(set(words)) != len(words):
        raise ValueError("a word universe must be sorted and unique (sets are contiguous ranges of it)")
    return Universe(encode_bytes(words, max_len), [w.encode() for w in words])


def randint(gen: torch.Generator, high: int, size=()) -> torch.Tensor:
    return torch.randint(high, size, generator=gen)


class Task:
    """Shared sampling. Subclasses define `members(gen, n, universe)` -> (n,) indices of one set, `is_member(set,
    idx)` and `negatives(gen, set_idx, count, universe)`; `train_queries` draws half the queries from the set and
    half from the query distribution (so both targets are common in training)."""

    train: Universe
    eval: Universe

    def __init__(self, set_size: int | tuple[int, int]):
        low, high = (set_size, set_size) if isinstance(set_size, int) else set_size
        if not 1 <= low <= high:
            raise ValueError(f"set sizes must satisfy 1 <= low <= high, not {set_size}")
        self.set_sizes = (low, high)

    def train_size(self, gen: torch.Generator) -> int:
        low, high = self.set_sizes
        return low + int(randint(gen, high - low + 1))

    def train_batch(self, gen: torch.Generator, batch: int, queries: int, largest: int | None = None):
        """(sets (B, n), queries (B, t), targets (B, t) float) over the training universe; one n for the batch,
        at most `largest` (a curriculum's)."""
        n = self.train_size(gen) if largest is None else min(self.train_size(gen), largest)
        sets, qs, ys = [], [], []
        for _ in range(batch):
            members = self.members(gen, n, self.train)
            half = queries // 2
            from_set = members[randint(gen, n, (half,))]
            others = self.query_distribution(gen, members, queries - half, self.train)
            q = torch.cat([from_set, others])
            sets.append(members)
            qs.append(q)
            ys.append(self.is_member(members, q).float())
        return torch.stack(sets), torch.stack(qs), torch.stack(ys)

    def eval_set(self, gen: torch.Generator, n: int, negatives: int):
        """(set (n,), negatives (negatives,)) over the evaluation universe: the negatives are never in the set."""
        members = self.members(gen, n, self.eval)
        return members, self.negatives(gen, members, negatives, self.eval)

    def query_distribution(self, gen, members, count, universe):
        """Queries of the task's distribution (members possible), by default uniform over the universe."""
        return randint(gen, len(universe), (count,))

    def is_member(self, members, idx):
        return torch.isin(idx, members)


class DatabaseTask(Task):
    """Contiguous ranges of a sorted universe; queries uniform over it (thesis 5.6.4, Appendix C.3)."""

    def __init__(self, train: Universe, eval: Universe, set_size):
        super().__init__(set_size)
        if max(self.set_sizes) > min(len(train), len(eval)):
            raise ValueError(f"sets of {max(self.set_sizes)} do not fit universes of {len(train)} and {len(eval)}")
        self.train, self.eval = train, eval

    def members(self, gen, n, universe):
        if n > len(universe):
            raise ValueError(f"a set of {n} does not fit a universe of {len(universe)}")
        start = int(randint(gen, len(universe) - n + 1))
        return torch.arange(start, start + n)

    def is_member(self, members, idx):
        return (idx >= members[0]) & (idx <= members[-1])

    def negatives(self, gen, members, count, universe):
        """Uniform over the universe outside the range: a draw u of the N - n others maps past the range."""
        u = randint(gen, len(universe) - len(members), (count,))
        return torch.where(u < members[0], u, u + len(members))


def synthetic_classes(classes: int, train_per_class: int, eval_per_class: int, dim: int = 64, noise: float = 1.0,
                      seed: int = 0) -> tuple[Universe, Universe]:
    """(training, held-out) universes with a class structure visible in the content, like MNIST digits: an
    element of class c is prototype_c + noise * N(0, I) in R^dim, prototypes N(0, I), both universes from the
    same prototypes. Deterministic in `seed`; keys are the float32 bytes of each vector; elements are ordered
    class by class."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(classes, dim, generator=gen)

    def universe(per_class):
        labels = torch.arange(classes).repeat_interleave(per_class)
        vectors = prototypes[labels] + noise * torch.randn(len(labels), dim, generator=gen)
        return Universe(vectors, [v.numpy().tobytes() for v in vectors], labels)

    return universe(train_per_class), universe(eval_per_class)


class ClassTask(Task):
    """Class-based familiarity: a set is n elements of one random class; queries are from the set or from other
    classes (Appendix C.3)."""

    def __init__(self, train: Universe, eval: Universe, set_size):
        super().__init__(set_size)
        self.train, self.eval = train, eval

    def members(self, gen, n, universe):
        label = int(randint(gen, int(universe.classes.max()) + 1))
        pool = torch.nonzero(universe.classes == label).squeeze(1)
        if n > len(pool):
            raise ValueError(f"a class holds {len(pool)} elements, fewer than a set of {n}")
        return pool[torch.randperm(len(pool), generator=gen)[:n]]

    def query_distribution(self, gen, members, count, universe):
        return self.negatives(gen, members, count, universe)

    def negatives(self, gen, members, count, universe):
        others = torch.nonzero(universe.classes != universe.classes[members[0]]).squeeze(1)
        return others[randint(gen, len(others), (count,))]


class UniformTask(Task):
    """Uniform instance-based familiarity: sets drawn uniformly without replacement, no structure at all."""

    def __init__(self, train: Universe, eval: Universe, set_size):
        super().__init__(set_size)
        self.train, self.eval = train, eval

    def weights(self, universe):
        return torch.ones(len(universe))

    def members(self, gen, n, universe):
        return torch.multinomial(self.weights(universe), n, replacement=False, generator=gen)

    def negatives(self, gen, members, count, universe):
        outside = torch.ones(len(universe), dtype=torch.bool)
        outside[members] = False
        pool = torch.nonzero(outside).squeeze(1)
        return pool[randint(gen, len(pool), (count,))]


class HeavyHitterTask(UniformTask):
    """Non-uniform instance-based familiarity: element of rank i (a fixed shuffle of the universe) is stored with
    p ~ decay^i; queries uniform. Trained and evaluated on the same universe (Appendix C.3: the network must
    learn each element's storage frequency, not generalise to unseen elements)."""

    def __init__(self, universe: Universe, set_size, decay: float = 0.999, seed: int = 0):
        super().__init__(universe, universe, set_size)
        rank = torch.empty(len(universe), dtype=torch.long)
        rank[torch.randperm(len(universe), generator=torch.Generator().manual_seed(seed))] = torch.arange(len(universe))
        self._weights = decay ** rank.double()

    def weights(self, universe):
        return self._weights
