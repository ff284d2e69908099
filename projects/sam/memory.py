"""SAM's sparse reads and writes on one memory tensor modified in place, with the thesis's memory-efficient
backpropagation through time (section 3.2.6, Figure 3.2).

The memory M (B, N, W) is never copied: a write changes K + 1 rows per head in place, a read gathers K rows. What
a step keeps for the backward is O(1) in N: the indices it touched, the old contents of the rows it wrote (to
revert them) and their new contents (to redo them). The backward runs the steps in reverse order and, after each
step's gradients, reverts that step's write, so every read's backward sees the memory exactly as its forward did
(M_t), and no M_t is stored. When the first step of the segment has reverted its write the memory is M_0; the
writes are then re-applied in order (O(T) rows, the thesis's "re-applying the T sparse updates"), so a carried
memory leaves the backward as M_T, as the forward left it.

The gradient with respect to the memory flows backwards through a dense buffer dL/dM (the thesis's "memory
Jacobian", allocated once per memory shape) that the steps only touch at their rows; the rows touched are zeroed
again at the end of the backward, so the buffer costs O(1) per step as well.

Autograd functions make a step (SAM: SparseWrite, then SparseRead; the Sparse DNC: SparseWrite, ContentWeights,
ReadWords); they share the memory through a Tape and are chained by a scalar token (each returns a zero that the
next takes), which orders their backwards strictly in reverse: read(t), write(t), read(t - 1), ... The core adds
the last token to its outputs, so a loss on any output runs the whole chain.
"""
import torch

from projects.sam.ops.topk import EMPTY


def content_weights(query: torch.Tensor, strength: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Softmax over the K candidate words of strength * cosine(query, word) (eq. 2.4 restricted to K words, so
    the weights are renormalised over them, eq. 3.1): query (B, H, W), strength (B, H), rows (B, H, K, W).
    An all-zero word scores EMPTY (as in the search) and passes no gradient."""
    return _content(query, strength, rows)[0]


def _content(query, strength, rows):
    """content_weights and what its backward needs: (weights, unit query, query norm, unit rows, row norms,
    cosines, written)."""
    q_norm = query.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    q = query / q_norm
    norms = rows.norm(dim=-1, keepdim=True)
    written = norms > 0
    unit = rows / torch.where(written, norms, 1.0)
    cosine = torch.where(written[..., 0], (unit * q[:, :, None, :]).sum(-1), EMPTY)
    return torch.softmax(strength[..., None] * cosine, dim=-1), q, q_norm, unit, norms, cosine, written


def _content_backward(d_weights, query, strength, rows):
    """Gradients of content_weights with respect to query, strength and rows, by hand (the chain rule through
    the softmax, the strength and the two normalisations)."""
    weights, q, q_norm, unit, norms, cosine, written = _content(query, strength, rows)
    d_logits = weights * (d_weights - (weights * d_weights).sum(-1, keepdim=True))
    d_strength = (d_logits * cosine).sum(-1)
    d_cosine = torch.where(written[..., 0], d_logits * strength[..., None], 0.0)  # (B, H, K)
    d_q = (d_cosine[..., None] * unit).sum(2)
    d_query = (d_q - q * (q * d_q).sum(-1, keepdim=True)) / q_norm
    d_unit = d_cosine[..., None] * q[:, :, None, :]
    d_rows = (d_unit - unit * (unit * d_unit).sum(-1, keepdim=True)) / torch.where(written, norms, 1.0)
    return d_query, d_strength, d_rows


class GradientBuffers:
    """dL/dM buffers, one per memory shape and device, allocated once (zero between backwards)."""

    def __init__(self):
        self.buffers = {}

    def get(self, memory: torch.Tensor) -> torch.Tensor:
        key = (tuple(memory.shape), memory.device, memory.dtype)
        if key not in self.buffers:
            self.buffers = {key: torch.zeros_like(memory)}  # one shape at a time: a new one replaces the old
        return self.buffers[key]


class Tape:
    """One forward's record for its backward: the memory (as (B * N, W) rows), the writes to redo at the end and
    the rows of dL/dM to zero again. `recording` is False without autograd (evaluation): nothing is kept.

    The backward reverts this forward's writes on the memory as it finds it, so that must be the memory this
    forward left: the memory's version counter (which every in-place change raises) is recorded after each of the
    forward's writes and checked when the backward starts; a backward after another forward changed the memory is
    refused (before it changes anything)."""

    def __init__(self, memory: torch.Tensor, buffers: GradientBuffers, recording: bool):
        self.memory = memory.view(-1, memory.shape[-1])
        self._memory_full, self._buffers, self._grad = memory, buffers, None
        self.recording = recording
        self.writes = []  # (flat row indices, rows after the write), in forward order
        self.touched = []  # flat row indices of every read and write
        self.token = torch.zeros((), device=memory.device)
        self.version = self.memory._version  # the memory's version counter as this forward (or backward) left it
        self.in_backward = False

    def begin_backward(self) -> None:
        """Every step's backward calls it; the first to run (the last step's) checks the memory's version."""
        if self.in_backward:
            return
        if self.memory._version != self.version:
            raise RuntimeError(
                "SAM's memory was changed after this forward, before its backward (by another forward on the same "
                "state, with or without gradients). The backward reverts this forward's writes on the memory in "
                "place (memory.py), so it must run before the next forward changes that memory: call backward "
                "after each forward, or give the other forward a copy of the state "
                "({k: v.clone() for k, v in state.items()}).")
        self.in_backward = True

    @property
    def grad(self) -> torch.Tensor:
        """dL/dM as (B * N, W) rows."""
        if self._grad is None:
            self._grad = self._buffers.get(self._memory_full).view(-1, self.memory.shape[-1])
        return self._grad

    def finish_backward(self) -> None:
        """After the first write's revert: redo every write (the memory becomes M_T again), clean dL/dM. The
        record stays with the graph, so a second backward through it (retain_graph) works the same way."""
        for rows, new in self.writes:
            self.memory.index_copy_(0, rows, new)
        if self.touched:
            self.grad.index_fill_(0, torch.cat(self.touched), 0.0)
        self.version, self.in_backward = self.memory._version, False  # M_T again: a retained graph's next backward


