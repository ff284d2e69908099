"""The E8 lattice memory of Goucher & Troll (sections 2.2-2.6): the lattice, the torus, the lookup's geometry.

Lambda is E8 scaled by 2: integer points whose coordinates share one parity and sum to a multiple of 4.
Its minimal vectors have length sqrt(8), its packing radius is sqrt(2) and its covering radius 2.
A query q in R^8 (lattice coordinates) reads the lattice points k with |q - k| < sqrt(8), each with
weight f(|q - k|) = max(0, 1 - |q - k|^2 / 8)^4, and keeps the `topk` heaviest (paper: 32).

The memory is the torus R^8 / (K_1 Z x ... x K_8 Z) with every K_i a positive multiple of 4, so it holds
N = prod(K_i) / 256 lattice points (memory locations). Memory index of a lattice point x (fixed, so
checkpoints and tests agree): p = x_1 mod 2; y_i = ((x_i - p) / 2) mod (K_i / 2);
index = p * N/2 + the mixed-radix number of (y_1, ..., y_7, floor(y_8 / 2)) with radices
(K_1/2, ..., K_7/2, K_8/4), y_1 most significant.

When every K_i >= 8 the lattice points within sqrt(8) of a query are distinct on the torus, so the lookup
is the paper's phi with the quotient metric. With some K_i = 4 (memories below 2^16 locations) one
location can be met twice in the ball; the lookup then sums both images (the periodic kernel).

The lookup (2.6): the nearest lattice point c (Conway & Sloane's decoder on the two cosets of 2*D8),
then a signed permutation with an even number of sign changes maps q - c into the fundamental region
    F: z_1 >= ... >= z_7 >= |z_8|,  z_1 + z_2 <= 2,  z_1 + ... + z_8 <= 4,
where FUNDAMENTAL_POINTS lists every lattice point closer than sqrt(8) to F (computed below, not pasted).
Their inverse images are a superset of the lattice points in the query's kernel support; candidate_points(topk)
are those of them that can be among the topk nearest of some point of F (82 for topk = 32), all the kernels
search. The lookup itself (and its kernels) is the op in ops/lookup/.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch

DIM = 8
KERNEL_RADIUS_SQ = 8.0  # f(r) vanishes from r = sqrt(8), the distance between neighbouring points
DEFAULT_TOPK = 32


# ---------------------------------------------------------------------------------------------------
# The torus and the memory index
# ---------------------------------------------------------------------------------------------------

def check_torus(K) -> tuple[int, ...]:
    """K as a tuple of 8 ints, each a positive multiple of 4; ValueError otherwise."""
    K = tuple(int(k) for k in K)
    if len(K) != DIM or any(k <= 0 or k % 4 for k in K):
        raise ValueError(f"K must be 8 positive multiples of 4 (the torus periods), got {K}")
    return K


def memory_size(K) -> int:
    """Number of memory locations N = prod(K_i) / 256 of the torus with periods K."""
    return math.prod(check_torus(K)) // 256


def torus_for_memory_size(n_locations: int) -> tuple[int, ...]:
    """The most balanced periods K (each 4 * 2^a_i, larger ones first) with memory_size(K) == n_locations.

    n_locations must be a power of two >= 256 (all K_i = 4); from 2^16 on every K_i >= 8.
    """
    if n_locations < 256 or n_locations & (n_locations - 1):
        raise ValueError(f"the memory size must be a power of two >= 256, got {n_locations}")
    doublings = n_locations.bit_length() - 1 - 8  # prod(K) = 4^8 * 2^doublings = 256 * N
    base, extra = divmod(doublings, DIM)
    return tuple(4 << (base + (i < extra)) for i in range(DIM))


def index_radices(K) -> tuple[int, ...]:
    """Radices of the mixed-radix memory index: (K_1/2, ..., K_7/2, K_8/4)."""
    K = check_torus(K)
    return tuple(k // 2 for k in K[:-1]) + (K[-1] // 4,)


def index_strides(K) -> tuple[int, ...]:
    """Place values of the digits (y_1, ..., y_7, floor(y_8/2)) in the memory index, y_1 most significant."""
    radices = index_radices(K)
    return tuple(math.prod(radices[i + 1:]) for i in range(DIM))


def memory_index(x: torch.Tensor, K) -> torch.Tensor:
    """Memory index (LongTensor [...]) of lattice points x (integer tensor [..., 8]) on the torus K."""
    K = check_torus(K)
    x = x.long()
    half_periods = torch.tensor([k // 2 for k in K], device=x.device)
    strides = torch.tensor(index_strides(K), device=x.device)
    parity = x[..., :1] % 2  # torch's % of ints is non-negative for a positive divisor
    y = torch.div(x - parity, 2, rounding_mode="floor") % half_periods
    digits = torch.cat([y[..., :-1], y[..., -1:] // 2], dim=-1)
    return parity[..., 0] * (memory_size(K) // 2) + (digits * strides).sum(-1)


def is_lattice_point(x: torch.Tensor) -> torch.Tensor:
    """Whether integer points x [..., 8] lie in Lambda (one parity, coordinate sum divisible by 4)."""
    x = x.long()
    parity = x % 2
    same_parity = (parity == parity[..., :1]).all(-1)
    return same_parity & (x.sum(-1) % 4 == 0)


# ---------------------------------------------------------------------------------------------------
# Nearest point and the isometry into the fundamental region
# ---------------------------------------------------------------------------------------------------

def _nearest_d8(y: torch.Tensor) -> torch.Tensor:
    """Nearest point of D8 (integer points with even sum) to y, Conway & Sloane (SPLAG ch. 20)."""
    rounded = torch.floor(y + 0.5)
    residual = y - rounded
    odd = (rounded.sum(-1) % 2) != 0
    # With an odd sum, round the coordinate furthest from its integer the other way.
    worst = residual.abs().argmax(-1, keepdim=True)
    step = torch.where(residual.gather(-1, worst) >= 0, 1.0, -1.0).to(y.dtype)
    fix = torch.zeros_like(y).scatter(-1, worst, step)
    return rounded + fix * odd[..., None].to(y.dtype)


def _nearest_point_float(q: torch.Tensor) -> torch.Tensor:
    """Nearest point of Lambda = 2*D8 u (2*D8 + 1) to q, as integer-valued floats of q's dtype."""
    even = 2 * _nearest_d8(q / 2)
    odd = 2 * _nearest_d8((q - 1) / 2) + 1
    odd_closer = ((q - odd) ** 2).sum(-1) < ((q - even) ** 2).sum(-1)
    return torch.where(odd_closer[..., None], odd, even)


