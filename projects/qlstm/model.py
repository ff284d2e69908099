"""Quasi-LSTM language model (Languini paper, section 4.3): the GPT (languini/transformer.py) with the attention
sublayer replaced by a multi-head quasi-LSTM cell (or the classic multi-head LSTM), and no position embeddings.

The state is a list with one cell state per layer (qLSTM: c; LSTM: (c, h)); None means zeros. The trainer
detaches it and carries it from one batch of a stream to the next.
"""
import torch.nn as nn

from languini.transformer import GPT, MLP
from projects.qlstm.cell import MultiHeadLSTM, QuasiLSTM
from projects.qlstm.configs import CELLS, ModelConfig
from projects.qlstm.ops.scan import IMPLS, scan_flops


def make_cell(cfg: ModelConfig) -> nn.Module:
    if cfg.cell == "lstm":
        return MultiHeadLSTM(cfg.d_model, cfg.n_heads, cfg.d_head)
    return QuasiLSTM(cfg.d_model, cfg.n_heads, cfg.d_head, impl=cfg.impl, block_len=cfg.block_len)


class Block(nn.Module):
    """The GPT's pre-LayerNorm block (languini/transformer.py) with the recurrent cell in place of the attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.cell = nn.LayerNorm(cfg.d_model), make_cell(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg.d_model, cfg.mlp_ratio)

    def forward(self, x, state):
        y, state = self.cell(self.ln1(x), state)
        x = x + y
        return x + self.mlp(self.ln2(x)), state


class Model(GPT):
    """The GPT's embeddings, output layer and init (languini/transformer.py) around the recurrent blocks; GPT-2's
    depth scaling of the MLP's residual write, not of the cell's output projection, as in the official code."""

    stateful = True  # each layer's cell state is carried to the next batch of a stream (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        _check_config(cfg)
        super().__init__(cfg, lambda i: Block(cfg), positions=False)
        if cfg.tie_embeddings:  # one tensor: what trains or rewrites a row of the output layer moves the input too
            self.head.weight = self.tok_emb.weight

    def forward(self, x, state=None):
        if state is None:
            state = [None] * self.cfg.n_layers
        elif len(state) != self.cfg.n_layers:
            raise ValueError(f"state must hold one entry per layer ({self.cfg.n_layers}), got {len(state)}; "
                             "pass the state this model returned, or None for zeros")
        h = self.embed(x)
        new_state = []
        for block, layer_state in zip(self.blocks, state):
            h, layer_state = block(h, layer_state)
            new_state.append(layer_state)
        return self.head(self.ln_f(h)), new_state

    def extra_flops(self, seq_len: int) -> int:
        """The recurrence c_t = f_t * c_{t-1} + u_t of every layer at batch 1.

        DeepSpeed's profiler counts linear layers, LayerNorm, GELU and torch.einsum/matmul calls. The
        recurrence runs as a Triton kernel, a Python loop of elementwise ops, or the block-parallel form
        built from cumprod, `*` and sum: none of which it sees. The LSTM's recurrent U h is an einsum it
        does count, so only its elementwise cell update is added here.
        """
        return self.cfg.n_layers * scan_flops(1, seq_len, self.cfg.n_heads, self.cfg.d_head)


def _check_config(cfg: ModelConfig):
    if cfg.cell not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cfg.cell!r}")
    if cfg.impl is not None and cfg.impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None (triton on CUDA, block on CPU), got {cfg.impl!r}")
    if cfg.block_len < 1:
        raise ValueError(f"block_len must be a positive int, got {cfg.block_len}")
