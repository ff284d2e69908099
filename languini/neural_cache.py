"""The neural cache of Grave et al. (2016), as J. Rae's thesis uses it (eq. 2.7, Table 4.1's "+ Cache" rows,
Appendix B.2): the slow evaluation mixes the model's distribution with one over the last n output-layer inputs
of the stream and the tokens they predicted.

For the target at stream position t, with h_t the input of the output layer there:

    p_cache(w | h_t) = sum_{i = t-n}^{t-1} exp(theta h_t . h_i) [y_i = w]  /  sum_{i = t-n}^{t-1} exp(theta h_t . h_i)
    p(w | h_t)       = lambda p_cache(w | h_t) + (1 - lambda) p_model(w | h_t)

over the scored positions of the slow evaluation in stream order (at the first one, with an empty cache,
p = p_model). Nothing is trained: the cache is a way of reading a trained model, so it is reported beside the plain
slow evaluation, never instead of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Appendix B.2: the thesis's sweep chose theta = 0.3, lambda = 0.1 and n = 10,000 on WikiText-103's validation set
DEFAULT_SIZE, DEFAULT_THETA, DEFAULT_LAMBDA = 10_000, 0.3, 0.1
QUERY_CHUNK = 256  # positions scored at once: bounds the (chunk, vocab) distributions in memory


@dataclass(frozen=True)
class CacheSettings:
    size: int  # n: entries kept
    theta: float  # inverse temperature of the cache's softmax
    mix: float  # lambda: the cache's weight in the mixture

    def __post_init__(self):
        if self.size < 1 or not self.theta >= 0 or not 0 < self.mix < 1:
            raise ValueError(f"--eval_cache_size must be at least 1, --eval_cache_theta at least 0 and "
                             f"--eval_cache_lambda in (0, 1), got {self.size}, {self.theta} and {self.mix}.")

    def record(self) -> dict:
        return {"cache_size": self.size, "cache_theta": self.theta, "cache_lambda": self.mix}


def settings(tcfg) -> CacheSettings | None:
    """The cache of a TrainConfig's --eval_cache_* flags; None when --eval_cache_size is None (off)."""
    if tcfg.eval_cache_size is None:
        return None
    return CacheSettings(tcfg.eval_cache_size, tcfg.eval_cache_theta, tcfg.eval_cache_lambda)


class NeuralCache:
    """The cache of one stream: call mix() on its scored positions in order."""

    def __init__(self, cfg: CacheSettings):
        self.cfg = cfg
        self.keys: torch.Tensor | None = None  # (entries, width) fp32: the last inputs of the output layer
        self.values: torch.Tensor | None = None  # (entries,) the tokens they predicted

    @torch.no_grad()
    def mix(self, hidden: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (positions, vocab) of the mixture at consecutive positions of the stream, given the
        output layer's inputs (positions, width), the model's logits (positions, vocab) and the targets; then
        the positions join the cache."""
        hidden, n = hidden.float(), self.cfg.size
        keys = hidden if self.keys is None else torch.cat([self.keys, hidden])
        values = targets if self.values is None else torch.cat([self.values, targets])
        before = keys.shape[0] - hidden.shape[0]  # entries of earlier positions
        out = torch.log_softmax(logits.float(), dim=-1)
        for start in range(0, hidden.shape[0], QUERY_CHUNK):
            stop = min(start + QUERY_CHUNK, hidden.shape[0])
            # query q (stream index before + q) reads entries [before + q - n, before + q)
            first = max(before + start - n, 0)
            scores = self.cfg.theta * hidden[start:stop] @ keys[first:before + stop].T
            query = torch.arange(before + start, before + stop, device=hidden.device)[:, None]
            entry = torch.arange(first, before + stop, device=hidden.device)[None, :]
            scores = scores.masked_fill((entry >= query) | (entry < query - n), -math.inf)
            weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query with no entry (the first) gets 0s
            p_cache = torch.zeros_like(out[start:stop]).scatter_add_(
                1, values[first:before + stop].expand_as(weights), weights)
            mixed = torch.logaddexp(out[start:stop] + math.log1p(-self.cfg.mix),
                                    torch.log(p_cache) + math.log(self.cfg.mix))
            empty = torch.isinf(scores).all(dim=-1, keepdim=True)
            out[start:stop] = torch.where(empty, out[start:stop], mixed)
        self.keys, self.values = keys[-n:], values[-n:]
        return out
