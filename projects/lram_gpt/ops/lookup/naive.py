"""The lattice memory read in plain PyTorch: the references of the kernels in triton.py, and the CPU path.

lookup(q): the `topk` heaviest lattice points around a query q in lattice coordinates (the nearest point, the
fundamental region and FUNDAMENTAL_POINTS of lattice.py), their memory indices and weights
f(|q - k|) = max(0, 1 - |q - k|^2 / 8)^4; interpolate(q) = phi(q), the weighted sum of their value rows;
theta(z) = (sum_i 1/|z_i|)^-1 * phi(K_1/(2 pi) arg z_1, ..., K_8/(2 pi) arg z_8) for heads z in C^8
(Goucher & Troll 2.3), each head read as 16 reals (re_1..re_8, im_1..im_8).
"""
import math

import torch
import torch.nn.functional as F

from languini.memory_layers import gather_rows
from projects.lram_gpt.lattice import (
    DEFAULT_TOPK,
    DIM,
    FUNDAMENTAL_POINTS,
    KERNEL_RADIUS_SQ,
    check_torus,
    from_fundamental,
    memory_index,
    memory_size,
    to_fundamental,
)

HEAD_INPUTS = 2 * DIM  # 16 reals per head: 8 real parts, then 8 imaginary parts


def kernel_weight(squared_distance: torch.Tensor) -> torch.Tensor:
    """f(r) = max(0, 1 - r^2/8)^4 as a function of r^2."""
    return torch.clamp(1 - squared_distance / KERNEL_RADIUS_SQ, min=0) ** 4


def neighbours(q: torch.Tensor, topk: int = DEFAULT_TOPK):
    """The `topk` heaviest lattice points around q [..., 8] (float [..., topk, 8], integer valued).

    Sorted by falling weight; equal weights keep the order of FUNDAMENTAL_POINTS.
    """
    n_points = FUNDAMENTAL_POINTS.shape[0]
    if not 1 <= topk <= n_points:
        raise ValueError(f"topk must be in [1, {n_points}], got {topk}")
    points = FUNDAMENTAL_POINTS.to(device=q.device, dtype=q.dtype)
    z, center, position, sign = to_fundamental(q)
    squared_distance = ((z[..., None, :] - points) ** 2).sum(-1)
    order = torch.sort(squared_distance, dim=-1, stable=True).indices[..., :topk]
    return from_fundamental(points[order], center, position, sign)


def lookup(q: torch.Tensor, K, topk: int = DEFAULT_TOPK):
    """The memory read of query q [..., 8] (lattice coordinates) on the torus K.

    Returns (index LongTensor [..., topk], weight [..., topk]) sorted by falling weight. The weight is
    differentiable in q (the points themselves are piecewise constant).
    """
    K = check_torus(K)
    if q.shape[-1] != DIM:
        raise ValueError(f"queries must have 8 coordinates in the last dimension, got shape {tuple(q.shape)}")
    points = neighbours(q, topk)
    weight = kernel_weight(((q[..., None, :] - points) ** 2).sum(-1))
    return memory_index(points.long(), K), weight


def interpolate(q: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK) -> torch.Tensor:
    """phi(q) = sum of weight * values[index] over the lookup (reference; [..., m], float32 or wider)."""
    if values.shape[0] != memory_size(K):
        raise ValueError(f"values has {values.shape[0]} rows but the torus {tuple(K)} has {memory_size(K)}")
    index, weight = lookup(q, K, topk)
    # the cast first makes the value gradient accumulate in float32 or wider, not in bf16
    return weighted_read(index, weight, values.to(torch.promote_types(q.dtype, torch.float32)))


