"""The GPT baseline's building blocks (Languini paper, section 4.2), in one place for every project that is "a GPT
with X": the causal attention and its implementations, GPT-2's MLP, the pre-LayerNorm block with a replaceable
feed-forward part, GPT-2's initialisation, the model around the blocks (embeddings, positions, final LayerNorm,
output layer), the config fields they read, the paper's sizes (Table 4) and compute classes (Table 6).

A project keeps the module names it had (`blocks.<i>.attn.qkv`, `blocks.<i>.mlp.fc`, or `ff` where a memory
replaces the MLP), so checkpoints load as before; tests/core/test_transformer.py pins the numerics, so a project
can tell if this module moved under it.
"""
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from languini.flags import arg

ATTENTION = ("math", "sdpa")


@dataclass
class GPTConfig:
    """The fields every GPT copy reads; a project's ModelConfig subclasses it, adding its own fields (and
    redeclaring one of these only to change its help text, never its default: the throughput fingerprint hashes
    every field)."""

    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "tokens per sequence, the length of the learned position table")
    d_model: int = arg(768, "width of the residual stream")
    n_layers: int = arg(12, "transformer blocks")
    n_heads: int = arg(12, "attention heads")
    d_head: int = arg(64, "width of each head; attention width is n_heads * d_head, which differs from d_model for "
                          "mini")
    mlp_ratio: int = arg(4, "MLP hidden width over d_model")
    attention: str = arg("math", "math: an explicit masked softmax, as the official Languini code (whose use_flash is "
                                 "off: the paper saw gradient spikes with flash attention on its RTX 3090); sdpa: "
                                 "F.scaled_dot_product_attention (flash kernels)", choices=ATTENTION)


# Table 4's widths and depths. Table 4 prints 12 layers for medium, but its 336.4M parameters (and GPT-2 medium)
# need 24.
GPT_SIZES = {
    "mini": dict(d_model=512, n_layers=4, n_heads=8, d_head=32),
    "tiny": dict(d_model=768, n_layers=4, n_heads=12, d_head=64),
    "small": dict(d_model=768, n_layers=12, n_heads=12, d_head=64),
    "medium": dict(d_model=1024, n_layers=24, n_heads=16, d_head=64),
    "large": dict(d_model=1536, n_layers=24, n_heads=16, d_head=96),
    "XL": dict(d_model=2048, n_layers=24, n_heads=24, d_head=128),
}
# Sized for a smoke test on 2 CPU cores with the embedded default corpus; not a paper config.
CPU_SIZE = dict(vocab_size=2048, seq_len=128, d_model=128, n_layers=2, n_heads=4, d_head=32)

# Table 6: the best GPT run per compute class (slow eval, RTX 3090 hours), the settings a GPT with X is compared at.
GPT_COMPUTE_CLASSES = {
    "6h": {"config": "small", "batch_size": 128},
    "12h": {"config": "small", "batch_size": 128},
    "24h": {"config": "small", "batch_size": 256},
    "48h": {"config": "medium", "batch_size": 256},
    "96h": {"config": "medium", "batch_size": 256},
}


def sizes(config_class, names=tuple(GPT_SIZES)):
    """{name: config_class(**Table 4's fields)} for the GPT sizes `names`; the cpu size is CPU_SIZE."""
    return {name: config_class(**GPT_SIZES[name]) for name in names}


def compute_classes(configs=tuple(GPT_SIZES), **settings) -> dict:
    """GPT_COMPUTE_CLASSES (fresh dicts) whose config is in `configs`, each with `settings` added."""
    return {name: {**row, **settings} for name, row in GPT_COMPUTE_CLASSES.items() if row["config"] in configs}


def causal_mask(T: int, S: int | None = None, window: int | None = None, device=None) -> torch.Tensor:
    """(T, S) booleans, True where query i may read key j: the T queries are the last T of S positions (S = T
    by default; more: a cache before the segment, the mask aligned bottom-right), each reading itself and what
    comes before, or with `window` only the last `window` positions up to itself."""
    S = T if S is None else S
    allowed = torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)
    return allowed if window is None else allowed.triu(S - T - window + 1)


def masked_attention(q, k, v, allowed: torch.Tensor, impl: str = "math") -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head)) v over the keys `allowed` ((T, S) bools) for q (B, H, T, d_head) and k, v
    (B, H, S, d_head). math: an explicit masked softmax, as the official Languini code (under autocast the softmax
    runs in fp32, the products in half precision); sdpa: F.scaled_dot_product_attention with the mask."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    return torch.einsum("bhij,bhjd->bhid", F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1), v)


