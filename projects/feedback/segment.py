"""One segment of the Feedback Transformer: the recurrence over time with all layers per step, and its backward.

Token t's first layer needs the memory of token t-1, which mixes every layer of token t-1, so a segment is computed
step by step. Per step one pass runs every layer for the whole batch (`step_forward`), then forms the memory vector
m_t = sum_l pi_l x_t^l, projects it once into the shared key and value (W_k, W_v) and writes them into slot tau + t
of a key/value buffer allocated once per segment: slots 0 .. tau-1 hold the carried memory's keys and values, and
step t's layers attend over slots t .. t+tau-1 (ops/window_attention). No tensor grows per step.

The backward (`backward_segment`) runs the steps in reverse by hand instead of through an autograd graph of T x L
small ops: it carries the gradient of the residual stream down the layers, adds the attention's key and value
gradients into one fp32 buffer of the same slots (slot tau + t is complete when step t is reached, since only later
steps read it), and turns that slot into the gradient of m_t, which flows into every layer's output of step t with
weight pi_l. Weight gradients are summed once at the end, as one matrix product over all steps, from the stored
inputs and output gradients of each linear layer. No per-step copy of the buffer is kept.

What the forward stores for the backward, per step and layer: the layer's input and middle residual (h), its query,
attention output and what the attention's backward needs (its weights, or their log-sum-exp for the kernel), and
the MLP's pre-activation; LayerNorm statistics are recomputed in bulk.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

LAYER_FIELDS = ("ln1_w", "ln1_b", "q_w", "q_b", "o_w", "o_b", "ln2_w", "ln2_b", "fc_w", "fc_b", "proj_w", "proj_b")
SHARED_FIELDS = ("pos", "mem_w", "mem_b", "kv_w", "kv_b")
EPS = 1e-5  # nn.LayerNorm's


class Layer(NamedTuple):
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    q_w: torch.Tensor  # (H * D, d): the query of this layer
    q_b: torch.Tensor
    o_w: torch.Tensor  # (d, H * D): the attention's output projection
    o_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    fc_w: torch.Tensor
    fc_b: torch.Tensor
    proj_w: torch.Tensor
    proj_b: torch.Tensor


class Shared(NamedTuple):
    pos: torch.Tensor  # (tau, D): key position embedding of window place j, shared by layers and heads
    mem_w: torch.Tensor  # LayerNorm of the memory vectors, before the shared key/value projection
    mem_b: torch.Tensor
    kv_w: torch.Tensor  # (2 * H * D, d): W_k and W_v, shared by all layers
    kv_b: torch.Tensor


class Weights(NamedTuple):
    """The weights of one segment: matrices and biases in the compute dtype, LayerNorms and pos as stored."""
    layers: list
    shared: Shared
    mix: torch.Tensor  # (L + 1,) in the residual dtype: pi_l, the weight of x^l in the memory
    n_heads: int
    cdt: torch.dtype
    scale: float


def cast_weights(shared: Shared, layers: list, mix: torch.Tensor, n_heads: int, cdt: torch.dtype,
                 residual: torch.dtype) -> Weights:
    def matrices(t: NamedTuple, names) -> NamedTuple:
        return t._replace(**{name: getattr(t, name).to(cdt) for name in names})

    d_head = shared.pos.shape[1]
    return Weights([matrices(layer, ("q_w", "q_b", "o_w", "o_b", "fc_w", "fc_b", "proj_w", "proj_b"))
                    for layer in layers], matrices(shared, ("kv_w", "kv_b")), mix.to(residual), n_heads, cdt,
                   d_head ** -0.5)


class Saved(NamedTuple):
    """What the forward keeps for the backward (index [t, l]: step t, layer l)."""
    xs: torch.Tensor  # (T, L + 1, B, d) in the residual dtype (fp32): x_t^0 (the embedding) .. x_t^L
    hs: torch.Tensor  # (T, L, B, d): the residual after the attention
    qs: torch.Tensor  # (T, L, B, H, D): queries
    ys: torch.Tensor  # (T, L, B, H, D): attention outputs
    attn: torch.Tensor  # (T, L, *ops.saved_shape): what the attention's backward needs (weights or log-sum-exp)
    fs: torch.Tensor  # (T, L, B, 4 d): MLP pre-activations
    ms: torch.Tensor  # (T, B, d): memory vectors m_t
    mem: torch.Tensor  # (B, tau, d): the memory carried in
    kv: torch.Tensor  # (2, B, H, tau + T, D): keys and values of the carried memory and of every step


def memory_keys_values(w: Weights, m: torch.Tensor) -> torch.Tensor:
    """(rows, d) memory vectors -> (rows, 2 * H * D) keys and values: LayerNorm, then the shared projection."""
    n = F.layer_norm(m, m.shape[-1:], w.shared.mem_w, w.shared.mem_b, EPS).to(w.cdt)
    return torch.addmm(w.shared.kv_b, n, w.shared.kv_w.t())


def step_forward(w: Weights, attend, xs_t, m_t, hs_t, qs_t, ys_t, fs_t) -> torch.Tensor:
    """One step for the whole batch: every layer of x_t^0 = xs_t[0], layer l's attention by attend(l, q, y) (y
    (B, H, D) <- the attention of the queries q (B, H, D) over the memory window), then the memory vector m_t.
    Writes xs_t[1:], m_t and the stores hs_t .. fs_t; returns m_t's key and value (B, 2, H, D) in the compute dtype
    for the caller's buffer."""
    L1, B, d = xs_t.shape
    x = xs_t[0]
    for l, lw in enumerate(w.layers):
        a = F.layer_norm(x, (d,), lw.ln1_w, lw.ln1_b, EPS).to(w.cdt)
        torch.addmm(lw.q_b, a, lw.q_w.t(), out=qs_t[l].view(B, -1))
        attend(l, qs_t[l], ys_t[l])
        h = torch.add(x, torch.addmm(lw.o_b, ys_t[l].view(B, -1), lw.o_w.t()), out=hs_t[l])
        c = F.layer_norm(h, (d,), lw.ln2_w, lw.ln2_b, EPS).to(w.cdt)
        g = F.gelu(torch.addmm(lw.fc_b, c, lw.fc_w.t(), out=fs_t[l]), approximate="tanh")
        x = torch.add(h, torch.addmm(lw.proj_b, g, lw.proj_w.t()), out=xs_t[l + 1])
    torch.mm(w.mix.view(1, L1), xs_t.view(L1, B * d), out=m_t.view(1, B * d))
    return memory_keys_values(w, m_t).view(B, 2, w.n_heads, -1)


