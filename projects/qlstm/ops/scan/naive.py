"""The linear recurrence c_t = f_t * c_{t-1} + u_t in plain PyTorch: the references and the CPU path.

- `loop_scan`: the minimal for-loop over time, the obviously-right reference.
- `block_scan`: the block-parallel form of eq. 34 of the Languini paper; all cell states of a block of
  `block_len` steps come from the products of forget gates (the tensor F of eq. 33) in parallel, and only the
  carry from block to block is sequential.

Both take f, u [B, T, H, D] and c0 [B, H, D] and run in acc_dtype; they return (c_all [B, T, H, D] in u's
dtype, c_last [B, H, D] in acc_dtype).
"""

import torch
import torch.nn.functional as F


def loop_scan(f, u, c0, acc_dtype):
    c = c0.to(acc_dtype)
    states = []
    for t in range(f.shape[1]):
        c = f[:, t].to(acc_dtype) * c + u[:, t].to(acc_dtype)
        states.append(c)
    return torch.stack(states, dim=1).to(u.dtype), c


def block_scan(f, u, c0, acc_dtype, block_len):
    batch, seq_len, n_heads, d_head = f.shape
    n_blocks = -(-seq_len // block_len)
    pad = n_blocks * block_len - seq_len
    # padded steps with f = 1 and u = 0 leave the state unchanged, so c_last stays right
    f_blocks = F.pad(f.to(acc_dtype), (0, 0, 0, 0, 0, pad), value=1.0).view(batch, n_blocks, block_len, n_heads, d_head)
    u_blocks = F.pad(u.to(acc_dtype), (0, 0, 0, 0, 0, pad)).view(batch, n_blocks, block_len, n_heads, d_head)

    # gates[.., k, j, ..] = f_j for j <= k else 1; reverse cumprod over j gives prod_{j=i}^{k} f_j at [k, i]
    steps = torch.arange(block_len, device=f.device)
    j_le_k = (steps[None, :] <= steps[:, None])[:, :, None, None]
    gates = torch.where(j_le_k, f_blocks.unsqueeze(2), torch.ones((), dtype=acc_dtype, device=f.device))
    suffix_prod = gates.flip(3).cumprod(3).flip(3)
    # eq. 33: F[k, 0] multiplies c_{start-1}; F[k, 1 + i] = prod_{j=i+1}^{k} f_j multiplies u_i for i <= k, else 0
    decay = suffix_prod[:, :, :, 0]
    ones = torch.ones_like(suffix_prod[:, :, :, :1])
    u_weight = torch.cat([suffix_prod[:, :, :, 1:], ones], dim=3).masked_fill(~j_le_k, 0.0)
    # eq. 34 without the carry: the state each block reaches from c_{start-1} = 0
    local = (u_weight * u_blocks.unsqueeze(2)).sum(dim=3)

    c = c0.to(acc_dtype)
    blocks = []
    for n in range(n_blocks):
        block = decay[:, n] * c.unsqueeze(1) + local[:, n]
        blocks.append(block)
        c = block[:, -1]
    c_all = torch.cat(blocks, dim=1)[:, :seq_len]
    return c_all.to(u.dtype), c
