"""GPT-2 style decoder (Languini paper, section 4.2): pre-LayerNorm, learned positions, untied embeddings (tied with
--tie_embeddings)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from projects.gpt.configs import ModelConfig


ATTENTION = ("math", "sdpa")


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {cfg.attention!r}")
        self.n_heads, self.d_head, self.impl = cfg.n_heads, cfg.d_head, cfg.attention
        inner = cfg.n_heads * cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * inner)
        self.proj = nn.Linear(inner, cfg.d_model)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        if self.impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # as the official code: under autocast the softmax runs in fp32, the products in half precision
            scores = torch.einsum("bhid,bhjd->bhij", q, k) * self.d_head ** -0.5
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.einsum("bhij,bhjd->bhid", F.softmax(scores.masked_fill(future, float("-inf")), dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # GPT-2's GELU


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    stateful = False  # every window starts afresh (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tie_embeddings:  # one tensor: what trains or rewrites a row of the output layer moves the input too
            self.head.weight = self.tok_emb.weight
        for block in self.blocks:  # GPT-2: the MLP's residual write is scaled down with depth
            nn.init.normal_(block.mlp.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, x, state=None):
        T = x.shape[1]
        if T > self.cfg.seq_len:
            raise ValueError(f"Sequence length {T} exceeds the position table ({self.cfg.seq_len}); "
                             f"use --seq_len {T} or shorter sequences.")
        # Token embeddings scaled by sqrt(d_model), as in the official Languini code the paper's numbers come from.
        h = self.tok_emb(x) * math.sqrt(self.cfg.d_model) + self.pos_emb(torch.arange(T, device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)), None