def forward_segment(w: Weights, ops, x0: torch.Tensor, mem: torch.Tensor, keep: bool):
    """x0 (B, T, d) embeddings in the residual dtype (fp32; fp64 in tests), mem (B, tau, d) the memory vectors
    carried in (oldest first), in the same dtype.

    Returns (x^L (B, T, d), the memory vectors of the last tau steps (B, tau, d), Saved or None). keep=False (no
    backward to come) reuses one step's stores instead of keeping T of them."""
    B, T, d = x0.shape
    tau = mem.shape[1]
    L, H = len(w.layers), w.n_heads
    D = w.shared.pos.shape[1]
    kv = x0.new_empty(2, B, H, tau + T, D, dtype=w.cdt)
    kv[:, :, :, :tau] = memory_keys_values(w, mem.reshape(B * tau, d)).view(B, tau, 2, H, D).permute(2, 0, 3, 1, 4)
    xs = x0.new_empty(T, L + 1, B, d)
    xs[:, 0] = x0.transpose(0, 1)
    ms = x0.new_empty(T, B, d)
    n = T if keep else 1
    hs = x0.new_empty(n, L, B, d)
    qs, ys = (x0.new_empty(n, L, B, H, D, dtype=w.cdt) for _ in range(2))
    attn = x0.new_empty(n, L, *ops.saved_shape(B, H, tau)) if keep else None
    fs = x0.new_empty(n, L, B, w.layers[0].fc_w.shape[0], dtype=w.cdt)
    for t in range(T):
        i = t if keep else 0

        def attend(l, q, y, t=t):  # step t's window: slots t .. t + tau - 1
            ops.attend(q, kv[0], kv[1], w.shared.pos, t, w.scale, y, attn[t, l] if keep else None)

        kv[:, :, :, tau + t] = step_forward(w, attend, xs[t], ms[t], hs[i], qs[i], ys[i], fs[i]).transpose(0, 1)
    new_mem = torch.cat([mem[:, min(T, tau):], ms[max(T - tau, 0):].transpose(0, 1)], dim=1)  # the last tau
    saved = Saved(xs, hs, qs, ys, attn, fs, ms, mem, kv) if keep else None
    return xs[:, L].transpose(0, 1), new_mem, saved


