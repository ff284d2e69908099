"""The memory cores: an LSTM controller with an external memory (thesis Figure 3.1), in five kinds.

- "sam": Sparse Access Memory (3.2): each head reads the K words nearest its query (exact scan or a FAISS index)
  with weights renormalised over them (3.1), and writes to the words it read at the previous step and to a least
  recently used word, erased first (3.2-3.3); usage is SAM's U^(2) (usage.py: last-access stamps on the device
  with exact search, the thesis's ring on the CPU with FAISS); the memory is modified in place and reverted by
  the backward (memory.py).
- "sdnc": the Sparse DNC (3.5): SAM plus sparse temporal links (links.py, K_L entries per row) and a read that
  mixes, per head, the content weights with the weights one link forwards and backwards from its previous read
  (a softmax over three read modes), kept to the K largest and renormalised.
- "dam": Dense Access Memory, SAM made dense: every word is read (softmax over all N) and written; usage is the
  discounted sum U^(1) (3.2.3). An ordinary autograd graph, so training stores the memory at every step.
- "dnc": DAM plus the DNC's dense N x N link matrix (eq. 3.8-3.14) and the same three read modes.
- "lstm": the controller alone.

At every step t the controller (one LSTM layer) reads [x_t, r_{t-1}] and emits, per head, a query q, a read
strength beta (1 + softplus), a write word w, the write gate alpha and the interpolation gate gamma (sigmoids),
and for the DNC kinds three read-mode logits. The memory is written, then read; y_t = Linear([h_t, r_t]).

The state (a dict of tensors, so a trainer can carry and checkpoint it) holds the controller's h and c, the words
read, the read weights (sparse kinds: their word indices too), the memory, the usage and the links. The FAISS
index, when used, is kept beside the state and rebuilt from the memory when missing.

With exact search a sparse step runs on the memory's device from end to end: no tensor is read on the host inside
the time loop (tests/sam/test_device.py), so a GPU is never made to wait for the CPU between steps. The FAISS
index lives on the CPU, and its path reads the written words and the queries there at every step.
"""
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F

from projects.sam import links, usage
from projects.sam.graphs import CapturedLoop
from projects.sam.index import INDEXES, FaissIndex, search
from projects.sam.memory import ContentWeights, GradientBuffers, ReadWords, SparseRead, SparseWrite, Tape
from projects.sam.ops.topk import EMPTY

KINDS = ("sam", "sdnc", "dam", "dnc", "lstm")
SPARSE, LINKED = ("sam", "sdnc"), ("sdnc", "dnc")
_index_ids = itertools.count(1)
CAPTURED_SHAPES = 2  # training shapes whose CUDA graphs a core keeps (cfg.cuda_graph)


def check_memory_config(cfg) -> None:
    if cfg.kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {cfg.kind!r}")
    if cfg.index not in INDEXES:
        raise ValueError(f"index must be one of {', '.join(INDEXES)}, not {cfg.index!r}")
    if cfg.kind != "lstm":
        if min(cfg.heads, cfg.word_size, cfg.k, cfg.k_links) < 1:
            raise ValueError("heads, word_size, k and k_links must be positive")
        if cfg.words < max(cfg.k, cfg.heads) + 1:
            raise ValueError(f"a memory of {cfg.words} words is too small for k={cfg.k} and {cfg.heads} heads")
    if cfg.initial_strength is not None and cfg.initial_strength <= 1:
        raise ValueError(f"initial_strength must exceed 1 (beta = 1 + softplus), not {cfg.initial_strength}")
    if not 0 <= cfg.delta < 1 or not 0 <= cfg.usage_discount <= 1:
        raise ValueError("delta must be in [0, 1) and usage_discount in [0, 1]")


