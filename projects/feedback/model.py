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
        self.apply(self._init)
        nn.init.normal_(self.pos)  # std 1, as the authors' position embeddings
        for block in self.blocks:  # GPT-2: the MLP's residual write is scaled down with depth
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

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
    """Token-by-token generation: the memory's keys and values in a ring of tau slots, one step per token (the
    segment's step with window start = write slot = n mod tau after n tokens: the oldest slot is read, then
    overwritten by the new memory vector's key and value). Weights are read once, at the start."""

    @torch.no_grad()
    def __init__(self, model: Model, state: torch.Tensor | None = None, batch: int = 1):
        cfg = model.cfg
        device = model.pos.device
        self.model, self.steps = model, 0
        # the ring in the weights' dtype, given or empty (empty_state is fp32 whatever the weights)
        mem = (model.empty_state(batch, device) if state is None else state).to(model.kv.weight.dtype)
        if mem.shape != (batch, cfg.mem_len, cfg.d_model):
            raise ValueError(f"state must be (batch, mem_len, d_model) = {(batch, cfg.mem_len, cfg.d_model)}, "
                             f"got {tuple(mem.shape)}")
        self.ops = implementation(cfg.attention_impl, device)
        self.weights = model.segment_weights(model.mix(), model.compute_dtype(device))
        H, D, L, cdt = cfg.n_heads, cfg.d_head, cfg.n_layers, self.weights.cdt
        self.kv = segment.memory_keys_values(self.weights, mem.reshape(-1, cfg.d_model)).view(
            batch, cfg.mem_len, 2, H, D).permute(2, 0, 3, 1, 4).contiguous()
        self.xs = mem.new_empty(L + 1, batch, cfg.d_model)
        self.m = mem.new_empty(batch, cfg.d_model)
        self.hs = mem.new_empty(L, batch, cfg.d_model)
        self.qs, self.ys = (mem.new_empty(L, batch, H, D, dtype=cdt) for _ in range(2))
        self.fs = mem.new_empty(L, batch, cfg.mlp_ratio * cfg.d_model, dtype=cdt)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch,) -> logits (batch, vocab) of the next token."""
        self.xs[0] = self.model.embed(tokens)
        slot = self.steps % self.model.cfg.mem_len
        with torch.autocast(tokens.device.type, enabled=False):
            segment.step_forward(self.weights, self.ops, self.xs, self.m, self.kv, slot, slot, self.hs, self.qs,
                                 self.ys, None, self.fs)
        self.steps += 1
        return self.model.head(self.model.ln_f(self.xs[-1]))
