"""The GPT (languini/transformer.py, as projects/gpt's; tests/feedback/test_scripts.py checks it against
projects/gpt) with an optional attention window and token-by-token generation from a key/value cache: the baseline
of bench_speed.py and toy_tasks.py at the Feedback Transformer's width, depth and segment length."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from languini import transformer


@dataclass
class GPTConfig(transformer.GPTConfig):
    window: int | None = None  # attend over the last `window` positions only (the Feedback Transformer's tau)


class GPT(transformer.GPT):
    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg, lambda i: transformer.Block(cfg, window=cfg.window))


class CachedDecoder:
    """Token-by-token generation with a key/value cache preallocated for seq_len positions per layer: each step
    projects one token's query, key and value per layer and attends over the cache so far."""

    @torch.no_grad()
    def __init__(self, model: GPT, batch: int = 1):
        cfg = model.cfg
        p = model.head.weight
        self.model, self.steps = model, 0
        self.cache = p.new_empty(cfg.n_layers, 2, batch, cfg.n_heads, cfg.seq_len, cfg.d_head)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch,) -> logits (batch, vocab) of the next token."""
        model, cfg, t = self.model, self.model.cfg, self.steps
        if t >= cfg.seq_len:
            raise ValueError(f"the cache holds {cfg.seq_len} positions (the position table's length)")
        B = tokens.shape[0]
        h = model.tok_emb(tokens) * math.sqrt(cfg.d_model) + model.pos_emb.weight[t]
        for layer, block in enumerate(model.blocks):
            q, k, v = block.attn.qkv(block.ln1(h)).view(B, 3, cfg.n_heads, cfg.d_head).unbind(1)
            self.cache[layer, 0, :, :, t] = k
            self.cache[layer, 1, :, :, t] = v
            first = 0 if cfg.window is None else max(0, t + 1 - cfg.window)
            keys, values = self.cache[layer, 0, :, :, first:t + 1], self.cache[layer, 1, :, :, first:t + 1]
            y = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values).squeeze(2)
            h = h + block.attn.proj(y.reshape(B, -1))
            h = h + block.mlp(block.ln2(h))
        self.steps += 1
        return model.head(model.ln_f(h))
