"""Transformer-XL relative attention through torch's FlexAttention (torch >= 2.5): the content term (q + u).k is
FlexAttention's own score; the position term (q + w).r_delta is formed for every distance once, (B, H, T, S), and
moved to its key in score_mod by indexing with the distance P + i - j. Compiled on GPU (fused, no (T, S)
probabilities kept), eager elsewhere (FlexAttention's unfused fallback). naive.py is the reference."""
import functools
import warnings

import torch


def available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def _reach(T: int, S: int, device: torch.device):
    """The block mask of every prefix key and the segment causally."""
    from torch.nn.attention.flex_attention import create_block_mask

    P = S - T
    return create_block_mask(lambda b, h, i, j: j <= P + i, None, None, T, S, device=device)


def relative_attention_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, u: torch.Tensor,
                            w: torch.Tensor, scale: float) -> torch.Tensor:
    """As naive.relative_attention_naive with its default mask; same arguments and shapes."""
    from torch.nn.attention.flex_attention import flex_attention

    T, S = q.shape[2], k.shape[2]
    if S < T or r.shape[1] != S:
        raise ValueError(f"need S >= T keys and S rows of r; got T={T}, S={S}, r rows {r.shape[1]}")
    P = S - T
    qu = q + u.to(q.dtype)[:, None]
    by_distance = torch.einsum("bhid,hsd->bhis", q + w.to(q.dtype)[:, None], r.to(q.dtype)) * scale

    def score_mod(score, b, h, i, j):
        return score + by_distance[b, h, i, (P + i - j).clamp(min=0)]  # future keys: any row, masked anyway

    attend = _compiled_flex_attention() if q.is_cuda else flex_attention
    with warnings.catch_warnings():  # eager (CPU) is the unfused fallback by choice: no warning about it
        warnings.filterwarnings("ignore", message=".*without torch.compile", category=UserWarning)
        return attend(qu, k.to(q.dtype), v.to(q.dtype), score_mod=score_mod, block_mask=_reach(T, S, q.device),
                      scale=scale)
