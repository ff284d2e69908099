"""The E8 lattice lookup against the paper's numbers (Goucher & Troll, Table 1, 2.5-2.6) and brute force."""
import math

import pytest
import torch

from projects.lram_gpt import lattice as L
from projects.lram_gpt.ops.lookup import naive

PAPER_MIN_TOTAL_WEIGHT = (22158 - 625 * math.sqrt(5)) / 24389  # section 2.5, ~0.851


def index_by_hand(x, K):
    """The issue's memory index convention, written out with Python ints (Horner's rule)."""
    N = math.prod(K) // 256
    p = x[0] % 2
    y = [((xi - p) // 2) % (k // 2) for xi, k in zip(x, K)]
    digits = y[:7] + [y[7] // 2]
    radices = [k // 2 for k in K[:7]] + [K[7] // 4]
    number = 0
    for digit, radix in zip(digits, radices):
        number = number * radix + digit
    return p * N // 2 + number


def brute_force_neighbours(q):
    """Every lattice point within sqrt(8) of q [8] (float64), with its weight, by scanning a box of candidates."""
    found = []
    for parity in (0, 1):
        # per coordinate, the integers of this parity within sqrt(8) of q_i, then every combination
        base = 2 * torch.floor((q - parity) / 2) + parity
        choices = [base[i] + torch.tensor([-2.0, 0.0, 2.0, 4.0], dtype=torch.float64) for i in range(8)]
        choices = [c[(c - q[i]).abs() < math.sqrt(8)] for i, c in enumerate(choices)]
        grid = torch.cartesian_prod(*choices)
        grid = grid[grid.sum(-1).remainder(4) == 0]
        squared = ((grid - q) ** 2).sum(-1)
        keep = squared < 8
        found.append((grid[keep], squared[keep]))
    points = torch.cat([f[0] for f in found])
    weight = (1 - torch.cat([f[1] for f in found]) / 8) ** 4
    return points, weight


def uniform_queries(n, seed):
    """Queries uniform modulo Lambda: 4Z^8 is a sublattice of Lambda, so a uniform point of [0, 4)^8 will do."""
    return 4 * torch.rand(n, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_lattice_points(n, seed, spread=20):
    g = torch.Generator().manual_seed(seed)
    even = 2 * torch.randint(-spread, spread, (n, 8), generator=g)
    even[:, 0] += 2 * (even.sum(-1) % 4 != 0)  # an even point's sum is 0 or 2 mod 4; move 2 to fix it
    odd = even + 1
    odd[:, 0] += 2 * (odd.sum(-1) % 4 != 0)
    points = torch.where((torch.arange(n) % 2 == 0)[:, None], even, odd)
    assert L.is_lattice_point(points).all()
    return points


# --- torus and index -------------------------------------------------------------------------------

def test_memory_size_and_torus_choice():
    assert L.memory_size((4,) * 8) == 256
    assert L.memory_size((8,) * 8) == 2**16
    for log_n in range(8, 29):
        K = L.torus_for_memory_size(2**log_n)
        assert L.memory_size(K) == 2**log_n
        assert max(K) <= 2 * min(K)
    assert min(L.torus_for_memory_size(2**16)) == 8
    for bad in [(4,) * 7, (4,) * 7 + (6,), (0,) + (4,) * 7]:
        with pytest.raises(ValueError):
            L.memory_size(bad)
    for bad in [128, 3 * 2**16]:
        with pytest.raises(ValueError):
            L.torus_for_memory_size(bad)


@pytest.mark.parametrize("K", [(4, 4, 4, 4, 4, 4, 8, 12), (8, 4, 12, 4, 4, 4, 4, 4)])
def test_memory_index_is_a_bijection_of_the_torus(K):
    grid = torch.cartesian_prod(*[torch.arange(k) for k in K])
    points = grid[L.is_lattice_point(grid)]
    assert points.shape[0] == L.memory_size(K)
    index = L.memory_index(points, K)
    assert torch.equal(index.sort().values, torch.arange(L.memory_size(K)))
    # periodic in every K_i
    for i in range(8):
        assert torch.equal(L.memory_index(points + K[i] * torch.eye(8, dtype=torch.long)[i], K), index)


@pytest.mark.parametrize("K", [(8,) * 8, (12, 8, 16, 8, 8, 20, 8, 4)])
def test_memory_index_matches_the_written_convention(K):
    points = random_lattice_points(200, seed=1)
    expected = torch.tensor([index_by_hand(p, K) for p in points.tolist()])
    assert torch.equal(L.memory_index(points, K), expected)


# --- nearest point and fundamental region ----------------------------------------------------------

def test_nearest_point_against_brute_force():
    q = 30 * torch.rand(300, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64) - 15
    c = L.nearest_point(q)
    assert L.is_lattice_point(c).all()
    best = torch.stack([((brute_force_neighbours(x)[0] - x) ** 2).sum(-1).min() for x in q[:40]])
    assert torch.allclose(((q[:40] - c[:40]) ** 2).sum(-1), best)
    # within the covering radius 2 of Lambda
    assert (((q - c) ** 2).sum(-1) <= 4 + 1e-9).all()


def test_isometry_maps_into_fundamental_region_and_back():
    q = 40 * torch.rand(2000, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64) - 20
    z, center, position, sign = L.to_fundamental(q)
    A, b = L.fundamental_region_constraints()
    assert (z @ A.T <= b + 1e-9).all()
    assert ((sign < 0).sum(-1) % 2 == 0).all()
    assert torch.allclose(L.from_fundamental(z[:, None, :], center, position, sign)[:, 0], q)
    images = L.from_fundamental(L.FUNDAMENTAL_POINTS.double().expand(5, -1, -1), center[:5], position[:5], sign[:5])
    assert L.is_lattice_point(images.long()).all()


def test_exactly_232_lattice_points_near_the_fundamental_region():
    assert L.FUNDAMENTAL_POINTS.shape == (232, 8)
    assert L.is_lattice_point(L.FUNDAMENTAL_POINTS).all()
    assert len({tuple(p) for p in L.FUNDAMENTAL_POINTS.tolist()}) == 232


def test_fundamental_region_vertices_satisfy_eight_constraints():
    A, b = L.fundamental_region_constraints()
    vertices = L.fundamental_region_vertices()
    assert vertices.shape[1] == 8 and len({tuple(v) for v in vertices.tolist()}) == vertices.shape[0]
    slack = b - vertices @ A.T
    assert (slack >= -1e-9).all()  # inside F
    assert ((slack.abs() < 1e-9).sum(-1) >= 8).all()  # on 8 of its faces: a vertex
    assert torch.allclose(vertices.min(0).values, torch.tensor([0.0] * 6 + [-0.0, -2 / 3], dtype=torch.float64),
                          atol=1e-9)


@pytest.mark.parametrize("topk", [1, 7, 32, 64])
def test_candidate_points_hold_every_stable_top_k(topk):
    """The top-k of all 232 points (squared distances equal within 1e-9 ordered as the points: the reference's
    stable sort in exact arithmetic), at random points of F, at half- and third-integer queries (ties) and at F's
    vertices, never leaves candidate_points(topk)."""
    g = torch.Generator().manual_seed(topk)
    q = torch.cat([uniform_queries(4000, seed=topk),
                   torch.round(uniform_queries(2000, seed=topk + 1) * 2) / 2,  # half-integers: ties
                   torch.round(uniform_queries(2000, seed=topk + 2) * 3) / 3
                   + 1e-9 * torch.randn(2000, 8, generator=g, dtype=torch.float64)])
    z = L.to_fundamental(q)[0]
    z = torch.cat([z, L.fundamental_region_vertices()])
    d2 = ((z[:, None, :] - L.FUNDAMENTAL_POINTS.double()) ** 2).sum(-1)
    chosen = torch.sort(torch.round(d2 * 1e9), dim=-1, stable=True).indices[:, :topk]
    allowed = torch.zeros(L.FUNDAMENTAL_POINTS.shape[0], dtype=torch.bool)
    allowed[L.candidate_points(topk)] = True
    assert allowed[chosen].all()
    assert allowed.sum() < L.FUNDAMENTAL_POINTS.shape[0] or topk > 64  # it leaves points out


# --- the lookup ------------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [(8,) * 8, (12, 8, 16, 8, 8, 20, 8, 16)])
def test_lookup_matches_brute_force(K):
    q = 50 * torch.rand(25, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64) - 25
    index, weight = naive.lookup(q, K)
    assert index.shape == weight.shape == (25, 32)
    assert (weight[:, 1:] <= weight[:, :-1]).all()
    every_point = naive.neighbours(q, 232)
    for row in range(q.shape[0]):
        points, brute_weight = brute_force_neighbours(q[row])
        support = {tuple(p) for p in points.long().tolist()}
        found = every_point[row][((every_point[row] - q[row]) ** 2).sum(-1) < 8]
        assert {tuple(p) for p in found.long().tolist()} == support
        by_index = {index_by_hand(p, K): w for p, w in zip(points.long().tolist(), brute_weight.tolist())}
        assert torch.allclose(weight[row], brute_weight.sort(descending=True).values[:32])
        for i, w in zip(index[row].tolist(), weight[row].tolist()):
            assert by_index[i] == pytest.approx(w, abs=1e-12)


def test_support_size_and_total_weight_over_uniform_queries():
    q = uniform_queries(20000, seed=5)
    _, weight = naive.lookup(q, (8,) * 8, topk=232)
    in_support = (weight > 0).sum(-1).double()
    # Table 1: 64.94 points on average (Monte Carlo s.e. here ~0.033), at least 45, at most 121
    assert in_support.mean().item() == pytest.approx(64.94, abs=0.15)
    assert in_support.min() >= 45 and in_support.max() <= 121
    total = weight.sum(-1)
    assert total.min() >= PAPER_MIN_TOTAL_WEIGHT - 1e-12 and total.max() <= 1 + 1e-12
    # 2.6: the 32 heaviest hold 99.5% of the weight on average and at least 90%
    kept = weight[:, :32].sum(-1) / total
    assert 0.9945 <= kept.mean().item() < 0.9955
    assert kept.min() >= 0.9


def test_minimum_total_weight_is_the_papers_closed_form():
    # the minimum sits on the diagonal (a, ..., a); golden-section search over a in [0, 1/2]
    def total(a):
        return naive.lookup(torch.full((1, 8), a, dtype=torch.float64), (8,) * 8, topk=232)[1].sum().item()

    lo, hi = 0.0, 0.5
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        left, right = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, right) if total(left) < total(right) else (left, hi)
    assert total((lo + hi) / 2) == pytest.approx(PAPER_MIN_TOTAL_WEIGHT, abs=1e-12)


def test_total_weight_is_one_at_lattice_points_and_deep_holes():
    centers = random_lattice_points(50, seed=6).double()
    at_points_index, at_points = naive.lookup(centers, (8,) * 8)
    assert torch.equal(at_points[:, 0], torch.ones(50, dtype=torch.float64))
    assert (at_points[:, 1:] == 0).all()
    assert torch.equal(at_points_index[:, 0], L.memory_index(centers.long(), (8,) * 8))
    # deep holes at distance 2 (the covering radius): (2,0,...,0) and (1,1,1,1,0,0,0,0) up to symmetry
    g = torch.Generator().manual_seed(7)
    for hole in ([2.0] + [0.0] * 7, [1.0] * 4 + [0.0] * 4):
        moves = torch.stack([torch.randperm(8, generator=g) for _ in range(50)])
        signs = torch.where(torch.rand(50, 8, generator=g) < 0.5, -1.0, 1.0).double()
        q = centers + signs * torch.tensor(hole, dtype=torch.float64)[moves]
        _, weight = naive.lookup(q, (8,) * 8, topk=232)
        assert torch.allclose(weight.sum(-1), torch.ones(50, dtype=torch.float64), atol=1e-12, rtol=0)
        assert ((((q - L.nearest_point(q)) ** 2).sum(-1) - 4).abs() < 1e-12).all()


def test_interpolation_returns_the_value_at_every_lattice_point():
    K = (8, 8, 8, 8, 8, 8, 8, 12)
    values = torch.randn(L.memory_size(K), 5, dtype=torch.float64)
    grid = torch.cartesian_prod(*[torch.arange(k) for k in (8, 8, 4, 4, 4, 4, 4, 4)])  # a slab of the torus
    points = grid[L.is_lattice_point(grid)][::7]
    read = naive.interpolate(points.double(), values, K)
    assert torch.allclose(read, values[L.memory_index(points, K)], atol=1e-15, rtol=0)


def test_weights_are_differentiable_in_the_query():
    q = uniform_queries(6, seed=8).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: naive.lookup(x, (8,) * 8)[1], (q,))


def test_bad_input_raises():
    with pytest.raises(ValueError):
        naive.lookup(torch.zeros(3, 7), (8,) * 8)
    with pytest.raises(ValueError):
        naive.lookup(torch.zeros(3, 8), (8,) * 8, topk=233)
    with pytest.raises(ValueError):
        naive.interpolate(torch.zeros(3, 8), torch.zeros(10, 4), (8,) * 8)


def test_distance_to_fundamental_region_on_hand_computed_points():
    points = torch.tensor([[0] * 8, [2, 2, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, -4]])
    # origin: inside F. (2,2,0..): nearest is (1,1,0..) on z_1 + z_2 = 2, squared distance 2.
    # (0,..,0,-4): z_8 = -t needs z_1..z_7 >= t, so min over t of 7t^2 + (4 - t)^2 = 14 at t = 1/2.
    squared = L.squared_distance_to_fundamental_region(points)
    assert squared.tolist() == pytest.approx([0.0, 2.0, 14.0], abs=1e-12)