def causal_attention(q, k, v, impl: str = "math", window: int | None = None) -> torch.Tensor:
    """masked_attention under the causal mask (of `window` positions); sdpa without a window is is_causal, which
    lets PyTorch pick its flash kernels."""
    if impl == "sdpa" and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return masked_attention(q, k, v, causal_mask(q.shape[-2], window=window, device=q.device), impl)


def check_attention(impl: str) -> None:
    if impl not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {impl!r}")


class Attention(nn.Module):
    """Causal multi-head self-attention: one projection to the queries, keys and values of all heads (`qkv`),
    causal_attention per head, the output projection (`proj`)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, impl: str = "math", window: int | None = None):
        super().__init__()
        check_attention(impl)
        self.n_heads, self.d_head, self.impl, self.window = n_heads, d_head, impl, window
        self.qkv = nn.Linear(d_model, 3 * n_heads * d_head)
        self.proj = nn.Linear(n_heads * d_head, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        y = causal_attention(q, k, v, self.impl, self.window)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """GPT-2's MLP: d_model -> mlp_ratio * d_model (or `hidden`), GELU (GPT-2's tanh approximation), -> d_model."""

    def __init__(self, d_model: int, mlp_ratio: int, hidden: int | None = None):
        super().__init__()
        hidden = mlp_ratio * d_model if hidden is None else hidden
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln1(x)), then + ff(ln2(x)). The feed-forward part is the GPT's MLP, built
    after the attention as the GPT always did (the order of the random draws a fixed seed reproduces), or the
    module `ff` (a memory, experts) registered as `ff_name`,
    which keeps each project's parameter names ("mlp" in the GPT, "ff" where a memory may replace it)."""

    def __init__(self, cfg: GPTConfig, ff: nn.Module | None = None, ff_name: str = "mlp", window: int | None = None):
        super().__init__()
        self.ff_name = ff_name
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg.d_model, cfg.n_heads, cfg.d_head,
                                                                   cfg.attention, window)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        setattr(self, ff_name, MLP(cfg.d_model, cfg.mlp_ratio) if ff is None else ff)

    @property
    def feed_forward(self) -> nn.Module:
        return self._modules[self.ff_name]

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.feed_forward(self.ln2(x))


def init_gpt2_(module: nn.Module) -> None:
    """GPT-2's initialisation of one module (for model.apply): linear and embedding weights ~ N(0, 0.02^2), linear
    biases zero; LayerNorms keep PyTorch's ones and zeros."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def residual_std(n_layers: int) -> float:
    """GPT-2: the weights that write to the residual stream are drawn with std 0.02 / sqrt(2 n_layers)."""
    return 0.02 / math.sqrt(2 * n_layers)


def init_residual_(linear: nn.Linear, n_layers: int) -> None:
    nn.init.normal_(linear.weight, std=residual_std(n_layers))


class GPT(nn.Module):
    """Token embeddings (scaled by sqrt(d_model), as the official Languini code) plus learned positions, the blocks,
    the final LayerNorm and the output layer (`tok_emb`, `pos_emb`, `blocks`, `ln_f`, `head`), initialised as
    GPT-2. `make_block(i)` builds block i (default: Block(cfg)); init_block scales each block's residual write
    after the model-wide init, in block order (a subclass overrides it where its feed-forward part differs).
    positions=False: no position table, for models whose positions enter inside the blocks (relative, sinusoids
    at every layer) or that need none (recurrent); they bring their own forward."""

    stateful = False  # every window starts afresh (languini/model_contract.py)

    def __init__(self, cfg: GPTConfig, make_block: Callable[[int], nn.Module] | None = None, positions: bool = True):
        super().__init__()
        self.cfg = cfg
        make_block = make_block or (lambda i: Block(cfg))
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if positions else None
        self.blocks = nn.ModuleList(make_block(i) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(init_gpt2_)
        for block in self.blocks:
            self.init_block(block)

    def init_block(self, block: nn.Module) -> None:
        """GPT-2: the MLP's residual write is scaled down with depth."""
        init_residual_(block.mlp.proj, self.cfg.n_layers)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, T) -> the first block's input (B, T, d_model)."""
        h = self.tok_emb(x) * math.sqrt(self.cfg.d_model)
        if self.pos_emb is None:
            return h
        T = x.shape[1]
        if T > self.cfg.seq_len:
            raise ValueError(f"Sequence length {T} exceeds the position table ({self.cfg.seq_len}); "
                             f"use --seq_len {T} or shorter sequences.")
        return h + self.pos_emb(torch.arange(T, device=x.device))

    def forward(self, x, state=None):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)), None