def nearest_point(q: torch.Tensor) -> torch.Tensor:
    """Nearest lattice point (LongTensor [..., 8]) to each query q [..., 8]."""
    return _nearest_point_float(q.detach()).long()


def to_fundamental(q: torch.Tensor):
    """The isometry phi of section 2.6 that maps q [..., 8] into the fundamental region F.

    Returns (z, center, position, sign): z = phi(q) in F; center the nearest lattice point (float, integer
    valued); position[i] the place coordinate i moves to and sign[i] = +-1 its sign, so that
    z[position[i]] = sign[i] * (q[i] - center[i]). The number of -1 signs is even, so phi maps Lambda onto
    itself and lattice points p near F come back as center + sign * p[position] (from_fundamental).
    """
    q = q.detach()
    center = _nearest_point_float(q)
    offset = q - center
    # Stable descending order of |offset|: equal magnitudes keep their coordinate order.
    order = torch.sort(offset.abs(), dim=-1, descending=True, stable=True).indices
    position = torch.argsort(order, dim=-1)
    sign = torch.where(offset < 0, -1.0, 1.0).to(q.dtype)
    odd_negatives = (offset < 0).sum(-1) % 2 == 1
    # An odd count of negatives: flip the smallest coordinate too, so the sign changes are even.
    last = position == DIM - 1
    sign = torch.where(last & odd_negatives[..., None], -sign, sign)
    z = torch.zeros_like(q).scatter(-1, position, sign * offset)
    return z, center, position, sign


def from_fundamental(points: torch.Tensor, center: torch.Tensor, position: torch.Tensor, sign: torch.Tensor):
    """Inverse isometry: points [..., P, 8] near F to lattice points near q (float [..., P, 8])."""
    index = position[..., None, :].expand(*points.shape[:-1], DIM)
    return center[..., None, :] + sign[..., None, :] * points.gather(-1, index)


# ---------------------------------------------------------------------------------------------------
# The lattice points near F
# ---------------------------------------------------------------------------------------------------

def fundamental_region_constraints() -> tuple[torch.Tensor, torch.Tensor]:
    """F as A z <= b (float64): z_{i+1} <= z_i, -z_7 <= z_8 <= z_7, z_1 + z_2 <= 2, sum(z) <= 4."""
    rows = []
    for i in range(DIM - 2):
        row = [0.0] * DIM
        row[i], row[i + 1] = -1.0, 1.0
        rows.append(row)
    rows.append([0.0] * 6 + [-1.0, 1.0])
    rows.append([0.0] * 6 + [-1.0, -1.0])
    rows.append([1.0, 1.0] + [0.0] * 6)
    rows.append([1.0] * DIM)
    return torch.tensor(rows, dtype=torch.float64), torch.tensor([0.0] * 8 + [2.0, 4.0], dtype=torch.float64)


