"""Which memory word to overwrite next: the least recently used one (thesis 3.2.3, eq. 3.4).

SAM's usage U^(2)(i) is the number of steps since word i was last accessed, a step accessing it when its write
and read weights, summed over heads, exceed delta (a^W(i) + a^R(i) > delta); the word to overwrite is the one
accessed longest ago. Two forms of the same order, chosen by the read's index:

- With exact search (the GPU path) every word's last access is a stamp in a (B, N) int64 tensor on the memory's
  device (`new_last_access`, `touch`, `least_recent`): an access stamps the words a step accessed with
  clock * E + their rank in the step's E entries (E fixed per model), so stamps order the words exactly as the
  ring below does, and finding the least recently used words is a top-k over N stamps: O(N) per step like the
  exact scan itself, with no host round trip, so a training step never waits for the CPU.
- With the FAISS index (CPU-only by nature) the words sit in the thesis's ring ordered by their last access
  (3.3.3): a doubly linked list whose head is the least recently used word; an access moves a word to the back
  and finding the least recently used word reads the head, both O(1) whatever the memory size, so that the
  index's step cost stays flat in N. The ring of each stream is a row of one int64 tensor, `ring[b, 0]` the
  previous and `ring[b, 1]` the next node of every word, node N being the sentinel between the back and the
  head, walked in Python (a few pointer moves per access) on the CPU.

Both are part of a model's state and go into checkpoints; `ring_from_last_access` and `last_access_from_ring`
convert one into the other (a state carried to a model with the other index).

DAM's usage U^(1) is the discounted sum of all read and write weights, a dense (B, N) tensor (`discounted_usage`).
"""
import torch


def new_ring(batch: int, words: int) -> torch.Tensor:
    """(batch, 2, words + 1) int64: every stream's words in the order 0, 1, ..., words - 1 (word 0 used least
    recently), node `words` the sentinel."""
    if words < 1:
        raise ValueError(f"a memory needs at least one word, not {words}")
    order = torch.arange(words + 1)
    prev, nxt = (order - 1) % (words + 1), (order + 1) % (words + 1)
    return torch.stack([prev, nxt]).expand(batch, 2, words + 1).clone()


class Ring:
    """Pointer access to a ring tensor (batch, 2, words + 1) on the CPU, for one forward: memoryviews of its rows,
    made once, share its storage, so the moves below change the tensor. The FAISS index's path (module
    docstring)."""

    def __init__(self, ring: torch.Tensor):
        if ring.device.type != "cpu" or ring.dtype != torch.int64:
            raise ValueError("the usage ring is an int64 tensor on the CPU")
        rows = ring.numpy()
        self.prev = [memoryview(rows[b, 0]) for b in range(rows.shape[0])]
        self.next = [memoryview(rows[b, 1]) for b in range(rows.shape[0])]
        self.sentinel = ring.shape[-1] - 1

    def least_recent(self, count: int) -> list[list[int]]:
        """The `count` least recently used words of every stream, least recent first (without moving them)."""
        if count > self.sentinel:
            raise ValueError(f"asked for {count} words of a memory of {self.sentinel}")
        chosen = []
        for nxt in self.next:
            words, node = [], self.sentinel
            for _ in range(count):
                node = nxt[node]
                words.append(node)
            chosen.append(words)
        return chosen

    def touch(self, accessed: list[list[int]]) -> None:
        """Move the words each stream accessed to the back of its ring (most recently used), in the order given;
        repeated words count once."""
        sentinel = self.sentinel
        for prev, nxt, words in zip(self.prev, self.next, accessed):
            for word in dict.fromkeys(words):
                if nxt[word] == sentinel:  # already the most recent
                    continue
                before, after = prev[word], nxt[word]
                nxt[before], prev[after] = after, before
                last = prev[sentinel]
                nxt[last], prev[word], nxt[word], prev[sentinel] = word, last, sentinel, word

    def order(self, b: int) -> list[int]:
        """Stream b's words from the least to the most recently used (for tests and inspection)."""
        words, node = [], self.next[b][self.sentinel]
        while node != self.sentinel:
            words.append(node)
            node = self.next[b][node]
        return words


