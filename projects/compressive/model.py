"""Transformer-XL and the Compressive Transformer (J. Rae, PhD thesis, chapter 6: Algorithms 5 and 6), pre-LayerNorm
as the GPT of projects/gpt, in plain PyTorch.

Every layer keeps a FIFO memory of its last n_m inputs (detached) and, for the Compressive Transformer, a second
FIFO of n_cm compressed memories: the memories pushed out of the first FIFO are compressed by a 1-D convolution
f_c (kernel = stride = c, no bias; max or mean pooling as options) instead of being discarded. Attention reads
[compressed memory; memory; segment] with Transformer-XL's relative positions (Dai et al. 2019, section 3.3).
f_c is trained only by the attention-reconstruction loss (Algorithm 6), returned as the auxiliary loss
"reconstruction"; the state carried from segment to segment is (memory, compressed memory) per layer.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from languini.transformer import GPT, MLP
from projects.compressive.configs import ModelConfig
from projects.compressive.ops.rel_attention.naive import memory_mask, relative_attention_naive

COMPRESSION = ("conv", "max", "mean")
ATTENTION_IMPL = ("auto", "naive", "triton", "flex")


def attention_impl(impl: str, on_gpu: bool) -> str:
    """auto: the Triton kernel on GPU, the reference on CPU (where FlexAttention has no backward)."""
    return ("triton" if on_gpu else "naive") if impl == "auto" else impl


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embeddings (Vaswani et al.) of shape (len(positions), dim): sin in even, cos in odd features."""
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[:, :dim]


