"""The slides' toy tasks ("Score - accuracy on toy tasks": copy, reverse, counting, random walk, algorithmic) as
batches of one stream each: tokens (batch, length), targets (batch, length) and a mask of the positions scored.

Every task is read token by token and the model labels positions: at a scored position t it predicts targets[t]
from tokens[:t + 1]. Where an answer lies farther back than the attention window, only a memory that carries it
forward (the Feedback Transformer's) can give it.

- copy / reverse: `n` random symbols, a separator, then `n` query tokens; at the i-th query the i-th symbol (copy)
  or the (n + 1 - i)-th (reverse). Scored: the queries; a sequence counts as right when all its n are.
- counting: `k` As (k uniform in 1..n), a separator, then n + 1 queries; at the j-th query B while j <= k, END at
  j = k + 1, after that PAD (not scored). Scored: the queries up to END.
- random walk: a start cell of a G x G grid, then moves (N, S, E, W; a move into a wall stays); at every token the
  walker's cell. With walls the cell depends on the order of every move so far.
- algorithmic (after Fan et al. 2020's task, written anew from its description): statements over 3 or 5 variables
  with values 1..10: `x = 4 ;`, `x ++ ;`, `x -- ;`, `if x < y : x ++ ;` (also `>` and constants), `print x ;`;
  at the `;` of a print, the printed value. Scored: the prints.
"""
import random

import torch

PAD = 0


class Vocabulary:
    """Words to ids (0: PAD)."""

    def __init__(self, words):
        self.words = ["<pad>", *words]
        self.ids = {w: i for i, w in enumerate(self.words)}

    def __len__(self):
        return len(self.words)

    def __getitem__(self, word):
        return self.ids[word]


def _symbol_task(batch: int, n: int, symbols: int, reverse: bool, g: torch.Generator):
    vocab = Vocabulary([f"s{i}" for i in range(symbols)] + ["SEP", "?"])
    first = vocab["s0"]
    seq = torch.randint(symbols, (batch, n), generator=g) + first
    tokens = torch.cat([seq, torch.full((batch, 1), vocab["SEP"]), torch.full((batch, n), vocab["?"])], dim=1)
    targets = torch.zeros_like(tokens)
    targets[:, n + 1:] = seq.flip(1) if reverse else seq
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, n + 1:] = True
    return tokens, targets, mask, vocab


def copy(batch: int, n: int = 16, symbols: int = 8, g: torch.Generator | None = None):
    return _symbol_task(batch, n, symbols, False, g)


def reverse(batch: int, n: int = 16, symbols: int = 8, g: torch.Generator | None = None):
    return _symbol_task(batch, n, symbols, True, g)


def counting(batch: int, n: int = 50, g: torch.Generator | None = None):
    vocab = Vocabulary(["A", "B", "SEP", "?", "END"])
    k = torch.randint(1, n + 1, (batch, 1), generator=g)
    position = torch.arange(n)[None, :]
    head = torch.where(position < k, vocab["A"], PAD)  # the As, then PAD up to n
    tokens = torch.cat([head, torch.full((batch, 1), vocab["SEP"]), torch.full((batch, n + 1), vocab["?"])], dim=1)
    j = torch.arange(1, n + 2)[None, :]  # the query's number
    answer = torch.where(j <= k, vocab["B"], torch.where(j == k + 1, vocab["END"], PAD))
    targets = torch.cat([torch.zeros(batch, n + 1, dtype=torch.long), answer], dim=1)
    mask = targets != PAD
    return tokens, targets, mask, vocab


MOVES = ((-1, 0), (1, 0), (0, 1), (0, -1))  # north, south, east, west as (row, column) steps


def random_walk(batch: int, length: int = 32, grid: int = 4, g: torch.Generator | None = None):
    vocab = Vocabulary(["N", "S", "E", "W"] + [f"c{i}" for i in range(grid * grid)])
    moves = torch.tensor(MOVES)
    start = torch.randint(grid * grid, (batch,), generator=g)
    steps = torch.randint(len(MOVES), (batch, length - 1), generator=g)
    row, col = start // grid, start % grid
    cells = [start]
    for t in range(length - 1):
        row = (row + moves[steps[:, t], 0]).clamp(0, grid - 1)
        col = (col + moves[steps[:, t], 1]).clamp(0, grid - 1)
        cells.append(row * grid + col)
    cell0 = vocab["c0"]
    tokens = torch.cat([cell0 + start[:, None], vocab["N"] + steps], dim=1)
    targets = cell0 + torch.stack(cells, dim=1)
    return tokens, targets, torch.ones_like(tokens, dtype=torch.bool), vocab


VARIABLES = ("x", "y", "z", "p", "r")
LOW, HIGH = 1, 10


def algorithm_vocabulary(variables: int) -> Vocabulary:
    return Vocabulary([*VARIABLES[:variables], *map(str, range(LOW, HIGH + 1)),
                       "=", "++", "--", "if", "<", ">", ":", ";", "print"])


def _statement(rng: random.Random, values: dict, variables: int, nested: bool) -> tuple[list[str], int | None]:
    """One statement's words and the value it prints (None: prints nothing); updates `values` as it runs."""
    while True:
        op = rng.choice(("=", "++", "--", "if", "print"))
        unset = [v for v in VARIABLES[:variables] if v not in values]
        known = list(values)
        if op == "=" and unset:
            var = rng.choice(unset)
            values[var] = rng.randint(LOW, HIGH)
            return [var, "=", str(values[var]), ";"], None
        if op == "++" and known:
            var = rng.choice(known)
            if values[var] < HIGH:
                values[var] += 1
                return [var, "++", ";"], None
        if op == "--" and known:
            var = rng.choice(known)
            if values[var] > LOW:
                values[var] -= 1
                return [var, "--", ";"], None
        if op == "print" and known and not nested:
            var = rng.choice(known)
            return ["print", var, ";"], values[var]
        if op == "if" and known and not nested:
            var = rng.choice(known)
            others = [v for v in known if v != var]
            if others and rng.random() < 0.5:
                other = rng.choice(others)
                bound, shown = values[other], other
            else:
                bound = rng.randint(LOW, HIGH)
                shown = str(bound)
            less = rng.random() < 0.5
            holds = values[var] < bound if less else values[var] > bound
            # the body runs on the real values only when the condition holds
            body, _ = _statement(rng, values if holds else dict(values), variables, True)
            return ["if", var, "<" if less else ">", shown, ":", *body], None


def algorithmic(batch: int, statements: int = 30, variables: int = 3, g: torch.Generator | None = None):
    """Programs of `statements` statements, cut or PAD-ed to the longest in the batch."""
    vocab = algorithm_vocabulary(variables)
    seed = int(torch.randint(2**62, (1,), generator=g))
    rng = random.Random(seed)
    programs = []
    for _ in range(batch):
        values, words, labels = {}, [], []
        for _ in range(statements):
            statement, printed = _statement(rng, values, variables, False)
            words += statement
            labels += [None] * (len(statement) - 1) + [printed]
        programs.append((words, labels))
    length = max(len(w) for w, _ in programs)
    tokens = torch.zeros(batch, length, dtype=torch.long)
    targets = torch.zeros(batch, length, dtype=torch.long)
    for b, (words, labels) in enumerate(programs):
        tokens[b, :len(words)] = torch.tensor([vocab[w] for w in words])
        targets[b, :len(words)] = torch.tensor([PAD if v is None else vocab[str(v)] for v in labels])
    return tokens, targets, targets != PAD, vocab
