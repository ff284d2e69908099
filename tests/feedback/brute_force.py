"""The Feedback Transformer written from the equations of the slides (../shared/papers/003_*.txt), as slowly and
plainly as possible, for the tests: every x_s^l is recomputed from scratch for every output position t.

    z_t^l = Attn(x_t^l, {m_{t-tau}, ..., m_{t-1}}),   x_t^{l+1} = FF(z_t^l)  (the GPT's pre-LN block),
    m_t = sum_{l=0..L} pi_l x_t^l,   k_t = W_k LN_m(m_t),  v_t = W_v LN_m(m_t),
    score(t, j) = q_t^l . (k_{t-tau+j} + p_j) / sqrt(D),  q_t^l = W_q^l LN1^l(x_t^l),

with the model's parameters read from its modules and pi given by the caller (softmax(w), a plain average, or one
layer), so nothing of projects/feedback/segment.py or ops/ is used.
"""
import math

import torch
import torch.nn.functional as F


def memory_weights(model) -> torch.Tensor:
    """pi from the config's definition: softmax of w, 1 / (L + 1) each, or one-hot on the chosen layer."""
    cfg, n = model.cfg, model.cfg.n_layers + 1
    if cfg.memory == "weighted":
        return torch.softmax(model.mix_logits, dim=0)
    if cfg.memory == "average":
        return torch.full((n,), 1.0 / n, dtype=model.pos.dtype)
    return torch.eye(n, dtype=model.pos.dtype)[cfg.memory_layer % n]


def attend(model, block, x, window):
    """Multi-head attention of the query of x (B, d) over the memory vectors `window` (list of tau (B, d))."""
    cfg = model.cfg
    H, D = cfg.n_heads, cfg.d_head
    B = x.shape[0]
    q = F.linear(F.layer_norm(x, (cfg.d_model,), block.ln1.weight, block.ln1.bias), block.q.weight, block.q.bias)
    q = q.view(B, H, D)
    keys, values = [], []
    for m in window:
        n = F.layer_norm(m, (cfg.d_model,), model.mem_norm.weight, model.mem_norm.bias)
        k, v = F.linear(n, model.kv.weight, model.kv.bias).view(B, 2, H, D).unbind(1)
        keys.append(k)
        values.append(v)
    outputs = []
    for h in range(H):
        scores = [(q[:, h] * (k[:, h] + model.pos[j])).sum(-1) / math.sqrt(D) for j, k in enumerate(keys)]
        p = torch.softmax(torch.stack(scores, dim=1), dim=1)  # (B, tau)
        outputs.append(sum(p[:, j:j + 1] * v[:, h] for j, v in enumerate(values)))
    return F.linear(torch.cat(outputs, dim=-1), block.o.weight, block.o.bias)


def layers_at(model, tokens, initial_memory, t):
    """[x_t^0, ..., x_t^L] (each (B, d)) for position t, recomputing positions 0 .. t from the initial memory."""
    cfg = model.cfg
    pi = memory_weights(model)
    memory = list(initial_memory.unbind(1))  # oldest first
    for s in range(t + 1):
        xs = [model.tok_emb(tokens[:, s]) * math.sqrt(cfg.d_model)]
        for block in model.blocks:
            x = xs[-1]
            h = x + attend(model, block, x, memory[-cfg.mem_len:])
            c = F.layer_norm(h, (cfg.d_model,), block.ln2.weight, block.ln2.bias)
            xs.append(h + F.linear(F.gelu(F.linear(c, block.fc.weight, block.fc.bias), approximate="tanh"),
                                   block.proj.weight, block.proj.bias))
        memory.append(sum(pi[l] * xs[l] for l in range(len(xs))))
        if s == t:
            return xs, memory[-cfg.mem_len:]


def logits_and_memory(model, tokens, initial_memory):
    """(logits (B, T, vocab), the memory vectors of the last tau steps (B, tau, d)) from the equations."""
    outputs, memory = [], None
    for t in range(tokens.shape[1]):
        xs, memory = layers_at(model, tokens, initial_memory, t)
        outputs.append(model.head(F.layer_norm(xs[-1], (model.cfg.d_model,), model.ln_f.weight, model.ln_f.bias)))
    return torch.stack(outputs, dim=1), torch.stack(memory, dim=1)