def lattice_points_up_to_norm(max_norm: int) -> torch.Tensor:
    """All points of Lambda with squared norm <= max_norm (<= 16 here), LongTensor [P, 8]."""
    bound = math.isqrt(max_norm)
    cosets = []
    for parity in (0, 1):  # one parity at a time keeps the candidate grid small
        values = np.arange(-bound, bound + 1)
        values = values[values % 2 == parity]
        grid = np.stack(np.meshgrid(*[values] * DIM, indexing="ij"), axis=-1).reshape(-1, DIM)
        cosets.append(grid[(grid.sum(-1) % 4 == 0) & ((grid**2).sum(-1) <= max_norm)])
    return torch.from_numpy(np.concatenate(cosets)).long()


def squared_distance_to_fundamental_region(points: torch.Tensor) -> torch.Tensor:
    """Exact (float64) squared distance from each point [P, 8] to F, by enumerating active sets.

    The nearest point of a polytope is the projection onto the affine span of some linearly independent
    set of its active constraints, so the minimum over all such projections that land in F is exact.
    """
    A, b = (t.numpy() for t in fundamental_region_constraints())
    points = points.to(torch.float64).numpy()
    best = np.full(points.shape[0], np.inf)
    for size in range(DIM + 1):
        for active in itertools.combinations(range(A.shape[0]), size):
            A_s, b_s = A[list(active)], b[list(active)]
            gram = A_s @ A_s.T
            if size and round(np.linalg.det(gram)) == 0:  # integer Gram matrix: dependent rows
                continue
            projected = points - np.linalg.solve(gram, (points @ A_s.T - b_s).T).T @ A_s if size else points
            inside = (projected @ A.T <= b + 1e-9).all(-1)
            distance = ((points - projected) ** 2).sum(-1)
            best = np.where(inside, np.minimum(best, distance), best)
    return torch.from_numpy(best)


def compute_fundamental_points() -> torch.Tensor:
    """Every lattice point closer than sqrt(8) to F, sorted by norm then lexicographically (LongTensor).

    F lies within distance 2 (the covering radius) of the origin, so candidates have norm below
    (2 + sqrt(8))^2 < 24, i.e. norm 0, 8 or 16. Squared distances are rationals with small denominators,
    so 1e-6 separates "exactly 8" (excluded) from "below 8".
    """
    candidates = lattice_points_up_to_norm(16)
    near = squared_distance_to_fundamental_region(candidates) < KERNEL_RADIUS_SQ - 1e-6
    points = candidates[near].tolist()
    points.sort(key=lambda p: (sum(c * c for c in p), [-c for c in p]))
    return torch.tensor(points, dtype=torch.long)


FUNDAMENTAL_POINTS = compute_fundamental_points()


def fundamental_region_vertices() -> torch.Tensor:
    """The vertices of F (float64 [21, 8]): the feasible solutions of 8 of its 10 constraints taken as equalities."""
    A, b = (t.numpy() for t in fundamental_region_constraints())
    vertices = []
    for active in itertools.combinations(range(A.shape[0]), DIM):
        A_s, b_s = A[list(active)], b[list(active)]
        if abs(np.linalg.det(A_s)) < 1e-9:
            continue
        vertex = np.linalg.solve(A_s, b_s)
        if (A @ vertex <= b + 1e-9).all() and not any(np.allclose(vertex, seen) for seen in vertices):
            vertices.append(vertex)
    return torch.from_numpy(np.array(vertices))


_CANDIDATES: dict = {}


def candidate_points(topk: int) -> torch.Tensor:
    """Indices (rising, LongTensor) of the FUNDAMENTAL_POINTS that can be among the topk nearest of a z in F.

    A point p is left out when at least topk others are at least as near to every z in F and come first in the
    order of FUNDAMENTAL_POINTS wherever they tie with p: then topk points sort before p (stably) whatever z is.
    |z - p'|^2 - |z - p|^2 is linear in z, so its largest value on F is at one of F's vertices. For topk = 32,
    82 of the 232 points remain.
    """
    if topk not in _CANDIDATES:  # in numpy: no FLOP profiler counts this one-off table as the model's work
        points = FUNDAMENTAL_POINTS.numpy().astype(np.float64)
        norms = (points**2).sum(-1)
        along = fundamental_region_vertices().numpy() @ points.T  # [vertices, points]
        # largest[p, p'] = max over F of |z - p'|^2 - |z - p|^2 (rationals with small denominators: 1e-9 apart)
        difference = norms[None, :, None] - norms[:, None, None] - 2 * (along.T[None, :, :] - along.T[:, None, :])
        largest = difference.max(-1)
        order = np.arange(points.shape[0])
        first = (largest < -1e-9) | ((largest <= 1e-9) & (order[None, :] < order[:, None]))
        np.fill_diagonal(first, False)
        _CANDIDATES[topk] = torch.from_numpy(np.nonzero(first.sum(1) < topk)[0])
    return _CANDIDATES[topk]
