"""The GPT of projects/gpt/model.py, copied (projects never import each other; tests/feedback/test_bench.py checks
the copy against the original), with token-by-token generation from a key/value cache: the baseline of
bench_speed.py and toy_tasks.py at the Feedback Transformer's width, depth and segment length."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 16384
    seq_len: int = 512
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_head: int = 64
    mlp_ratio: int = 4
    attention: str = "math"  # math: the official code's explicit masked softmax; sdpa: F.scaled_dot_product_attention
    window: int | None = None  # attend over the last `window` positions only (the Feedback Transformer's tau)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.d_head, self.impl, self.window = cfg.n_heads, cfg.d_head, cfg.attention, cfg.window
        inner = cfg.n_heads * cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * inner)
        self.proj = nn.Linear(inner, cfg.d_model)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        hidden = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # the future
        if self.window is not None:  # and what lies `window` or more positions back
            hidden |= torch.ones_like(hidden).tril(-self.window)
        if self.impl == "sdpa":
            y = (F.scaled_dot_product_attention(q, k, v, is_causal=True) if self.window is None
                 else F.scaled_dot_product_attention(q, k, v, attn_mask=~hidden))
        else:
            scores = torch.einsum("bhid,bhjd->bhij", q, k) * self.d_head ** -0.5
            y = torch.einsum("bhij,bhjd->bhid", F.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    stateful = False

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for block in self.blocks:
            nn.init.normal_(block.mlp.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, x, state=None):
        T = x.shape[1]
        h = self.tok_emb(x) * math.sqrt(self.cfg.d_model) + self.pos_emb(torch.arange(T, device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)), None


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
