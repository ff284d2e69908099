"""The classical filters: sizes against the thesis's Table 5.1, the real Bloom filter's false-positive rate against
the analytical (1 - e^{-kn/m})^k, the cuckoo filter's against its fingerprint arithmetic."""
import math

import numpy as np
import pytest

from projects.neural_bloom import classical


def random_keys(count, seed, length=12):
    rows = np.random.default_rng(seed).integers(0, 256, size=(count, length), dtype=np.uint8)
    return [row.tobytes() for row in rows]


@pytest.mark.parametrize("eps, thesis_kb", [(0.05, 31.2), (0.01, 47.9)])
def test_optimal_bloom_size_is_table_5_1(eps, thesis_kb):
    assert classical.bloom_bits(5000, eps) / 1000 == pytest.approx(thesis_kb, abs=0.05)


def test_optimal_bloom_size_at_a_tenth_of_a_percent():
    # 5000 x log2(1000) / ln 2 = 71,888 bits; the thesis prints 72.2kb (14.44 bits per key, rounded up)
    assert classical.bloom_bits(5000, 0.001) == pytest.approx(71_887.94, abs=0.01)
    assert classical.bloom_bits(5000, 0.001) / 1000 == pytest.approx(72.2, rel=0.005)


@pytest.mark.parametrize("eps, thesis_kb", [(0.05, 33.1), (0.01, 45.3), (0.001, 62.6)])
def test_cuckoo_formula_is_table_5_1(eps, thesis_kb):
    assert classical.cuckoo_bits(5000, eps) / 1000 == pytest.approx(thesis_kb, abs=0.05)


def test_bloom_filter_measured_rate_is_the_analytical_rate():
    n, eps, filters, queries = 2000, 0.02, 4, 25_000
    hits, fills, conditional = 0, [], []
    for seed in range(filters):
        bloom = classical.BloomFilter(n, eps)
        stored = random_keys(n, seed)
        bloom.add(stored)
        assert bloom.contains(stored).all()  # never a false negative
        hits += int(bloom.contains(random_keys(queries, 100 + seed, length=13)).sum())
        fills.append(bloom.fill())
        conditional.append(bloom.fill() ** bloom.hashes)
    # m = ceil(2000 x 5.643856 / 0.693147) = ceil(16,284.7) = 16,285, k = round(16,285 / 2000 x ln 2) = 6 (by hand)
    assert (bloom.bits, bloom.hashes) == (16_285, 6)
    analytic = classical.bloom_fpr(bloom.bits, n, bloom.hashes)
    assert analytic == pytest.approx(0.0201, abs=2e-4)
    measured = hits / (filters * queries)
    # binomial sd over 100k queries 0.00044, fill-to-fill sd of the rate about 0.0005: 4 sd of both
    assert measured == pytest.approx(analytic, abs=0.0027)
    assert np.mean(fills) == pytest.approx(1 - math.exp(-bloom.hashes * n / bloom.bits), abs=0.006)
    assert measured == pytest.approx(np.mean(conditional), abs=0.002)  # given each filter's bits: fill^k


def test_bloom_filter_refuses_bad_sizes():
    with pytest.raises(ValueError, match="false-positive rate"):
        classical.bloom_bits(10, 1.5)
    with pytest.raises(ValueError, match="at least one element"):
        classical.BloomFilter(0, 0.01)


def test_cuckoo_other_bucket_is_its_own_inverse():
    cuckoo = classical.CuckooFilter(37, 0.01)  # 10 buckets: not a power of two
    buckets = np.arange(cuckoo.buckets, dtype=np.uint64)
    for fp in (1, 2, 513, 1023):
        other = cuckoo.other(buckets, fp)
        assert ((other >= 0) & (other < cuckoo.buckets)).all()
        assert (cuckoo.other(other, fp) == buckets).all()


def test_cuckoo_filter_holds_every_key_and_errs_at_its_fingerprint_rate():
    n, eps, queries = 3000, 0.01, 100_000
    stored = random_keys(n, 0)
    cuckoo = classical.cuckoo_for(stored, eps)
    assert cuckoo.contains(stored).all()
    # f = ceil(log2(8 / 0.01)) = 10 bits; ceil(3000 / (4 x 0.95)) = 790 buckets, load 3000 / 3160
    assert (cuckoo.fingerprint_bits, cuckoo.buckets) == (10, 790)
    assert cuckoo.bits == 790 * 4 * 10
    assert cuckoo.load() == pytest.approx(3000 / 3160)
    # a negative meets about 8 x load fingerprints, each equal to its own with probability 1 / (2^10 - 1)
    expected = 1 - (1 - 1 / 1023) ** (8 * cuckoo.load())
    measured = cuckoo.contains(random_keys(queries, 1, length=13)).mean()
    assert measured == pytest.approx(expected, abs=4 * math.sqrt(expected / queries) + 4e-4)
    assert measured <= eps