def layer_norm_backward(grad, x, mean, rstd, weight, bias):
    """dL/dx of LayerNorm(x) for the output gradient `grad`, from the forward's statistics."""
    return torch.ops.aten.native_layer_norm_backward(grad.to(x.dtype), x, x.shape[-1:], mean, rstd, weight, bias,
                                                     [True, False, False])[0]


def normalised(x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    return (x - mean) * rstd


def backward_segment(w: Weights, ops, saved: Saved, d_out: torch.Tensor):
    """The gradients of forward_segment's x^L output (d_out (B, T, d)) with respect to x0, pi and every weight.

    Returns (dx0 (B, T, d), dpi (L + 1,), [Layer of gradients per layer], Shared of gradients) in the residual
    dtype."""
    xs, hs, qs, ys, attn, fs, ms, mem, kv = saved
    T, L1, B, d = xs.shape
    L, H, cdt = L1 - 1, w.n_heads, w.cdt
    tau, D = w.shared.pos.shape
    inner = H * D
    acc = xs.dtype
    dkv = torch.zeros(kv.shape, device=kv.device, dtype=acc)
    # the LayerNorm statistics of every step at once
    _, mean1, rstd1 = torch.native_layer_norm(xs[:, :L], (d,), None, None, EPS)
    _, mean2, rstd2 = torch.native_layer_norm(hs, (d,), None, None, EPS)
    _, mean_m, rstd_m = torch.native_layer_norm(ms, (d,), None, None, EPS)
    # output gradients of every linear layer, for the weight gradients at the end
    dX = xs.new_empty(T, L, B, d)  # of x^{l+1}, layer l's output (and of its MLP's projection)
    dF = xs.new_empty(T, L, B, fs.shape[-1], dtype=cdt)  # of the MLP's pre-activation (its fc layer)
    dC = xs.new_empty(T, L, B, d, dtype=cdt)  # of LayerNorm 2's output
    dH = xs.new_empty(T, L, B, d)  # of h (and of the attention's output projection)
    dQ = xs.new_empty(T, L, B, H, D, dtype=cdt)  # of the query projection
    dA = xs.new_empty(T, L, B, d, dtype=cdt)  # of LayerNorm 1's output
    dX0 = xs.new_empty(T, B, d)
    dM = xs.new_empty(T, B, d)  # of m_t
    dpos = torch.zeros(tau, D, device=xs.device, dtype=acc)
    # from ops.ONE_PASS_MIN_LAYERS layers on, the key and value gradients of a step's L queries are added in one
    # pass over the window (ops.add_window_gradients) instead of one per layer, inside each attention's backward
    per_step = L >= ops.ONE_PASS_MIN_LAYERS
    dS = xs.new_empty(L, B, H, tau, dtype=acc)  # score gradients of step t's layers
    dY = xs.new_empty(L, B, H, D, dtype=cdt)  # attention output gradients of step t's layers
    # their weights, where the forward kept only what recomputes them (the kernel's log-sum-exp)
    dP = xs.new_empty(L, B, H, tau, dtype=acc) if per_step and not ops.KEEPS_WEIGHTS else None
    d_top = d_out.transpose(0, 1)
    pi = w.mix.view(L1, 1, 1)
    for t in reversed(range(T)):
        # every step that reads slot tau + t (t+1 .. t+tau) is done: its gradient is m_t's, through LN and W_k, W_v
        dkv_t = dkv[:, :, :, tau + t].permute(1, 0, 2, 3).reshape(B, 2 * inner)
        dn = torch.mm(dkv_t.to(cdt), w.shared.kv_w)
        dm = layer_norm_backward(dn, ms[t], mean_m[t], rstd_m[t], w.shared.mem_w, w.shared.mem_b)
        dM[t] = dm
        d_mix = pi * dm  # (L + 1, B, d): m_t's gradient reaching each x_t^l
        dx = torch.add(d_top[t], d_mix[L], out=dX[t, L - 1])
        for l in reversed(range(L)):
            lw = w.layers[l]
            dg = torch.mm(dx.to(cdt), lw.proj_w)
            df = torch.ops.aten.gelu_backward.grad_input(dg, fs[t, l], approximate="tanh", grad_input=dF[t, l])
            dc = torch.mm(df, lw.fc_w, out=dC[t, l])
            dh = torch.add(dx, layer_norm_backward(dc, hs[t, l], mean2[t, l], rstd2[t, l], lw.ln2_w, lw.ln2_b),
                           out=dH[t, l])
            dy = torch.mm(dh.to(cdt), lw.o_w, out=dY[l].view(B, inner))
            ops.attend_backward(qs[t, l], kv[0], kv[1], w.shared.pos, t, w.scale, ys[t, l], attn[t, l],
                                dy.view(B, H, D), None if per_step else dkv[0], None if per_step else dkv[1],
                                dQ[t, l], dS[l], None if dP is None else dP[l])
            da = torch.mm(dQ[t, l].view(B, inner), lw.q_w, out=dA[t, l])
            dx = torch.add(dh, layer_norm_backward(da, xs[t, l], mean1[t, l], rstd1[t, l], lw.ln1_w, lw.ln1_b))
            dx = torch.add(dx, d_mix[l], out=dX[t, l - 1] if l else dX0[t])
        if per_step:
            ops.add_window_gradients(qs[t], dS, attn[t] if dP is None else dP, dY, dkv[0], dkv[1], t)
        dpos.addmm_(dS.view(L * B * H, tau).t(), qs[t].reshape(L * B * H, D).to(acc))

    dpi = torch.einsum("tbd,tlbd->l", dM, xs)
    layer_grads = []
    for l, lw in enumerate(w.layers):
        def flat(t, l=l):  # layer l's rows of every step: (T * B, features)
            return t[:, l].reshape(T * B, -1)

        xhat1 = normalised(flat(xs), flat(mean1), flat(rstd1))
        xhat2 = normalised(flat(hs), flat(mean2), flat(rstd2))
        dA_l, dC_l = flat(dA).to(acc), flat(dC).to(acc)
        dQ_l, dH_l, dF_l, dX_l = flat(dQ), flat(dH), flat(dF), flat(dX)
        a = (xhat1 * lw.ln1_w + lw.ln1_b).to(cdt)
        c = (xhat2 * lw.ln2_w + lw.ln2_b).to(cdt)
        g = F.gelu(flat(fs), approximate="tanh")
        layer_grads.append(Layer(
            ln1_w=(dA_l * xhat1).sum(0), ln1_b=dA_l.sum(0),
            q_w=torch.mm(dQ_l.t(), a).to(acc), q_b=dQ_l.to(acc).sum(0),
            o_w=torch.mm(dH_l.to(cdt).t(), flat(ys)).to(acc), o_b=dH_l.sum(0),
            ln2_w=(dC_l * xhat2).sum(0), ln2_b=dC_l.sum(0),
            fc_w=torch.mm(dF_l.t(), c).to(acc), fc_b=dF_l.to(acc).sum(0),
            proj_w=torch.mm(dX_l.to(cdt).t(), g).to(acc), proj_b=dX_l.sum(0)))

    # the shared projection and memory LayerNorm, over every slot: the carried memory's and each step's
    m_all = torch.cat([mem.transpose(0, 1), ms], dim=0).reshape((tau + T) * B, d)
    dkv_all = dkv.permute(3, 1, 0, 2, 4).reshape((tau + T) * B, 2 * inner)
    _, mean_all, rstd_all = torch.native_layer_norm(m_all, (d,), None, None, EPS)
    xhat_m = normalised(m_all, mean_all, rstd_all)
    n_all = (xhat_m * w.shared.mem_w + w.shared.mem_b).to(cdt)
    dn_all = torch.mm(dkv_all.to(cdt), w.shared.kv_w).to(acc)
    shared_grads = Shared(pos=dpos, mem_w=(dn_all * xhat_m).sum(0), mem_b=dn_all.sum(0),
                          kv_w=torch.mm(dkv_all.to(cdt).t(), n_all).to(acc), kv_b=dkv_all.sum(0))
    return dX0.transpose(0, 1), dpi, layer_grads, shared_grads


class FeedbackSegment(torch.autograd.Function):
    """forward(ops, n_heads, cdt, x0, mem, mix, *shared, *per-layer weights) -> (x^L, new memory): forward_segment
    and backward_segment as one autograd node. The new memory is not differentiable (a carried state is detached)."""

    @staticmethod
    def forward(ctx, ops, n_heads, cdt, x0, mem, mix, *params):
        shared, layers = unflatten(params)
        w = cast_weights(shared, layers, mix, n_heads, cdt, x0.dtype)
        with torch.autocast(x0.device.type, enabled=False):
            out, new_mem, saved = forward_segment(w, ops, x0, mem, keep=True)
        ctx.ops, ctx.weights, ctx.saved = ops, w, saved
        ctx.dtypes = [p.dtype for p in params]
        ctx.mark_non_differentiable(new_mem)
        return out, new_mem

    @staticmethod
    def backward(ctx, d_out, _):
        with torch.autocast(d_out.device.type, enabled=False):
            dx0, dpi, layer_grads, shared_grads = backward_segment(ctx.weights, ctx.ops, ctx.saved, d_out)
        ctx.saved = ctx.weights = None
        grads = [*shared_grads, *(g for layer in layer_grads for g in layer)]
        return (None, None, None, dx0, None, dpi,
                *(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes, strict=True)))