class RelativeAttention(nn.Module):
    """Multi-head attention over [prefix; segment] with Transformer-XL relative positions (its own: the GPT's in
    languini/transformer.py has learned absolute positions and no prefix)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.d_head, self.impl = cfg.n_heads, cfg.d_head, cfg.attention_impl
        self.inner = cfg.n_heads * cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * self.inner)  # W_q, W_{k,E}, W_v
        self.pos = nn.Linear(cfg.d_model, self.inner, bias=False)  # W_{k,R}: projects the sinusoids R
        self.u = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head))  # content bias
        self.v = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head))  # position bias
        self.proj = nn.Linear(self.inner, cfg.d_model)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, inner) -> (B, heads, L, d_head)."""
        return t.view(t.shape[0], t.shape[1], self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, h: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """h: (B, T, d) the normalised segment; prefix: (B, P, d) the normalised [compressed memory; memory], P >= 0.

        score(i, j) = q_i.k_j  (A: content)  + q_i.W_{k,R} R_{i-j}  (B: content-dependent position)
                    + u.k_j    (C: content bias) + v.W_{k,R} R_{i-j} (D: global position bias),
        through ops/rel_attention: the reference (naive.py, the four terms one by one, moved to their keys by the
        relative shift), the Triton kernel (triton.py) or FlexAttention (flex.py), as `impl` says.
        """
        B, T, _ = h.shape
        S = prefix.shape[1] + T
        q = self.heads(F.linear(h, self.qkv.weight[:self.inner], self.qkv.bias[:self.inner]))
        k, v = F.linear(torch.cat([prefix, h], dim=1), self.qkv.weight[self.inner:],
                        self.qkv.bias[self.inner:]).split(self.inner, dim=-1)
        k, v = self.heads(k), self.heads(v)
        # W_{k,R} R_delta for the distances delta = 0 .. S-1, shared by the batch
        r = self.pos(sinusoids(torch.arange(S, device=h.device), self.pos.in_features).to(self.pos.weight.dtype))
        r = r.view(S, self.n_heads, self.d_head).transpose(0, 1)  # (heads, S, d_head)
        impl = attention_impl(self.impl, h.is_cuda)
        if impl == "naive":
            y = relative_attention_naive(q, k, v, r, self.u, self.v, self.d_head ** -0.5,
                                         memory_mask(T, S - T, h.device))
        elif impl == "triton":
            from projects.compressive.ops.rel_attention.triton import relative_attention_triton

            y = relative_attention_triton(q, k, v, r, self.u, self.v, self.d_head ** -0.5)
        else:
            from projects.compressive.ops.rel_attention.flex import relative_attention_flex

            y = relative_attention_flex(q, k, v, r, self.u, self.v, self.d_head ** -0.5)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))

    def core_flops(self, T: int, S: int) -> int:
        """FLOPs of the reference's attention core for T queries over S keys, as a profiler counts its einsums:
        the scores A and B (T x S dot products each), C and D (S each), the weighted values (T x S)."""
        return 3 * 2 * T * S * self.inner + 2 * 2 * S * self.inner

    def content_attention(self, h: torch.Tensor, memories: torch.Tensor) -> torch.Tensor:
        """Algorithm 6's attn(h, m): content-only attention of the normalised queries h (B, T, d) over the
        normalised memories (B, M, d), through detached copies of this layer's projections (no positions, no
        biases u, v, no output projection), so a loss on it moves nothing of the attention. (B, heads, T, d_head)."""
        w, b = self.qkv.weight.detach(), self.qkv.bias.detach()
        q = self.heads(F.linear(h, w[:self.inner], b[:self.inner]))
        k, v = F.linear(memories, w[self.inner:], b[self.inner:]).split(self.inner, dim=-1)
        weights = F.softmax(torch.einsum("bhid,bhjd->bhij", q, self.heads(k)) * self.d_head ** -0.5, dim=-1)
        return torch.einsum("bhij,bhjd->bhid", weights, self.heads(v))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), RelativeAttention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg.d_model, cfg.mlp_ratio)
        self.compression, self.rate = cfg.compression, cfg.compression_rate
        # f_c: n memories -> floor(n / c) compressed memories (a trailing n mod c are dropped, as the thesis's floor)
        self.compress = (nn.Conv1d(cfg.d_model, cfg.d_model, self.rate, stride=self.rate, bias=False)
                         if cfg.cmem_len and cfg.compression == "conv" else None)

    def forward(self, x: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """x: (B, T, d) the layer input; prefix: (B, P, d) the raw [compressed memory; memory], normalised here with
        the current weights like the segment."""
        x = x + self.attn(self.ln1(x), self.ln1(prefix))
        return x + self.mlp(self.ln2(x))

    def compress_memories(self, old: torch.Tensor) -> torch.Tensor:
        """f_c: (B, n, d) evicted memories -> (B, n // c, d) compressed memories."""
        over_time = old.transpose(1, 2)
        if self.compress is not None:
            return self.compress(over_time).transpose(1, 2)
        pool = F.max_pool1d if self.compression == "max" else F.avg_pool1d
        return pool(over_time, self.rate, self.rate).transpose(1, 2)

    def reconstruction_loss(self, h: torch.Tensor, old: torch.Tensor, compressed: torch.Tensor) -> torch.Tensor:
        """Algorithm 6 for this layer: ||attn(h, old) - attn(h, f_c(old))||^2 (mean over elements), with
        stop-gradients on the segment's inputs h, the old memories and the attention's weights (the LayerNorm's
        included), so that only f_c, through `compressed`, receives its gradient."""
        w, b = self.ln1.weight.detach(), self.ln1.bias.detach()

        def norm(t):
            return F.layer_norm(t, t.shape[-1:], w, b, self.ln1.eps)

        queries = norm(h.detach())
        target = self.attn.content_attention(queries, norm(old.detach()))
        return F.mse_loss(self.attn.content_attention(queries, norm(compressed)), target)


class Model(GPT):
    stateful = True  # carries (memory, compressed memory) per layer from segment to segment
    weights_used_outside_blocks = True  # update_memories compresses with a block's weights (--fsdp: one unit)
    # checkpoints store the memories in bf16 (half of ~10 GB at small, batch 256); a resume is then not bit-exact
    checkpoint_state_dtype = torch.bfloat16

    def __init__(self, cfg: ModelConfig):
        if cfg.mem_len < 1 or cfg.cmem_len < 0:
            raise ValueError(f"mem_len must be at least 1 and cmem_len at least 0, got {cfg.mem_len}, {cfg.cmem_len}")
        if cfg.cmem_len and cfg.compression_rate < 1:
            raise ValueError(f"compression_rate must be at least 1, got {cfg.compression_rate}")
        if cfg.compression not in COMPRESSION:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSION)}, not {cfg.compression!r}")
        if cfg.attention_impl not in ATTENTION_IMPL:
            raise ValueError(f"attention_impl must be one of {', '.join(ATTENTION_IMPL)}, not {cfg.attention_impl!r}")
        super().__init__(cfg, lambda i: Block(cfg), positions=False)  # relative positions, in the attention
        self.reconstruction_record = None  # (2, layers): summed losses and compressions of eval forwards, once reset

    def empty_state(self, x: torch.Tensor) -> list:
        empty = torch.zeros(x.shape[0], 0, self.cfg.d_model, device=x.device)
        return [(empty, empty) for _ in self.blocks]

    def update_memories(self, block: Block, h: torch.Tensor, mem: torch.Tensor, cmem: torch.Tensor):
        """Algorithm 5, lines 8-11: push the segment's layer inputs h into the memory; the oldest that no longer fit
        in n_m are compressed into the compressed memory (or dropped, without one), which keeps its newest n_cm.
        Returns (memory, compressed memory, reconstruction loss or None), the memories detached."""
        pushed = torch.cat([mem, h.detach()], dim=1)
        evicted = max(0, pushed.shape[1] - self.cfg.mem_len)
        old, mem = pushed[:, :evicted], pushed[:, evicted:].clone()  # a compact copy: a view would keep `pushed`
        loss = None
        if self.cfg.cmem_len and evicted >= self.cfg.compression_rate:
            compressed = block.compress_memories(old)
            loss = block.reconstruction_loss(h, old, compressed)
            cmem = torch.cat([cmem, compressed.detach()], dim=1)[:, -self.cfg.cmem_len:].clone()
        return mem, cmem, loss

    def forward(self, x, state=None):
        """x: (B, T) tokens; state: None (empty memories) or, per layer, (memory (B, <= n_m, d), compressed memory
        (B, <= n_cm, d)). Returns logits (B, T, vocab), the next state, and {"reconstruction": the sum over layers
        of the attention-reconstruction losses} for a Compressive Transformer ({} for a Transformer-XL)."""
        state = self.empty_state(x) if state is None else state
        h = self.embed(x)  # positions enter only through the attention
        new_state, losses = [], []
        for layer, (block, (mem, cmem)) in enumerate(zip(self.blocks, state, strict=True)):
            out = block(h, torch.cat([cmem, mem], dim=1))
            mem, cmem, loss = self.update_memories(block, h, mem, cmem)
            new_state.append((mem, cmem))
            if loss is not None:
                losses.append(loss)
                if not self.training and self.reconstruction_record is not None:
                    self.record_reconstruction(layer, loss)
            h = out
        aux = {}
        if self.cfg.cmem_len:
            if losses:
                aux["reconstruction"] = torch.stack(losses).sum()
            else:  # nothing compressed yet (a stream's first segments): an exact zero that still reaches every f_c,
                # as data parallelism expects a gradient for every parameter in every step
                aux["reconstruction"] = sum((block.compress.weight.sum() for block in self.blocks
                                             if block.compress is not None), torch.zeros((), device=x.device)) * 0.0
        return self.head(self.ln_f(h)), new_state, aux

    def record_reconstruction(self, layer: int, loss: torch.Tensor) -> None:
        self.reconstruction_record = self.reconstruction_record.to(loss.device)
        self.reconstruction_record[0, layer] += loss.detach().double()
        self.reconstruction_record[1, layer] += 1

    def reset_memory_stats(self) -> None:
        """Start recording the attention-reconstruction loss of every layer in eval-mode forwards."""
        self.reconstruction_record = torch.zeros(2, self.cfg.n_layers, dtype=torch.float64)

    def memory_stats(self) -> dict:
        """Per layer, the mean attention-reconstruction loss of the compressions since reset_memory_stats (the
        thesis's Figure 6.2; every layer compresses at the same segments, so the list is empty until the first
        compression), and the number of compressions; over all processes when distributed (every process calls it)."""
        if self.reconstruction_record is None:
            raise ValueError("memory_stats() needs reset_memory_stats() and a forward pass first.")
        totals = self.reconstruction_record.to(self.head.weight.device, copy=True)  # NCCL reduces device tensors
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(totals)
        sums, counts = totals.cpu()
        return {"compressions": int(counts.sum()),
                "reconstruction_loss_per_layer": (sums / counts).tolist() if counts.min() > 0 else []}

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs of one segment of seq_len tokens with full memories that a profile without state misses,
        per layer: the key/value and relative-position projections of the n_m + n_cm memories and the attention
        core's growth from seq_len to seq_len + n_m + n_cm keys (RelativeAttention.core_flops), plus, for a
        Compressive Transformer, f_c on the seq_len memories evicted per segment and Algorithm 6's two content
        attentions over them. On the Triton and FlexAttention paths also what the profiler cannot see inside the
        kernel, counted as the reference's einsums, so that every path reports the same matmul FLOPs."""
        cfg, inner, attn = self.cfg, self.cfg.n_heads * self.cfg.d_head, self.blocks[0].attn
        d, T, M = cfg.d_model, seq_len, cfg.mem_len + cfg.cmem_len
        memory = 2 * M * d * 2 * inner + 2 * M * d * inner + attn.core_flops(T, T + M) - attn.core_flops(T, T)
        compression = 0
        if cfg.cmem_len:
            old, new = T, T // cfg.compression_rate
            compression = (2 * old * d * d * (cfg.compression == "conv")  # a convolution output: c x d x d weights
                           + 2 * 2 * T * d * inner  # queries, once per content attention
                           + 2 * (old + new) * d * 2 * inner  # keys and values of old and compressed memories
                           + 2 * 2 * T * (old + new) * inner)  # scores and weighted values
        impl = attention_impl(cfg.attention_impl, self.head.weight.is_cuda)
        # the profiler sees flex.py's position einsum (T x T dot products), nothing of the Triton kernel
        unseen = {"naive": 0, "triton": attn.core_flops(T, T), "flex": attn.core_flops(T, T) - 2 * T * T * inner}[impl]
        return cfg.n_layers * (memory + compression + unseen)
