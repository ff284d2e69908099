"""The classical baselines: the Bloom filter (analytical size and false-positive rate, and a real implementation)
and the cuckoo filter (Fan et al., 2014: the thesis's size formula, and a real implementation).

Keys are bytes. Both real filters hash a key once with BLAKE2b and derive every index from that digest
(Kirsch-Mitzenmacher double hashing for the Bloom filter, partial-key cuckoo hashing for the cuckoo filter).
"""
import hashlib
import math

import numpy as np

LN2 = math.log(2)


def bloom_bits(n: float, eps: float) -> float:
    """SPACE(Bloom, eps): the optimal Bloom filter's size in bits for n elements, n log2(1/eps) / ln 2."""
    if not 0 < eps < 1:
        raise ValueError(f"a false-positive rate must be in (0, 1), not {eps}")
    return n * math.log2(1 / eps) / LN2


def bloom_fpr(bits: int, n: int, hashes: int) -> float:
    """The analytical false-positive rate (1 - e^{-k n / m})^k of m bits, n elements and k hashes."""
    return (1 - math.exp(-hashes * n / bits)) ** hashes


def cuckoo_bits(n: float, eps: float, load: float = 0.955) -> float:
    """The thesis's cuckoo filter size: (log2(1/eps) + 2) / load bits per element (buckets of 4 with
    semi-sorting, load factor 95.5%; Fan et al. 2014, Table 2); it reproduces Table 5.1's cuckoo row."""
    if not 0 < eps < 1:
        raise ValueError(f"a false-positive rate must be in (0, 1), not {eps}")
    return n * (math.log2(1 / eps) + 2) / load


def digests(keys, size: int) -> np.ndarray:
    """BLAKE2b digests of the keys as a (len(keys), size // 8) uint64 array."""
    joined = b"".join(hashlib.blake2b(key, digest_size=size).digest() for key in keys)
    return np.frombuffer(joined, dtype="<u8").reshape(len(keys), size // 8)


class BloomFilter:
    """m bits and k hashes sized for n elements at rate eps: m = ceil(n log2(1/eps) / ln 2), k = round(m/n ln 2)."""

    def __init__(self, n: int, eps: float):
        if n < 1:
            raise ValueError(f"a Bloom filter needs at least one element to size for, not {n}")
        self.bits = math.ceil(bloom_bits(n, eps))
        self.hashes = max(1, round(self.bits / n * LN2))
        self.array = np.zeros(self.bits, dtype=bool)

    def indices(self, keys) -> np.ndarray:
        """(len(keys), k) bit positions: h1 + i h2 mod m, i = 0..k-1."""
        h = digests(keys, 16) % np.uint64(self.bits)
        steps = np.arange(self.hashes, dtype=np.uint64)
        return (h[:, :1] + steps * h[:, 1:]) % np.uint64(self.bits)

    def add(self, keys) -> None:
        self.array[self.indices(keys).ravel()] = True

    def contains(self, keys) -> np.ndarray:
        return self.array[self.indices(keys)].all(axis=1)

    def fill(self) -> float:
        return float(self.array.mean())


class CuckooFilter:
    """Buckets of 4 fingerprints of f bits, f = ceil(log2(2 * 4 / eps)) so that the rate is at most eps at any
    load; ceil(n / (4 * load)) buckets (not a power of two: the other bucket is (hash(fp) - i) mod buckets, its own
    inverse). Stores at most `n` elements comfortably; raises if an insertion fails after `max_kicks` moves."""

    SLOTS = 4

    def __init__(self, n: int, eps: float, load: float = 0.95, max_kicks: int = 500, seed: int = 0):
        if n < 1:
            raise ValueError(f"a cuckoo filter needs at least one element to size for, not {n}")
        self.fingerprint_bits = math.ceil(math.log2(2 * self.SLOTS / eps))
        if self.fingerprint_bits > 32:
            raise ValueError(f"eps {eps} needs fingerprints of {self.fingerprint_bits} bits; at most 32 are kept")
        self.buckets = math.ceil(n / (self.SLOTS * load))
        self.table = np.zeros((self.buckets, self.SLOTS), dtype=np.uint32)  # 0: empty
        self.max_kicks = max_kicks
        self.rng = np.random.default_rng(seed)

    @property
    def bits(self) -> int:
        return self.buckets * self.SLOTS * self.fingerprint_bits

    def locate(self, keys):
        """(fingerprints, first buckets, second buckets), each (len(keys),)."""
        h = digests(keys, 16)
        fingerprints = h[:, 1] % np.uint64(2 ** self.fingerprint_bits - 1) + np.uint64(1)  # never 0
        first = h[:, 0] % np.uint64(self.buckets)
        return fingerprints, first, self.other(first, fingerprints)

    def other(self, bucket, fingerprint):
        """The fingerprint's other bucket, (hash(fp) - bucket) mod buckets: applied twice it gives `bucket` back."""
        spread = (np.asarray(fingerprint, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)
        return (spread % np.uint64(self.buckets) + np.uint64(self.buckets) - np.asarray(bucket, np.uint64)
                % np.uint64(self.buckets)) % np.uint64(self.buckets)

    def add(self, keys) -> None:
        for fp, first, second in zip(*self.locate(keys)):
            self._insert(int(fp), int(first), int(second))

    def _insert(self, fp: int, first: int, second: int) -> None:
        for bucket in (first, second):
            empty = np.flatnonzero(self.table[bucket] == 0)
            if len(empty):
                self.table[bucket, empty[0]] = fp
                return
        bucket = (first, second)[self.rng.integers(2)]
        for _ in range(self.max_kicks):  # evict a random fingerprint to its other bucket
            slot = self.rng.integers(self.SLOTS)
            fp, self.table[bucket, slot] = int(self.table[bucket, slot]), fp
            bucket = int(self.other(bucket, fp))
            empty = np.flatnonzero(self.table[bucket] == 0)
            if len(empty):
                self.table[bucket, empty[0]] = fp
                return
        raise RuntimeError(f"cuckoo filter full: an insertion failed after {self.max_kicks} moves")

    def contains(self, keys) -> np.ndarray:
        fp, first, second = self.locate(keys)
        fp = fp.astype(np.uint32)[:, None]
        return (self.table[first.astype(np.int64)] == fp).any(1) | (self.table[second.astype(np.int64)] == fp).any(1)

    def load(self) -> float:
        return float((self.table != 0).mean())


def cuckoo_for(keys, eps: float, seed: int = 0) -> CuckooFilter:
    """A cuckoo filter holding `keys`, made 5% larger each time an insertion fails (rare at load 0.95)."""
    load = 0.95
    for attempt in range(20):
        cuckoo = CuckooFilter(len(keys), eps, load=load, seed=seed + attempt)
        try:
            cuckoo.add(keys)
            return cuckoo
        except RuntimeError:
            load /= 1.05
    raise RuntimeError(f"could not build a cuckoo filter for {len(keys)} keys")
