"""Which memory word to overwrite next: the least recently used one (thesis 3.2.3, eq. 3.4).

SAM's usage U^(2)(i) is the number of steps since word i was last accessed, a step accessing it when its write
and read weights, summed over heads, exceed delta (a^W(i) + a^R(i) > delta); the word to overwrite is the one
accessed longest ago. The thesis keeps the words in a ring ordered by their last
access (3.3.3): a doubly linked list whose head is the least recently used word; an access moves a word to the
back and finding the least recently used word reads the head, both O(1) whatever the memory size. Here the ring
of each stream is a row of one int64 tensor, `ring[b, 0]` the previous and `ring[b, 1]` the next node of every
word, node N being the sentinel between the back and the head, so the ring is part of a model's state and goes
into checkpoints. It is walked in Python (a few pointer moves per access), on the CPU whatever the device of the
memory.

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
    made once, share its storage, so the moves below change the tensor."""

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


def accessed_words(indices: torch.Tensor, weights: torch.Tensor, delta: float) -> list[list[int]]:
    """Per stream, the words among `indices` (B, E) whose weights (same shape) sum to more than delta, in the
    order of their first entry: U^(2)'s access (3.2.3), a^W(i) + a^R(i) > delta, with the entries of every head's
    write and read of the step given together."""
    weights = weights.detach()
    same = indices[:, :, None] == indices[:, None, :]
    totals = (same.to(weights.dtype) * weights[:, None, :]).sum(-1)
    earlier = torch.ones(indices.shape[1], indices.shape[1], dtype=torch.bool, device=indices.device).tril(-1)
    first = ~(same & earlier).any(-1)
    flat = torch.where(first & (totals > delta), indices, -1).tolist()
    return [[i for i in row if i >= 0] for row in flat]


def discounted_usage(usage: torch.Tensor, discount: float, *weights: torch.Tensor) -> torch.Tensor:
    """DAM's U^(1)_t = discount * U^(1)_{t-1} + the read and write weights of step t, summed over heads: each of
    `weights` is (B, heads, N). No gradient flows through the usage (it only chooses the word to erase)."""
    total = sum(w.detach().sum(1) for w in weights)
    return discount * usage + total