class SparseWrite(torch.autograd.Function):
    """M_t = M_{t-1} with the least recently used words erased, plus the add matrix (eq. 3.6): row rows[j] gains
    coeffs[j] * word of its head. rows: (B, H, K + 1) flat indices (b * N + i); erase: the flat indices of the
    erased words (each head's last entry)."""

    @staticmethod
    def forward(ctx, token, coeffs, words, tape: Tape, rows, erase):
        flat = rows.reshape(-1)
        old = tape.memory.index_select(0, flat) if tape.recording else None
        tape.memory.index_fill_(0, erase, 0.0)
        tape.memory.index_add_(0, flat, (coeffs[..., None] * words[:, :, None, :]).reshape(-1, words.shape[-1]))
        tape.version = tape.memory._version
        if tape.recording:
            tape.writes.append((flat, tape.memory.index_select(0, flat)))
            tape.touched.append(flat)
            ctx.save_for_backward(coeffs, words)
            ctx.tape, ctx.flat, ctx.erase, ctx.old, ctx.first = tape, flat, erase, old, len(tape.writes) == 1
        return token.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        coeffs, words = ctx.saved_tensors
        tape = ctx.tape
        tape.begin_backward()
        grad = tape.grad.index_select(0, ctx.flat).view(*coeffs.shape, -1)  # dL/dM_t at the written rows
        d_coeffs = (grad * words[:, :, None, :]).sum(-1)
        d_words = (grad * coeffs[..., None]).sum(2)
        tape.grad.index_fill_(0, ctx.erase, 0.0)  # an erased word's old content reaches nothing after step t
        tape.memory.index_copy_(0, ctx.flat, ctx.old)  # revert: the memory is M_{t-1} again
        if ctx.first:
            tape.finish_backward()
        return None, d_coeffs, d_words, None, None, None


class ContentWeights(torch.autograd.Function):
    """content_weights of the words at flat rows (B, H, K) of M_t; the backward gathers them again from the
    memory (reverted to M_t by then) instead of keeping them."""

    @staticmethod
    def forward(ctx, token, query, strength, tape: Tape, rows):
        words = tape.memory.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)
        if tape.recording:
            tape.touched.append(rows.reshape(-1))
            ctx.save_for_backward(query, strength)
            ctx.tape, ctx.rows = tape, rows
        return content_weights(query, strength, words), token.new_zeros(())

    @staticmethod
    def backward(ctx, d_weights, _):
        query, strength = ctx.saved_tensors
        tape, rows = ctx.tape, ctx.rows
        tape.begin_backward()
        words = tape.memory.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)
        d_query, d_strength, d_words = _content_backward(d_weights, query, strength, words)
        tape.grad.index_add_(0, rows.reshape(-1), d_words.reshape(-1, d_words.shape[-1]))
        return None, d_query, d_strength, None, None


class SparseRead(torch.autograd.Function):
    """SAM's read in one function: the content weights of the words at flat rows (B, H, K) of M_t and
    r = sum_k weights[k] * M_t[rows[k]]; returns (r, weights, token). The backward gathers the words again from
    the memory (reverted to M_t by then) instead of keeping them."""

    @staticmethod
    def forward(ctx, token, query, strength, tape: Tape, rows):
        words = tape.memory.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)
        weights = content_weights(query, strength, words)
        if tape.recording:
            tape.touched.append(rows.reshape(-1))
            ctx.save_for_backward(query, strength)
            ctx.tape, ctx.rows = tape, rows
        return (weights[..., None] * words).sum(2), weights, token.new_zeros(())

    @staticmethod
    def backward(ctx, d_read, d_weights, _):
        query, strength = ctx.saved_tensors
        tape, rows = ctx.tape, ctx.rows
        tape.begin_backward()
        words = tape.memory.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)
        weights = content_weights(query, strength, words)
        d_query, d_strength, d_words = _content_backward(d_weights + (words * d_read[:, :, None, :]).sum(-1),
                                                         query, strength, words)
        d_words = d_words + weights[..., None] * d_read[:, :, None, :]
        tape.grad.index_add_(0, rows.reshape(-1), d_words.reshape(-1, d_words.shape[-1]))
        return None, d_query, d_strength, None, None


class ReadWords(torch.autograd.Function):
    """r = sum_k weights[k] * M_t[rows[k]] (eq. 3.1): weights and flat rows (B, H, K), r (B, H, W)."""

    @staticmethod
    def forward(ctx, token, weights, tape: Tape, rows):
        words = tape.memory.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)
        if tape.recording:
            tape.touched.append(rows.reshape(-1))
            ctx.save_for_backward(weights)
            ctx.tape, ctx.rows = tape, rows
        return (weights[..., None] * words).sum(2), token.new_zeros(())

    @staticmethod
    def backward(ctx, d_read, _):
        (weights,) = ctx.saved_tensors
        tape, rows = ctx.tape, ctx.rows
        tape.begin_backward()
        words = tape.memory.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)
        d_weights = (words * d_read[:, :, None, :]).sum(-1)
        d_words = weights[..., None] * d_read[:, :, None, :]
        tape.grad.index_add_(0, rows.reshape(-1), d_words.reshape(-1, d_words.shape[-1]))
        return None, d_weights, None, None

