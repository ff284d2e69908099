"""Multi-head LSTM cells of the Languini paper, section 4.3: quasi-LSTM (eq. 18-24) and classic LSTM (eq. 11-17).

Both replace the attention sublayer of the GPT block: x [B, T, d_model] -> y [B, T, d_model], with a
state carried from one call to the next. The gate projections of all heads are one fused linear
layer d_model -> 4 * n_heads * d_head with bias (the biases b of the equations), its outputs laid out
as [n_heads, 4 gates (f, i, z, o), d_head]. The output projection W_h of eq. 17/24 is one linear
layer n_heads * d_head -> d_model with bias: with it, a GPT-style model around this cell matches all
six parameter counts of Table 8 to the printed digit; without it, medium, large and XL come out 0.1M short.
"""

import torch
from torch import nn

from projects.qlstm.ops.scan import linear_scan

# added to the quasi cell's forget-gate pre-activation so f starts near sigmoid(1) = 0.73 (as in the Languini
# reference code; its classic LSTM has none)
FORGET_GATE_OFFSET = 1.0
INIT_STD = 0.02


class QuasiLSTM(nn.Module):
    """Multi-head quasi-LSTM: gates from the input only, so the only sequential part is eq. 25.

    forward(x [B, T, d_model], state c [B, n_heads, d_head] or None for zeros) -> (y, new c).
    impl and block_len pick the implementation of eq. 25 (see ops.scan.linear_scan; None = Triton on
    CUDA, block-parallel on CPU).
    """

    def __init__(self, d_model, n_heads, d_head, impl=None, block_len=16):
        super().__init__()
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.impl, self.block_len = impl, block_len
        self.gates = nn.Linear(d_model, 4 * n_heads * d_head)
        self.out = nn.Linear(n_heads * d_head, d_model)
        for linear in (self.gates, self.out):
            nn.init.normal_(linear.weight, std=INIT_STD)
            nn.init.zeros_(linear.bias)

    def forward(self, x, state=None):
        _check_input(self, x)
        batch, seq_len, _ = x.shape
        if state is not None:
            _check_state(self, "state", state, batch)
        gates = self.gates(x).view(batch, seq_len, self.n_heads, 4, self.d_head)
        forget = torch.sigmoid(gates[:, :, :, 0] + FORGET_GATE_OFFSET)
        update = torch.sigmoid(gates[:, :, :, 1]) * torch.tanh(gates[:, :, :, 2])
        output_gate = torch.sigmoid(gates[:, :, :, 3])
        cells, c_last = linear_scan(forget, update, state, impl=self.impl, block_len=self.block_len)
        hidden = output_gate * torch.tanh(cells)
        return self.out(hidden.reshape(batch, seq_len, -1)), c_last


class MultiHeadLSTM(nn.Module):
    """Classic multi-head LSTM (eq. 11-17): each head's gates also see its previous output through U.

    forward(x [B, T, d_model], state (c, h) each [B, n_heads, d_head] or None for zeros) -> (y, (c, h)).
    Runs step by step: this is the slow baseline of Table 7.
    """

    def __init__(self, d_model, n_heads, d_head):
        super().__init__()
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.gates = nn.Linear(d_model, 4 * n_heads * d_head)
        # U_f, U_i, U_z, U_o of every head side by side: h [d_head] -> 4 gates [4, d_head]
        self.recurrent = nn.Parameter(torch.empty(n_heads, d_head, 4 * d_head))
        self.out = nn.Linear(n_heads * d_head, d_model)
        for linear in (self.gates, self.out):
            nn.init.normal_(linear.weight, std=INIT_STD)
            nn.init.zeros_(linear.bias)
        nn.init.normal_(self.recurrent, std=INIT_STD)

    def forward(self, x, state=None):
        _check_input(self, x)
        batch, seq_len, _ = x.shape
        if state is None:
            zeros = x.new_zeros(batch, self.n_heads, self.d_head, dtype=torch.float32)
            state = (zeros, zeros)
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise ValueError("the MultiHeadLSTM state is a pair (c, h) or None")
        _check_state(self, "state c", state[0], batch)
        _check_state(self, "state h", state[1], batch)
        c, h = state
        gates_x = self.gates(x).view(batch, seq_len, self.n_heads, 4, self.d_head)
        hiddens = []
        for t in range(seq_len):
            recurrent = torch.einsum("bhd,hde->bhe", h.to(gates_x.dtype), self.recurrent)
            pre = gates_x[:, t] + recurrent.view_as(gates_x[:, t])
            forget = torch.sigmoid(pre[:, :, 0])  # eq. 11: no offset here, as in the reference code
            update = torch.sigmoid(pre[:, :, 1]) * torch.tanh(pre[:, :, 2])
            c = forget * c + update
            h = torch.sigmoid(pre[:, :, 3]) * torch.tanh(c)
            hiddens.append(h)
        hidden = torch.stack(hiddens, dim=1).to(gates_x.dtype)
        return self.out(hidden.reshape(batch, seq_len, -1)), (c, h)


def _check_input(cell, x):
    if x.ndim != 3 or x.shape[-1] != cell.d_model:
        raise ValueError(f"x must be [batch, time, d_model={cell.d_model}], got {tuple(x.shape)}")


def _check_state(cell, name, tensor, batch):
    expected = (batch, cell.n_heads, cell.d_head)
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} must be [batch, n_heads, d_head] = {expected}, got {tuple(tensor.shape)}")