def accessed(indices: torch.Tensor, weights: torch.Tensor, delta: float) -> torch.Tensor:
    """(B, E) bool: the first entry of every word among `indices` (B, E) whose weights (same shape) sum to more
    than delta: U^(2)'s access (3.2.3), a^W(i) + a^R(i) > delta, with the entries of every head's write and read
    of the step given together. On the indices' device, without a host round trip."""
    weights = weights.detach()
    same = indices[:, :, None] == indices[:, None, :]
    totals = (same.to(weights.dtype) * weights[:, None, :]).sum(-1)
    earlier = torch.ones(indices.shape[1], indices.shape[1], dtype=torch.bool, device=indices.device).tril(-1)
    first = ~(same & earlier).any(-1)
    return first & (totals > delta)


def accessed_words(indices: torch.Tensor, weights: torch.Tensor, delta: float) -> list[list[int]]:
    """`accessed` as the ring takes it: per stream, the accessed words in the order of their first entry."""
    flat = torch.where(accessed(indices, weights, delta), indices, -1).tolist()
    return [[i for i in row if i >= 0] for row in flat]


def new_last_access(batch: int, words: int, device=None) -> torch.Tensor:
    """(batch, words) int64 stamps of memories never accessed, ordered as new_ring's words (word 0 used least
    recently); all negative, below every access's stamp."""
    if words < 1:
        raise ValueError(f"a memory needs at least one word, not {words}")
    return (torch.arange(words, device=device) - words).expand(batch, words).clone()


def least_recent(last_access: torch.Tensor, count: int) -> torch.Tensor:
    """(B, count) int64: the `count` least recently used words of every stream, least recent first (stamps are
    distinct within a stream, so there are no ties to break)."""
    if count > last_access.shape[1]:
        raise ValueError(f"asked for {count} words of a memory of {last_access.shape[1]}")
    return last_access.topk(count, dim=1, largest=False).indices


def touch(last_access: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, delta: float,
          clock: torch.Tensor) -> None:
    """Stamp, in place, the words `accessed` among the step's entries (indices, weights: (B, E)) as the most
    recently used, in the order of their first entry, as Ring.touch moves them: word stamps
    clock * E + rank, above every earlier step's (clock (B,) counts the stream's steps)."""
    hit = accessed(indices, weights, delta)
    entries = indices.shape[1]
    stamps = clock[:, None] * entries + hit.cumsum(1) - 1
    unchanged = torch.iinfo(torch.int64).min  # amax with the old stamp keeps it
    last_access.scatter_reduce_(1, indices, torch.where(hit, stamps, unchanged), reduce="amax")


def ring_from_last_access(last_access: torch.Tensor) -> torch.Tensor:
    """The ring (B, 2, N + 1) that orders every stream's words as its stamps do."""
    order = last_access.argsort(dim=1).cpu()  # least recent first
    B, N = order.shape
    sentinel = torch.full((B, 1), N, dtype=torch.int64)
    chain = torch.cat([sentinel, order, sentinel], 1)  # sentinel, head .. back, sentinel
    ring = torch.empty(B, 2, N + 1, dtype=torch.int64)
    ring[:, 0].scatter_(1, chain[:, 1:], chain[:, :-1])  # prev of each node
    ring[:, 1].scatter_(1, chain[:, :-1], chain[:, 1:])  # next of each node
    return ring


def last_access_from_ring(ring: torch.Tensor, device=None) -> torch.Tensor:
    """Stamps (B, N) that order every stream's words as the ring does (walked on the host, once)."""
    walk = Ring(ring.cpu())
    order = torch.tensor([walk.order(b) for b in range(ring.shape[0])], dtype=torch.int64)
    stamps = torch.empty_like(order).scatter_(1, order, new_last_access(*order.shape))
    return stamps.to(device)


def discounted_usage(usage: torch.Tensor, discount: float, *weights: torch.Tensor) -> torch.Tensor:
    """DAM's U^(1)_t = discount * U^(1)_{t-1} + the read and write weights of step t, summed over heads: each of
    `weights` is (B, heads, N). No gradient flows through the usage (it only chooses the word to erase)."""
    total = sum(w.detach().sum(1) for w in weights)
    return discount * usage + total