def weighted_read(index: torch.Tensor, weight: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """sum_k weight[..., k] * table[index[..., k]]: [..., m] in the table's dtype."""
    topk = index.shape[-1]
    # embedding_bag sums per query without materialising the [..., topk, m] rows
    read = F.embedding_bag(index.reshape(-1, topk), table, per_sample_weights=weight.reshape(-1, topk).to(table.dtype),
                           mode="sum")
    return read.view(*index.shape[:-1], table.shape[1])


def head_scale(z: torch.Tensor) -> torch.Tensor:
    """c [..., 1]: the largest power of two <= the head's largest |input| (1 for a head of zeros), as a constant.

    theta is homogeneous (theta(c w) = c theta(w)), so the torus query runs on w = z / c, whose inputs are at most
    2 in size: no square or cube of |z_i| over- or underflows for any finite z, forward or backward.
    """
    largest = z.detach().abs().amax(-1, keepdim=True)
    c = torch.exp2(torch.floor(torch.log2(largest)))
    return torch.where(largest > 0, c, torch.ones_like(c))


def torus_query(z: torch.Tensor, K):
    """Harmonic scale [..., 1] and lattice coordinates q [..., 8] of heads z [..., 16] (float32 or wider).

    q_i = K_i / (2 pi) * arg z_i, scale = 1 / sum_i 1/|z_i|, computed on w = z / c (head_scale) as
    scale = c * m / sum_i (m / |w_i|), m = min_i |w_i| (a constant: the expression does not depend on it), so
    the gradient is finite and right for every finite z. A w_i closer to 0 than sqrt(tiny) (2^-63 in fp32) is
    read on the circle of that radius at its own angle (arg 0 at exactly 0), gradient included (straight
    through), so the scale (and theta) is ~0 there with finite gradients instead of NaN.
    A head with a NaN or infinite input reads at q = 0 with scale NaN: its output is NaN, its rows stay in
    range, and its z gets a zero gradient (the kernels do the same).
    """
    if z.shape[-1] != HEAD_INPUTS:
        raise ValueError(f"each head needs 16 inputs (re_1..re_8, im_1..im_8), got shape {tuple(z.shape)}")
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    finite = torch.isfinite(z).all(-1, keepdim=True)
    z = torch.where(finite, z, torch.zeros_like(z))
    c = head_scale(z)
    w = z / c  # exact: c is a power of two
    real, imag = w[..., :DIM], w[..., DIM:]
    floor = math.sqrt(torch.finfo(z.dtype).tiny)
    modulus = torch.hypot(real, imag).detach()
    below = modulus < floor
    # the point on the floor circle at the same angle (the branch not taken may divide 0 by 0: no gradient)
    unit_real = torch.where(modulus > 0, real.detach() / modulus, torch.ones_like(real))
    unit_imag = torch.where(modulus > 0, imag.detach() / modulus, torch.zeros_like(imag))
    real = real + torch.where(below, floor * unit_real - real, torch.zeros_like(real)).detach()
    imag = imag + torch.where(below, floor * unit_imag - imag, torch.zeros_like(imag)).detach()
    modulus = torch.hypot(real, imag)
    smallest = modulus.detach().amin(-1, keepdim=True)
    scale = c * smallest / (smallest / modulus).sum(-1, keepdim=True)
    scale = torch.where(finite, scale, torch.full_like(scale, math.nan))
    angle = torch.atan2(imag, real)
    periods = torch.tensor(check_torus(K), dtype=z.dtype, device=z.device)
    return scale, angle * (periods / (2 * math.pi))


def theta(z: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK,
          sparse_values: bool = False) -> torch.Tensor:
    """theta for heads z [..., 16] reading values [N, m] on the torus K (reference).

    Returns [..., m] in float32 (float64 for float64 z). sparse_values: the value gradient is a coalesced sparse
    COO tensor of the rows read.
    """
    scale, q = torus_query(z, K)
    if sparse_values:
        phi = interpolate_sparse_grad(q, values, K, topk)
    else:
        phi = interpolate(q, values, K, topk)
    return scale * phi.to(scale.dtype)


@torch.compiler.disable  # data-dependent shapes and a sparse gradient: nothing for torch.compile to gain
def interpolate_sparse_grad(q: torch.Tensor, values: torch.Tensor, K, topk: int = DEFAULT_TOPK) -> torch.Tensor:
    """interpolate whose value gradient is a coalesced sparse COO tensor of the rows read (reference).

    The rows read are gathered once into a small table and the weighted sum reads that table, so the
    table's (dense) gradient already holds one summed row per memory index read.
    """
    if values.shape[0] != memory_size(K):
        raise ValueError(f"values has {values.shape[0]} rows but the torus {tuple(K)} has {memory_size(K)}")
    index, weight = lookup(q, K, topk)
    rows_read, position = torch.unique(index, sorted=True, return_inverse=True)
    # the cast after the gather makes the summed row gradients accumulate in float32 or wider, not in bf16
    table = gather_rows(values, rows_read).to(torch.promote_types(q.dtype, torch.float32))
    return weighted_read(position, weight, table)
