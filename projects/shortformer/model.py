"""Shortformer (Press et al. 2020, as in the slides "LM again?"): the GPT without input position embeddings, with
position-infused attention (PIA) and a cache of the previous segment.

PIA adds sinusoidal positions to the query and key inputs of every layer, never to the values, so a layer's
outputs carry no position and can be cached: each layer keeps the previous segment's layer inputs (detached) and
attends over them as extra keys/values, the cache at positions 1..L and the current tokens at L+1..L+T. The
state carried from segment to segment (per stream, by the trainer and the evaluation) is that cache, one tensor
per layer; its slow evaluation is thus the Shortformer's non-overlapping evaluation with cache.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from languini.transformer import GPT, MLP, causal_mask, check_attention, masked_attention
from projects.shortformer.configs import ModelConfig

def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal position embeddings (Vaswani et al.) of shape (len(positions), dim): sin in even, cos in odd
    features, wavelengths 2 pi ... 10000 * 2 pi."""
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[:, :dim]


class Attention(nn.Module):
    """Position-infused attention over [cache; segment]: its own, as the GPT's (languini/transformer.py) reads
    neither positions at every layer nor a cache; the masked softmax is the GPT's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_attention(cfg.attention)
        self.n_heads, self.d_head, self.impl = cfg.n_heads, cfg.d_head, cfg.attention
        self.inner = cfg.n_heads * cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * self.inner)
        self.proj = nn.Linear(self.inner, cfg.d_model)

    def forward(self, h: torch.Tensor, h_cache: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
        """h: (B, T, d) the normalised segment; h_cache: (B, L, d) the normalised cache or None; pos: (L + T, d)
        sinusoids of positions 1..L+T. Queries and keys read h + pos, values read h only."""
        B, T, _ = h.shape
        q, k, v = self.qkv(h).split(self.inner, dim=-1)  # one matmul: W x (+ bias) for q, k and v
        if h_cache is not None:  # the cache needs keys and values only
            k_cache, v_cache = F.linear(h_cache, self.qkv.weight[self.inner:], self.qkv.bias[self.inner:]).split(
                self.inner, dim=-1)
            k, v = torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1)
        S = k.shape[1]
        # W_q (x + P) = W_q x + W_q P: the positions' projection is (L + T, d) x (d, 2 inner), shared by the batch
        w_qk = self.qkv.weight[:2 * self.inner]
        pos_q, pos_k = F.linear(pos.to(w_qk.dtype), w_qk).split(self.inner, dim=-1)
        q, k = q + pos_q[S - T:], k + pos_k

        def heads(t):
            return t.view(B, t.shape[1], self.n_heads, self.d_head).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        # the causal mask aligned bottom-right: every cache key, and the segment's keys up to the query
        y = masked_attention(q, k, v, causal_mask(T, S, device=h.device), self.impl)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    """The GPT's pre-LayerNorm block with the cache and positions passed to the attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg.d_model, cfg.mlp_ratio)

    def forward(self, x, x_cache, pos):
        # the cache holds raw layer inputs, normalised with the current weights like the segment
        x = x + self.attn(self.ln1(x), None if x_cache is None else self.ln1(x_cache), pos)
        return x + self.mlp(self.ln2(x))


class Model(GPT):
    # carries its cache from segment to segment; an instance without cache (cache_len 0) is stateless
    stateful = True

    def __init__(self, cfg: ModelConfig):
        if cfg.cache_len < 0:
            raise ValueError(f"cache_len must be at least 0, got {cfg.cache_len}")
        super().__init__(cfg, lambda i: Block(cfg), positions=False)  # positions enter in every attention
        self.stateful = cfg.cache_len > 0

    def forward(self, x, state=None):
        """x: (B, T) tokens; state: None or the previous segment's cache, one (B, L, d) tensor per layer.
        Returns logits (B, T, vocab) and the new cache (the last cache_len layer inputs of this segment, detached;
        None without cache)."""
        T = x.shape[1]
        L = 0 if state is None else state[0].shape[1]
        pos = sinusoids(torch.arange(1, L + T + 1, device=x.device), self.cfg.d_model)
        h = self.embed(x)  # no positions here
        new_state = []
        for i, block in enumerate(self.blocks):
            if self.stateful:
                new_state.append(h[:, -self.cfg.cache_len:].detach())
            h = block(h, None if state is None else state[i], pos)
        return self.head(self.ln_f(h)), (new_state if self.stateful else None)

    def extra_flops(self, seq_len: int) -> int:
        """FLOPs of the cache that a profile of one segment without state misses: per layer, the key/value and
        position projections of min(cache_len, seq_len) cached tokens, and the segment's queries reading them."""
        L, d, inner = min(self.cfg.cache_len, seq_len), self.cfg.d_model, self.attn_width
        per_layer = 2 * L * d * 2 * inner + 2 * L * d * 2 * inner + 2 * 2 * seq_len * L * inner
        return self.cfg.n_layers * per_layer

    @property
    def attn_width(self) -> int:
        return self.cfg.n_heads * self.cfg.d_head
