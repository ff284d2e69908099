"""The Feedback Transformer (Fan et al. 2020; the slides in ../shared/papers/003_*.txt) on the GPT of projects/gpt.

The GPT's pre-LayerNorm blocks, where layer l at step t attends, instead of its own layer's past, over the feedback
memory m_{t-tau} .. m_{t-1}:

    z_t^l = Attn(x_t^l, {m_{t-tau}, ..., m_{t-1}}),   m_t = sum_{l=0..L} softmax(w)_l x_t^l,
    k_t = W_k m_t,  v_t = W_v m_t  (one projection per step, shared by all layers),

x_t^0 the token embedding and x_t^l layer l's output. The keys and values pass one LayerNorm of their own before the
shared projection (pre-LN, as the queries' LN1). Positions as the authors' code gives them: a learned relative
position embedding added to the keys, one vector per distance in the window (tau of them), shared by all layers and
heads (score = q . (k_j + p_j) / sqrt(D)); there is no absolute position embedding. The current step does not attend
to itself (its memory vector exists only after its top layer). The model is stateful: the state is the memory vectors
of the last tau steps (B, tau, d), carried from segment to segment; a stream starts with tau zero vectors, as the
authors' code, whose keys and values are those of LayerNorm(0).

The segment's recurrence and its hand-written backward are in segment.py; the attention over the memory window in
ops/window_attention (a Triton kernel on GPU, the PyTorch reference on CPU).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from languini.transformer import init_gpt2_, init_residual_
from projects.feedback import segment
from projects.feedback.configs import MEMORY, ModelConfig
from projects.feedback.ops.window_attention import IMPLS, attention_flops, implementation

# segment shapes whose CUDA graphs are kept (training's, the evaluations' and a last shorter batch or window); each
# holds a segment's activations in its graph's memory
CAPTURED_SHAPES = 4


class Block(nn.Module):
    """A GPT block whose attention has only its query and output projection: keys and values are the memory's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inner = cfg.n_heads * cfg.d_head
        self.ln1, self.q, self.o = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, inner), nn.Linear(inner, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def weights(self) -> segment.Layer:
        return segment.Layer(self.ln1.weight, self.ln1.bias, self.q.weight, self.q.bias, self.o.weight, self.o.bias,
                             self.ln2.weight, self.ln2.bias, self.fc.weight, self.fc.bias, self.proj.weight,
                             self.proj.bias)


class Model(nn.Module):
    stateful = True  # carries the memory vectors of the last tau steps (languini/model_contract.py)
    weights_used_outside_blocks = True  # the segment reads every block's weights (--fsdp: one unit)
    checkpoint_state_dtype = torch.bfloat16  # (B, tau, d) per stream group; a resume is then not bit-exact

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.mem_len < 1:
            raise ValueError(f"mem_len (tau) must be at least 1, got {cfg.mem_len}")
        if cfg.memory not in MEMORY:
            raise ValueError(f"memory must be one of {', '.join(MEMORY)}, not {cfg.memory!r}")
        if cfg.memory == "layer" and not -(cfg.n_layers + 1) <= cfg.memory_layer <= cfg.n_layers:
            raise ValueError(f"memory_layer must name one of x^0 .. x^{cfg.n_layers} (or -1 for the top), "
                             f"got {cfg.memory_layer}")
        if cfg.attention_impl not in IMPLS:  # here, not at the first forward; the device is known only there
            raise ValueError(f"attention_impl must be one of {', '.join(IMPLS)}, not {cfg.attention_impl!r}")
        self.cfg = cfg
        inner = cfg.n_heads * cfg.d_head
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.mem_norm = nn.LayerNorm(cfg.d_model)
        self.kv = nn.Linear(cfg.d_model, 2 * inner)  # [W_k; W_v], shared by every layer
        self.pos = nn.Parameter(torch.empty(cfg.mem_len, cfg.d_head))
        # w of m_t = sum_l softmax(w)_l x_t^l, zeros (a plain average) at the start as the authors' code
        self.mix_logits = nn.Parameter(torch.zeros(cfg.n_layers + 1)) if cfg.memory == "weighted" else None
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(init_gpt2_)
        nn.init.normal_(self.pos)  # std 1, as the authors' position embeddings
        for block in self.blocks:  # GPT-2: the MLP's residual write is scaled down with depth
            init_residual_(block.proj, cfg.n_layers)

    def mix(self) -> torch.Tensor:
        """pi_l, the weight of x^l (l = 0 the embedding .. L) in the memory vector: (L + 1,)."""
        n = self.cfg.n_layers + 1
        if self.cfg.memory == "weighted":
            return F.softmax(self.mix_logits, dim=0)
        like = {"device": self.pos.device, "dtype": self.pos.dtype}
        if self.cfg.memory == "average":
            return torch.full((n,), 1.0 / n, **like)
        return torch.eye(n, **like)[self.cfg.memory_layer % n]

    def shared_weights(self) -> segment.Shared:
        return segment.Shared(self.pos, self.mem_norm.weight, self.mem_norm.bias, self.kv.weight, self.kv.bias)

    def segment_params(self) -> list:
        """The flat parameter list of segment.FeedbackSegment: the shared ones, then every layer's."""
        return [*self.shared_weights(), *(p for block in self.blocks for p in block.weights())]

    def segment_weights(self, mix: torch.Tensor, cdt: torch.dtype) -> segment.Weights:
        return segment.cast_weights(self.shared_weights(), [b.weights() for b in self.blocks], mix, self.cfg.n_heads,
                                    cdt, self.kv.weight.dtype)

    def captured_segment(self, ops, cdt, x0, mem, mix, keep: bool):
        """The CUDA-graph replay of segments of this shape (segment.CapturedSegment), or None: off by config, and
        for a shape's first call, which runs eagerly (a FLOP profiler counts that one call's operations once)."""
        if not self.cfg.cuda_graphs:
            return None
        key = (keep, tuple(x0.shape), tuple(mem.shape), cdt, x0.device, ops.__name__)
        graphs = self.__dict__.setdefault("_captured", {})  # not a module attribute: no state_dict, no .to()
        if key not in graphs:
            graphs[key] = None
            while len(graphs) > CAPTURED_SHAPES:  # the oldest shape's graphs (and their memory) go
                graphs.pop(next(iter(graphs)))
            return None
        graphs[key] = graphs.pop(key)  # the most recently used last
        if graphs[key] is None:
            graphs[key] = segment.CapturedSegment(lambda m: self.segment_weights(m, cdt), ops, x0, mem, mix, keep)
        return graphs[key]

    def empty_state(self, batch: int, device) -> torch.Tensor:
        """The memory of a stream's start: tau zero vectors."""
        return torch.zeros(batch, self.cfg.mem_len, self.cfg.d_model, device=device)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        # token embeddings scaled by sqrt(d_model), as the GPT's (the official Languini code)
        return self.tok_emb(x) * math.sqrt(self.cfg.d_model)

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype of the matrix products: autocast's where it is on, else the weights'."""
        kind = device.type
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.kv.weight.dtype

    @torch.compiler.disable  # a Python loop over the segment's steps, not a graph to trace
    def forward(self, x, state=None):
        """x: (B, T) tokens; state: None (a stream's start) or the memory vectors (B, tau, d) of the previous call.
        Returns logits (B, T, vocab) and the memory vectors of the last tau steps (B, tau, d), detached."""
        B = x.shape[0]
        mem = self.empty_state(B, x.device) if state is None else state
        if mem.shape != (B, self.cfg.mem_len, self.cfg.d_model):
            raise ValueError(f"state must be the memory (batch, mem_len, d_model) = "
                             f"{(B, self.cfg.mem_len, self.cfg.d_model)}, got {tuple(mem.shape)}")
        residual = self.kv.weight.dtype  # fp32 (under autocast too): the residual stream, LayerNorms, softmax
        x0, mem = self.embed(x).to(residual), mem.to(residual)
        ops = implementation(self.cfg.attention_impl, x.device)
        cdt, mix = self.compute_dtype(x.device), self.mix()
        training = torch.is_grad_enabled()
        captured = self.captured_segment(ops, cdt, x0, mem, mix, keep=training) if x.is_cuda else None
        if captured is not None and training:
            out, new_mem = segment.CapturedFeedbackSegment.apply(captured, x0, mem, mix, *self.segment_params())
        elif captured is not None:
            out, new_mem = captured.forward(x0, mem, mix)
        elif training:
            out, new_mem = segment.FeedbackSegment.apply(ops, self.cfg.n_heads, cdt, x0, mem, mix,
                                                         *self.segment_params())
        else:  # evaluation and generation: one step's stores reused
            with torch.autocast(x.device.type, enabled=False):
                out, new_mem, _ = segment.forward_segment(self.segment_weights(mix, cdt), ops, x0, mem, keep=False)
        return self.head(self.ln_f(out)), new_mem

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs the profiler misses: the attention core when the Triton kernel computes it (the profiler
        counts the reference's products)."""
        cfg = self.cfg
        if implementation(cfg.attention_impl, self.pos.device).__name__.endswith("triton"):
            return cfg.n_layers * seq_len * attention_flops(1, cfg.n_heads, cfg.d_head, cfg.mem_len)
        return 0


class Decoder:
    """Token-by-token generation, equal to the forward: a ring of tau key/value slots, one step per token, that
    attends only over the slots a stream has written.

    Step n (after n tokens) attends over window places 0 .. tau-1 with ring slot s at place (s - n) mod tau (the
    segment's step with window start = write slot = n mod tau: the oldest slot is read, then overwritten by the new
    memory vector's key and value). A stream started without a state holds tau zero memory vectors (the model's
    definition, as the forward's empty_state), whose keys and values are all one pair (those of LN_m(0)): until
    the ring is full, the tau - n empty places count as one extra slot holding that pair, its score the
    log-sum-exp of their position scores, exactly their share of the softmax. So step n reads n + 1 keys and
    values, not tau; the position scores (q against the (tau, D) table shared by every row and head) are computed
    for all places. Every buffer is allocated here; a step's attention writes into views of them. Weights are
    read once, at the start.

    Once the ring is full every step has the same shapes: `full_ring_step` computes it from device state alone (the
    tokens in a buffer, the oldest slot as a tensor), so that its operations can be captured once and replayed.
    cuda_graph=True (CUDA only; off by default: not yet run on a GPU) captures it in a CUDA graph at the first
    full-ring step and replays it after; on the CPU a test records its operations once and replays them."""

    @torch.no_grad()
    def __init__(self, model: Model, state: torch.Tensor | None = None, batch: int = 1, cuda_graph: bool = False):
        cfg = model.cfg
        device, dtype = model.pos.device, model.kv.weight.dtype
        if state is not None and state.shape != (batch, cfg.mem_len, cfg.d_model):
            raise ValueError(f"state must be (batch, mem_len, d_model) = {(batch, cfg.mem_len, cfg.d_model)}, "
                             f"got {tuple(state.shape)}")
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"cuda_graph needs the model on a CUDA device, not {device.type}")
        self.model, self.steps = model, 0
        self.weights = w = model.segment_weights(model.mix(), model.compute_dtype(device))
        H, D, L, tau, d = cfg.n_heads, cfg.d_head, cfg.n_layers, cfg.mem_len, cfg.d_model
        # the attention's dtype (fp32 for bf16 products, as the forward's window attention); the keys and values
        # are rounded to the compute dtype first, as the forward's buffer holds them
        acc = torch.promote_types(w.cdt, torch.float32)
        # index 0: the empty memory's key and value; 1 + s: ring slot s
        self.kv = torch.empty(2, batch, H, 1 + tau, D, device=device, dtype=acc)
        self.kv[:, :, :, 0] = segment.memory_keys_values(w, torch.zeros(1, d, device=device, dtype=dtype)).view(
            2, 1, H, D)
        self.written = 0  # ring slots holding a memory vector's key and value (the first ones, until full)
        if state is not None:
            self.kv[:, :, :, 1:] = segment.memory_keys_values(w, state.to(dtype).reshape(-1, d)).view(
                batch, tau, 2, H, D).permute(2, 0, 3, 1, 4)
            self.written = tau
        self.keys, self.values = (self.kv[i].view(batch * H, 1 + tau, D) for i in range(2))
        # the position table twice over: rows tau - start .. 2 tau - start - 1 are the places of ring slots
        # 0 .. tau-1 for the window starting at slot `start`
        self.pos = w.shared.pos.to(acc).repeat(2, 1)
        # per row and head: column 0 the empty places' log-sum-exp, 1 + s ring slot s's position score
        self.bias = torch.empty(batch * H, 1 + tau, device=device, dtype=acc)
        # the scores and weights of up to 1 + tau slots, flat: the first rows x slots elements are a contiguous
        # (rows, 1, slots) tensor for every count of slots (the batched products' fast path)
        self.scores, self.probs = (torch.empty(batch * H * (1 + tau), device=device, dtype=acc) for _ in range(2))
        self.q = torch.empty(batch * H, 1, D, device=device, dtype=acc)  # the scaled query
        self.y = torch.empty_like(self.q)
        self.xs = torch.empty(L + 1, batch, d, device=device, dtype=dtype)
        self.m = torch.empty(batch, d, device=device, dtype=dtype)
        self.hs = torch.empty(L, batch, d, device=device, dtype=dtype)
        self.qs, self.ys = (torch.empty(L, batch, H, D, device=device, dtype=w.cdt) for _ in range(2))
        self.fs = torch.empty(L, batch, cfg.mlp_ratio * d, device=device, dtype=w.cdt)
        # the full ring's step from device state: its tokens, the oldest slot (read, then written), the rows of the
        # doubled position table of ring slots 0 .. tau-1 (tau + s - oldest) gathered by index, the head's weight
        # in the compute dtype (the step casts for itself, as autocast would)
        self.tokens = torch.zeros(batch, device=device, dtype=torch.long)
        self.oldest = torch.zeros(1, device=device, dtype=torch.long)
        self.written_slot = torch.zeros(1, device=device, dtype=torch.long)
        self.slots = torch.arange(tau, device=device)
        self.rows = torch.empty(tau, device=device, dtype=torch.long)
        self.positions = torch.empty(tau, D, device=device, dtype=acc)
        self.head_w = model.head.weight.to(w.cdt)
        self.static = False  # full_ring_step running: attend reads self.positions
        self.cuda_graph, self.graph, self.graph_logits = cuda_graph, None, None

    def attend(self, l: int, q: torch.Tensor, y: torch.Tensor) -> None:
        """y (B, H, D) <- the attention of q (B, H, D) over the written slots and, until the ring is full, the
        empty places as one slot (index 0 of the buffers)."""
        tau = self.model.cfg.mem_len
        start, n = self.steps % tau, self.written
        rows = self.q.shape[0]
        if q.dtype == self.q.dtype:
            qs = torch.mul(q.view(self.q.shape), self.weights.scale, out=self.q)
        else:  # bf16 products: the attention in fp32, as the forward's
            qs = self.q.copy_(q.view(self.q.shape)).mul_(self.weights.scale)
        positions = self.positions if self.static else self.pos[tau - start:2 * tau - start]
        torch.mm(qs.view(rows, -1), positions.t(), out=self.bias[:, 1:])
        first = 1 if n == tau else 0  # the extra slot only while some place is empty
        if not first:
            torch.logsumexp(self.bias[:, 1 + n:], dim=-1, keepdim=True, out=self.bias[:, :1])
        count = n + 1 - first
        scores = torch.bmm(qs, self.keys[:, first:n + 1].transpose(1, 2),
                           out=self.scores[:rows * count].view(rows, 1, count))
        scores.add_(self.bias[:, None, first:n + 1])
        p = torch.softmax(scores, dim=-1, out=self.probs[:rows * count].view(rows, 1, count))
        out = y.view(self.y.shape) if y.dtype == self.y.dtype else self.y
        torch.bmm(p, self.values[:, first:n + 1], out=out)
        if out is self.y:
            y.copy_(self.y.view(y.shape))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch,) -> logits (batch, vocab) of the next token."""
        if self.cuda_graph and self.written == self.model.cfg.mem_len:
            return self.replayed_step(tokens)
        self.xs[0] = self.model.embed(tokens)
        slot = self.steps % self.model.cfg.mem_len
        with torch.autocast(tokens.device.type, enabled=False):
            kv = segment.step_forward(self.weights, self.attend, self.xs, self.m, self.hs, self.qs, self.ys,
                                      self.fs)
        self.kv[:, :, :, 1 + slot] = kv.transpose(0, 1)
        self.written = min(self.written + 1, self.model.cfg.mem_len)
        self.steps += 1
        return self.model.head(self.model.ln_f(self.xs[-1]))

    def start_full_ring(self) -> None:
        """Before the first full_ring_step: the oldest slot as a tensor (the steps advance it on the device)."""
        if self.written != self.model.cfg.mem_len:
            raise RuntimeError(f"the ring holds {self.written} of {self.model.cfg.mem_len} slots: not full")
        self.oldest.fill_(self.steps % self.model.cfg.mem_len)

    @torch.no_grad()
    def full_ring_step(self) -> torch.Tensor:
        """One step of a full ring for the tokens in self.tokens, the oldest slot in self.oldest (start_full_ring
        first): every operation and argument the same at every call, nothing read back to the host, so a CUDA graph
        can replay it. Returns the logits (batch, vocab) in the compute dtype; advances self.oldest, not the
        Python-side counters (the caller's)."""
        model, tau = self.model, self.model.cfg.mem_len
        torch.add(self.slots, tau, out=self.rows).sub_(self.oldest)
        torch.index_select(self.pos, 0, self.rows, out=self.positions)
        self.static = True
        try:
            with torch.autocast(self.tokens.device.type, enabled=False):
                self.xs[0] = model.embed(self.tokens)
                kv = segment.step_forward(self.weights, self.attend, self.xs, self.m, self.hs, self.qs, self.ys,
                                          self.fs)
                torch.add(self.oldest, 1, out=self.written_slot)
                self.kv.index_copy_(3, self.written_slot, kv.transpose(0, 1).unsqueeze(3).to(self.kv.dtype))
                self.oldest.add_(1).remainder_(tau)
                return F.linear(model.ln_f(self.xs[-1]).to(self.head_w.dtype), self.head_w)
        finally:
            self.static = False

    def replayed_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """A full ring's step from its CUDA graph: captured at the first call (after one eager run on a side stream,
        which is this call's step), replayed after."""
        self.tokens.copy_(tokens)
        if self.graph is None:
            self.start_full_ring()
            outputs = []
            self.graph = segment.capture(lambda: outputs.append(self.full_ring_step()))
            logits, self.graph_logits = outputs
        else:
            self.graph.replay()
            logits = self.graph_logits.clone()
        self.steps += 1
        return logits
