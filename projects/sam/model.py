"""SAM as a language model (thesis chapter 3, used "non-episodically", 3.2.4): token embeddings -> a memory core
(core.py: an LSTM controller with a sparse memory of N words per stream) -> LayerNorm -> vocabulary.

The state carried from one segment of a stream to the next is the core's: the controller's h and c, the last
read, the memory itself (N x W per stream, never reset between batches) and its usage ring, so what a stream
wrote long ago can still be read; backpropagation spans one segment (seq_len tokens). The memory is modified in
place and rolled back by the backward (memory.py), so training over a segment costs O(seq_len) memory, not
O(seq_len x N).
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from projects.sam.configs import ModelConfig
from projects.sam.core import SPARSE, MemoryCore


class Model(nn.Module):
    stateful = True  # the memory and the controller's state are carried across segments (languini/model_contract.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.core = MemoryCore(cfg, cfg.d_model, cfg.d_model)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, x, state=None):
        """x (B, T) tokens; state: None (an empty memory) or what the previous call returned for these streams.
        Returns logits (B, T, vocab) and the next state (a dict of tensors; core.MemoryCore)."""
        y, state = self.core(self.tok_emb(x), state)
        return self.head(self.ln_f(y)), state

    def age_buckets(self) -> list[str]:
        """Names of the read-age buckets: within one segment, up to 8 segments back, older, never written."""
        T = self.cfg.seq_len
        return [f"0-{T - 1} steps", f"{T}-{8 * T - 1} steps", f">= {8 * T} steps", "never written"]

    def reset_memory_stats(self) -> None:
        """Start recording how old the words are that evaluation forwards read (SAM and the Sparse DNC)."""
        if self.cfg.kind in SPARSE:
            T = self.cfg.seq_len
            self.core.age_bounds = torch.tensor([0, T, 8 * T])
            self.core.read_weight_by_age = torch.zeros(len(self.age_buckets()) + 1, dtype=torch.float64)

    def memory_stats(self) -> dict:
        """The share of the read weight on words last written 0 to seq_len - 1 steps before (within a segment's
        reach of backpropagation), up to 8 segments before, longer ago, or never, since reset_memory_stats; over
        all processes when distributed (every process calls it)."""
        if self.cfg.kind not in SPARSE:
            return {}
        if self.core.read_weight_by_age is None:
            raise ValueError("memory_stats() needs reset_memory_stats() and a forward pass first.")
        totals = self.core.read_weight_by_age.to(self.head.weight.device, copy=True)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(totals)
        totals = totals.cpu()[1:]  # bucket 0 would be a negative age
        shares = (totals / totals.sum()).tolist() if totals.sum() > 0 else [0.0] * len(totals)
        return {"read_weight_by_age": dict(zip(self.age_buckets(), shares)), "reads": float(totals.sum())}

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs per sequence at batch 1 of the memory access, which the profiler does not see (index
        lookups, in-place row updates, the search): per token and head, the search (exact: a dot product and a
        norm with each of N words; FAISS: the nlist centroids and nprobe lists of about N / nlist words), the K
        content weights and the read (K words), the write (K + 1 words)."""
        cfg = self.cfg
        if cfg.kind == "lstm":
            return 0
        W, N, K = cfg.word_size, cfg.words, cfg.k
        if cfg.kind in SPARSE and cfg.index == "faiss":
            nlist = cfg.nlist or max(1, round(math.sqrt(N)))
            search = 2 * W * (nlist + min(cfg.nprobe, nlist) * math.ceil(N / nlist))
            access = 4 * K * W + 2 * K * W + 2 * (K + 1) * W
        elif cfg.kind in SPARSE:
            search, access = 4 * N * W, 4 * K * W + 2 * K * W + 2 * (K + 1) * W
        else:  # dense: the einsums are seen; the norms of every word and the elementwise write are not
            search, access = 2 * N * W, 3 * N * W
        return seq_len * cfg.heads * (search + access)
