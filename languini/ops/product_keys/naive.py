"""Product-key search in plain PyTorch: the reference of the kernels in triton.py, and the CPU path."""

import contextlib

import torch


def product_key_topk_reference(queries, sub_keys, knn):
    """Best `knn` product keys per query and head (Lample et al. 2019, 3.2).

    queries [R, heads, k_dim], sub_keys [heads, 2, n_keys, k_dim // 2] ->
    scores [R, heads, knn] (descending) and indices [R, heads, knn] with index = i1 * n_keys + i2: each half of a
    query is scored against its own sub-keys, the knn best of each half give knn x knn candidates scored by the
    sum of their two half scores, and the knn best of those are exactly the best knn of all n_keys^2 product keys.
    Equal scores come in torch.topk's order (unspecified).
    """
    n_keys = sub_keys.shape[2]
    # Score in at least fp32, also under autocast, so near-ties are ranked by the exact scores.
    dtype = torch.promote_types(queries.dtype, torch.float32)
    device_type = queries.device.type
    # The meta device (used to count FLOPs of big models) has no autocast to switch off. A plain comparison,
    # not torch.amp.is_autocast_available: torch.compile of torch 2.11 cannot trace that call (graph break).
    no_autocast = (torch.autocast(device_type=device_type, enabled=False)
                   if device_type != "meta" else contextlib.nullcontext())
    with no_autocast:
        halves = queries.to(dtype).unflatten(-1, (2, -1))  # [R, heads, 2, k_dim/2]
        half_scores = torch.einsum("rhsd,hsnd->rhsn", halves, sub_keys.to(dtype))  # [R, heads, 2, n_keys]
    best_half_scores, best_half_indices = half_scores.topk(knn, dim=-1)  # [R, heads, 2, knn]
    scores1, scores2 = best_half_scores.unbind(dim=2)
    indices1, indices2 = best_half_indices.unbind(dim=2)
    candidate_scores = (scores1.unsqueeze(-1) + scores2.unsqueeze(-2)).flatten(-2)  # [R, heads, knn*knn]
    scores, best = candidate_scores.topk(knn, dim=-1)
    # the memory indices of the knn winners only, not of all knn*knn candidates (int64 each)
    return scores, indices1.gather(-1, best // knn) * n_keys + indices2.gather(-1, best % knn)


def check_inputs(queries, sub_keys, knn):
    if queries.dim() != 3 or sub_keys.dim() != 4 or sub_keys.shape[1] != 2:
        raise ValueError(f"queries must be [R, heads, k_dim] and sub_keys [heads, 2, n_keys, k_dim / 2], got "
                         f"{tuple(queries.shape)} and {tuple(sub_keys.shape)}")
    heads, _, n_keys, half = sub_keys.shape
    if queries.shape[1] != heads or queries.shape[2] != 2 * half:
        raise ValueError(f"queries {tuple(queries.shape)} do not fit sub_keys {tuple(sub_keys.shape)}: "
                         f"expected [R, {heads}, {2 * half}]")
    if not 1 <= knn <= n_keys:
        raise ValueError(f"knn must be in [1, n_keys={n_keys}], got {knn}")
    if queries.device != sub_keys.device:
        raise ValueError(f"queries on {queries.device} but sub_keys on {sub_keys.device}")