def dense_content_weights(query: torch.Tensor, strength: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """Softmax over all N words of strength * cosine (eq. 2.4), all-zero words at EMPTY: (B, H, N)."""
    q = query / query.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    norms = memory.norm(dim=-1)[:, None, :]
    written = norms > 0
    cosine = torch.where(written, torch.einsum("bhw,bnw->bhn", q, memory) / torch.where(written, norms, 1.0),
                         torch.full_like(written, EMPTY, dtype=q.dtype))
    return torch.softmax(strength[..., None] * cosine, dim=-1)


def select_read(candidates: torch.Tensor, weights: torch.Tensor, k: int, none: int):
    """The k candidate words (B, H, C) of largest total weight (repeats summed; word `none` is no candidate),
    their weights renormalised to sum to 1: (indices (B, H, k), weights (B, H, k)), differentiable in weights."""
    valid = candidates != none
    same = (candidates[..., :, None] == candidates[..., None, :]) & valid[..., None]
    totals = (same.to(weights.dtype) * weights[..., None, :]).sum(-1)
    earlier = torch.ones(same.shape[-1], same.shape[-1], dtype=torch.bool, device=same.device).tril(-1)
    first = valid & ~(same & earlier).any(-1)
    positions = torch.where(first, totals.detach(), float("-inf")).topk(k, dim=-1).indices
    chosen = totals.gather(-1, positions)
    return candidates.gather(-1, positions), chosen / chosen.sum(-1, keepdim=True).clamp_min(1e-12)


class Controller(nn.Module):
    """A one-layer LSTM over [x_t, r_{t-1}]; the input's share of the gates is computed for all steps at once."""

    def __init__(self, input_size: int, read_size: int, hidden: int):
        super().__init__()
        self.input = nn.Linear(input_size, 4 * hidden)
        self.recurrent = nn.Linear(read_size + hidden, 4 * hidden, bias=False)
        with torch.no_grad():
            self.input.bias[hidden:2 * hidden].fill_(1.0)  # forget gates open at first

    def step(self, input_gates, read, h, c):
        gates = input_gates + self.recurrent(torch.cat([read, h], -1))
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class MemoryCore(nn.Module):
    """x (B, T, input_size), state -> (y (B, T, output_size), state). cfg: any object with the fields of
    configs.MemoryConfig (kind, hidden, heads, word_size, words, k, k_links, delta, usage_discount, index,
    nlist, nprobe, topk_impl, initial_strength)."""

    def __init__(self, cfg, input_size: int, output_size: int):
        super().__init__()
        check_memory_config(cfg)
        self.cfg = cfg
        self.kind = cfg.kind
        self.read_size = 0 if cfg.kind == "lstm" else cfg.heads * cfg.word_size
        self.controller = Controller(input_size, self.read_size, cfg.hidden)
        if self.read_size:
            self.per_head = 2 * cfg.word_size + 3 + (3 if cfg.kind in LINKED else 0)
            self.interface = nn.Linear(cfg.hidden, cfg.heads * self.per_head)
            if cfg.initial_strength is not None:  # beta = 1 + softplus(bias): the bias that gives it
                with torch.no_grad():
                    bias = self.interface.bias.view(cfg.heads, self.per_head)
                    bias[:, 2 * cfg.word_size] = float(torch.tensor(cfg.initial_strength - 1.0).expm1().log())
        self.output = nn.Linear(cfg.hidden + self.read_size, output_size)
        self.gradient_buffers = GradientBuffers()
        self.faiss_indexes = {}  # index id -> FaissIndex, for the states this core has seen
        self.age_bounds = None  # read statistics (sparse kinds, evaluation): the bounds of the age buckets
        self.read_weight_by_age = None  # summed read weights per bucket (the last: words never written)

    # ------------------------------------------------------------------ state

    def initial_state(self, batch: int, device) -> dict:
        cfg = self.cfg
        state = {"h": torch.zeros(batch, cfg.hidden, device=device), "c": torch.zeros(batch, cfg.hidden, device=device),
                 "read": torch.zeros(batch, self.read_size, device=device)}
        if self.kind == "lstm":
            return state
        H, N, W, K = cfg.heads, cfg.words, cfg.word_size, cfg.k
        state["memory"] = torch.zeros(batch, N, W, device=device)
        if self.kind in SPARSE:
            # before the first read: K words per head with weight 0, so the first write adds nothing to them
            state["read_words"] = torch.arange(K, device=device).expand(batch, H, K).clone()
            state["read_weights"] = torch.zeros(batch, H, K, device=device)
            if cfg.index == "faiss":
                state["ring"] = usage.new_ring(batch, N)
            else:
                state["last_access"] = usage.new_last_access(batch, N, device)
            # for the read statistics: the step count of each stream, and the step each word was last written
            state["clock"] = torch.zeros(batch, dtype=torch.int64, device=device)
            state["written_at"] = torch.full((batch, N), -1, dtype=torch.int64, device=device)
            if self.kind == "sdnc":
                state.update(links.empty_links(batch, N, cfg.k_links, device))
            if cfg.index == "faiss":
                state["index_key"] = torch.tensor([next(_index_ids), 0])
        else:
            state["read_weights"] = torch.zeros(batch, H, N, device=device)
            state["usage"] = torch.zeros(batch, N, device=device)
            if self.kind == "dnc":
                state["link"] = torch.zeros(batch, N, N, device=device)
                state["precedence"] = torch.zeros(batch, N, device=device)
        return state

    def faiss_index(self, state: dict) -> FaissIndex:
        """The FAISS index in sync with this state's memory: kept from earlier calls, or rebuilt (after a resume)."""
        key, writes = (int(v) for v in state["index_key"])
        index = self.faiss_indexes.get(key)
        if index is None or index.writes != writes:
            index = FaissIndex(state["memory"], self.cfg.nlist or None, self.cfg.nprobe)
            index.writes = writes
            self.faiss_indexes[key] = index
            while len(self.faiss_indexes) > 8:  # states this core no longer sees
                self.faiss_indexes.pop(next(iter(self.faiss_indexes)))
        return index

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor, state: dict | None = None):
        B = x.shape[0]
        # a segment is the span of backpropagation: the memory's rollback (memory.py) cannot reach a previous one
        state = self.initial_state(B, x.device) if state is None else {k: v.detach() for k, v in state.items()}
        if self.kind != "lstm" and state["memory"].shape[0] != B:
            raise ValueError(f"the state holds {state['memory'].shape[0]} streams, the input {B}")
        if self.kind in SPARSE:
            self.convert_usage(state)
            if self.age_bounds is not None:  # on the device once, not at every step
                self.age_bounds = self.age_bounds.to(x.device)
                self.read_weight_by_age = self.read_weight_by_age.to(x.device)
        input_gates = self.controller.input(x)  # one backward node for all steps, not one per step
        recording = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        captured = self.captured_loop(input_gates, state) if recording else None
        if captured is not None:
            hs, reads, token = captured(input_gates, state)
        else:
            hs, reads, token = self.time_loop(input_gates, state, recording)
        y = self.output(torch.cat([hs, reads], -1))
        return (y if token is None else y + token), state

    def time_loop(self, input_gates: torch.Tensor, state: dict, recording: bool):
        """The T steps of the controller and the memory over input_gates (B, T, 4 hidden), the controller's input
        share of the gates; updates state (h, c, read, and the memory's tensors). Returns the controller's outputs
        (B, T, hidden), the reads (B, T, heads * word_size) and, for the sparse kinds, the token that the loss must
        reach (memory.py; else None). recording: keep what the backward needs."""
        step = {"sam": self._sparse_step, "sdnc": self._sparse_step, "dam": self._dense_step,
                "dnc": self._dense_step, "lstm": None}[self.kind]
        context = self.sparse_context(state, recording) if self.kind in SPARSE else {}
        h, c, read = state["h"], state["c"], state["read"]
        hs, reads = [], []
        for gates in input_gates.unbind(1):
            h, c = self.controller.step(gates, read, h, c)
            if step is not None:
                read = step(self.interface(h).float(), state, context)
            hs.append(h)
            reads.append(read)
        state.update(h=h, c=c, read=read)
        token = None
        if self.kind in SPARSE:
            # a zero: the loss reaches every step's backward (memory.py). The tape forgets it: every step's ctx
            # holds the tape, so a token kept there would close a cycle (graph -> ctx -> tape -> token -> graph)
            # that Python's collector cannot free, and each training step's graph would stay in memory.
            token, context["tape"].token = context["tape"].token, None
        return torch.stack(hs, 1), torch.stack(reads, 1), token

    def captured_loop(self, input_gates: torch.Tensor, state: dict):
        """The training time loop of this shape replayed from CUDA graphs (graphs.CapturedLoop), or None: off by
        config, off the GPU, with FAISS (its index is on the CPU), outside training, and at a shape's first call,
        which runs eagerly (kernels compile; a FLOP profiler counts that call's operations once)."""
        cfg = self.cfg
        if not (cfg.cuda_graph and input_gates.is_cuda and self.kind in SPARSE and cfg.index == "exact"
                and self.training):
            return None
        key = (tuple(input_gates.shape), input_gates.dtype, torch.is_autocast_enabled("cuda"),
               torch.get_autocast_dtype("cuda"), tuple((k, v.dtype, tuple(v.shape)) for k, v in state.items()))
        loops = self.__dict__.setdefault("_captured", {})  # not a module attribute: no state_dict, no .to()
        if key not in loops:
            loops[key] = None
            while len(loops) > CAPTURED_SHAPES:  # the oldest shape's graphs (and their memory) go
                loops.pop(next(iter(loops)))
            return None
        if loops[key] is None:
            loops[key] = CapturedLoop(self, input_gates, state)
        return loops[key]

    def convert_usage(self, state: dict) -> None:
        """The usage in the form this core's index uses (usage.py), in place: a state written with the other index
        (or before the exact path kept its usage on the device) is converted once, before the time loop."""
        if self.cfg.index == "faiss":
            if "last_access" in state:
                state["ring"] = usage.ring_from_last_access(state.pop("last_access"))
            if state["ring"].device.type != "cpu":
                state["ring"] = state["ring"].cpu()  # a checkpoint loaded onto a GPU
        elif "ring" in state:
            state["last_access"] = usage.last_access_from_ring(state.pop("ring"), state["memory"].device)

    def sparse_context(self, state: dict, recording: bool) -> dict:
        """What the sparse steps of one forward share: the tape (memory.py), the FAISS index and its usage ring
        (None with exact search, whose usage is the state's last_access) and the row offsets of the streams."""
        memory = state["memory"]
        faiss = self.faiss_index(state) if self.cfg.index == "faiss" else None
        return {"tape": Tape(memory, self.gradient_buffers, recording), "faiss": faiss,
                "ring": usage.Ring(state["ring"]) if faiss is not None else None,
                # word index + offset = the row of the (B * N, W) view of the memory
                "offsets": (torch.arange(memory.shape[0], device=memory.device) * self.cfg.words).view(-1, 1, 1)}

    def _heads(self, interface: torch.Tensor):
        B, H, W = interface.shape[0], self.cfg.heads, self.cfg.word_size
        parts = interface.view(B, H, self.per_head)
        query, word = parts[..., :W], parts[..., W:2 * W]
        strength = 1 + F.softplus(parts[..., 2 * W])
        alpha, gamma = torch.sigmoid(parts[..., 2 * W + 1]), torch.sigmoid(parts[..., 2 * W + 2])
        modes = torch.softmax(parts[..., 2 * W + 3:], -1) if self.kind in LINKED else None
        return query, strength, word, alpha, gamma, modes

    def _sparse_step(self, interface, state, context):
        cfg, tape, faiss, offsets = self.cfg, context["tape"], context["faiss"], context["offsets"]
        N, K = cfg.words, cfg.k
        query, strength, word, alpha, gamma, modes = self._heads(interface)
        memory, ring = state["memory"], context["ring"]
        # write (3.3): the previously read words and each head's least recently used word, erased first
        if ring is None:
            lru = usage.least_recent(state["last_access"], cfg.heads)  # (B, H)
        else:
            lru = torch.tensor(ring.least_recent(cfg.heads), device=memory.device)
        written = torch.cat([state["read_words"], lru[..., None]], -1)  # (B, H, K + 1)
        coeffs = alpha[..., None] * torch.cat([gamma[..., None] * state["read_weights"], (1 - gamma)[..., None]], -1)
        tape.token = SparseWrite.apply(tape.token, coeffs, word, tape, written + offsets, (lru + offsets[:, 0]).view(-1))
        if faiss is not None:
            faiss.update(memory, written.flatten(1).tolist())
            faiss.writes += 1
            state["index_key"][1] += 1
        if self.kind == "sdnc":  # the links see the heads' mean write weights, which sum to at most 1
            links.update_links(state, written.flatten(1), coeffs.flatten(1) / cfg.heads)
        # read (3.1): the K nearest words' content weights, for the SDNC mixed with the links' (3.19, 3.20)
        nearest = search(query, memory, K, faiss, cfg.topk_impl)
        if self.kind == "sam":
            read, read_weights, tape.token = SparseRead.apply(tape.token, query, strength, tape, nearest + offsets)
            read_words = nearest
        else:
            content, tape.token = ContentWeights.apply(tape.token, query, strength, tape, nearest + offsets)
            forward_words, forward_weights = links.follow(state, "forward", state["read_words"], state["read_weights"])
            backward_words, backward_weights = links.follow(state, "backward", state["read_words"],
                                                            state["read_weights"])
            candidates = torch.cat([nearest, forward_words, backward_words], -1)
            mixed = torch.cat([modes[..., :1] * content, modes[..., 1:2] * forward_weights,
                               modes[..., 2:] * backward_weights], -1)
            read_words, read_weights = select_read(candidates, mixed, K, N)
            read, tape.token = ReadWords.apply(tape.token, read_weights, tape, read_words + offsets)
        entries = torch.cat([written.flatten(1), read_words.flatten(1)], 1)
        entry_weights = torch.cat([coeffs.flatten(1), read_weights.flatten(1)], 1)
        if ring is None:
            usage.touch(state["last_access"], entries, entry_weights, cfg.delta, state["clock"])
        else:
            ring.touch(usage.accessed_words(entries, entry_weights, cfg.delta))
        clock = state["clock"][:, None]
        state["written_at"].scatter_reduce_(1, written.flatten(1), torch.where(coeffs.flatten(1) > cfg.delta, clock, -1),
                                            reduce="amax")
        if self.read_weight_by_age is not None and not self.training:
            self.record_read_ages(read_words, read_weights, state)
        state["clock"] += 1
        state["read_words"], state["read_weights"] = read_words, read_weights
        return read.flatten(1)

    @torch.no_grad()
    def record_read_ages(self, read_words, read_weights, state) -> None:
        """Add the step's read weights to the buckets of the age of the words read: steps since their last write
        (with a weight above delta), bucketed by age_bounds; never-written words in the last bucket."""
        written_at = state["written_at"].gather(1, read_words.flatten(1)).view_as(read_words)
        age = state["clock"].view(-1, 1, 1) - written_at
        bucket = torch.bucketize(age, self.age_bounds, right=True)
        bucket = torch.where(written_at < 0, len(self.age_bounds) + 1, bucket)
        self.read_weight_by_age.index_add_(0, bucket.flatten(), read_weights.flatten().double())

    def _dense_step(self, interface, state, context):
        cfg = self.cfg
        query, strength, word, alpha, gamma, modes = self._heads(interface)
        memory, N = state["memory"], cfg.words
        # write: the previous read weights and the least used words (U^(1)), erased first
        lru = F.one_hot(state["usage"].topk(cfg.heads, dim=-1, largest=False).indices, N).to(memory.dtype)
        write_weights = alpha[..., None] * (gamma[..., None] * state["read_weights"] + (1 - gamma)[..., None] * lru)
        erase = lru.sum(1).clamp(max=1.0)
        memory = memory * (1 - erase)[..., None] + torch.einsum("bhn,bhw->bnw", write_weights, word)
        read_weights = dense_content_weights(query, strength, memory)
        if self.kind == "dnc":
            state["link"], state["precedence"] = links.dense_link_update(state["link"], state["precedence"],
                                                                          write_weights.mean(1))
            read_weights = (modes[..., :1] * read_weights
                            + modes[..., 1:2] * links.dense_follow(state["link"], "forward", state["read_weights"])
                            + modes[..., 2:] * links.dense_follow(state["link"], "backward", state["read_weights"]))
        state["usage"] = usage.discounted_usage(state["usage"], cfg.usage_discount, write_weights, read_weights)
        state["memory"], state["read_weights"] = memory, read_weights
        return torch.einsum("bhn,bnw->bhw", read_weights, memory).flatten(1)