def unflatten(params) -> tuple[Shared, list]:
    """The flat parameter list of FeedbackSegment (shared, then every layer's) as (Shared, [Layer])."""
    n = len(SHARED_FIELDS)
    per_layer = len(LAYER_FIELDS)
    if (len(params) - n) % per_layer:
        raise ValueError(f"{len(params)} tensors are not {n} shared ones and {per_layer} per layer")
    return Shared(*params[:n]), [Layer(*params[i:i + per_layer]) for i in range(n, len(params), per_layer)]


class CapturedSegment:
    """forward_segment (and backward_segment when training) of one shape, captured in CUDA graphs and replayed per
    call: the T steps' thousands of small launches cost one replay each way, with no Python in between. Inputs are
    copied into static buffers; the weights are read from the parameters' own storage at every replay (optimisers
    update them in place). The saved activations live in the forward graph's memory until the next replay, so a
    backward must follow its own forward: `generation` counts replays and the backward checks it."""

    def __init__(self, weights_of, ops, x0, mem, mix, keep: bool):
        self.ops, self.generation = ops, 0
        self.x0, self.mem, self.mix = x0.clone(), mem.clone(), mix.detach().clone()
        self.backward_graph = self.d_out = self.grads = None

        def run():
            self.weights = weights_of(self.mix)
            self.out, self.new_mem, self.saved = forward_segment(self.weights, ops, self.x0, self.mem, keep)

        self.forward_graph = capture(run)

    def forward(self, x0, mem, mix):
        self.x0.copy_(x0)
        self.mem.copy_(mem)
        self.mix.copy_(mix)
        self.forward_graph.replay()
        self.generation += 1
        return self.out.clone(), self.new_mem.clone()

    def backward(self, d_out, generation: int):
        if generation != self.generation:
            raise RuntimeError("with cuda_graphs, a segment's backward must follow its own forward (another forward of "
                               "the same shape ran in between); set cuda_graphs false for this use")
        if self.backward_graph is None:
            self.d_out = d_out.contiguous().clone()

            def run():
                self.grads = backward_segment(self.weights, self.ops, self.saved, self.d_out)

            self.backward_graph = capture(run)
        self.d_out.copy_(d_out)
        self.backward_graph.replay()
        dx0, dpi, layer_grads, shared_grads = self.grads
        return dx0.clone(), dpi.clone(), [Layer(*(g.clone() for g in layer)) for layer in layer_grads], \
            Shared(*(g.clone() for g in shared_grads))


def capture(run) -> torch.cuda.CUDAGraph:
    """A CUDA graph of run(), after one eager run on a side stream (kernel compilation, cuBLAS workspaces), as CUDA
    graphs need; run keeps the captured outputs itself. Autocast is off: the segment casts for itself; autograd is
    off: the segment computes its own gradients (and writes into given buffers, which autograd refuses)."""
    with torch.autocast("cuda", enabled=False), torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    return graph


class CapturedFeedbackSegment(torch.autograd.Function):
    """FeedbackSegment replayed from a CapturedSegment: forward(captured, x0, mem, mix, *params)."""

    @staticmethod
    def forward(ctx, captured, x0, mem, mix, *params):
        out, new_mem = captured.forward(x0, mem, mix)
        ctx.captured, ctx.generation = captured, captured.generation
        ctx.dtypes = [p.dtype for p in params]
        ctx.mark_non_differentiable(new_mem)
        return out, new_mem

    @staticmethod
    def backward(ctx, d_out, _):
        dx0, dpi, layer_grads, shared_grads = ctx.captured.backward(d_out, ctx.generation)
        grads = [*shared_grads, *(g for layer in layer_grads for g in layer)]
        return (None, dx0, None, dpi, *(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes, strict=True)))
