"""The Neural Bloom Filter (Rae, thesis Algorithm 2) and the neural baselines of 5.6: an LSTM that reads the set
in sequence and a Memory Network with one slot per element.

Every model has the same two calls, batched over B sets:
    state = model.write(x_set)            x_set (B, n, *input) -> the state that stands for the set
    logits = model.read(state, x_query)   x_query (B, t, *input) -> (B, t) familiarity logits
and `state_floats(n)`, the number of floats of that state for a set of n elements (the space of 5.5 is
32 x that, in bits). Inputs are padded UTF-8 bytes (uint8, length max_len) or float vectors.
"""
import torch
from torch import nn
from torch.nn import functional as F

from projects.neural_bloom.configs import EncoderConfig, LSTMConfig, MemNetConfig, NBFConfig

BITS_PER_FLOAT = 32  # states are counted as 32-bit floats, as the thesis does


class ByteCNN(nn.Module):
    """f_enc for strings: each byte as a learned embedding plus its value / 255 (an ordinal channel, so that
    alphabetical order is a linear function of the input from the start), two convolutions over positions,
    flattened (positions kept), linear."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.embed = nn.Embedding(256, cfg.byte_dim - 1)
        nn.init.normal_(self.embed.weight, std=0.1)  # small, so the ordinal channel is not drowned at the start
        self.conv1 = nn.Conv1d(cfg.byte_dim, cfg.channels, 3, padding=1)
        self.conv2 = nn.Conv1d(cfg.channels, cfg.channels, 3, padding=1)
        self.out = nn.Linear(cfg.channels * cfg.max_len, cfg.z_dim)

    def forward(self, x):  # x (..., max_len) uint8
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        h = torch.cat([self.embed(x.long()), x.unsqueeze(-1) / 255.0], dim=-1).transpose(1, 2)  # (N, byte_dim, L)
        h = F.leaky_relu(self.conv1(h))
        h = F.leaky_relu(self.conv2(h)) + h
        return F.leaky_relu(self.out(h.flatten(1))).reshape(*lead, -1)


class VectorMLP(nn.Module):
    """f_enc for vectors (the thesis uses a CNN for MNIST; a 2-layer MLP suffices for 64-dim vectors)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(cfg.input_dim, cfg.z_dim), nn.LeakyReLU(),
                                 nn.Linear(cfg.z_dim, cfg.z_dim), nn.LeakyReLU())

    def forward(self, x):
        return self.net(x.float())


def encoder(cfg: EncoderConfig) -> nn.Module:
    return ByteCNN(cfg) if cfg.kind == "bytes" else VectorMLP(cfg)


def mlp_ln(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    """f_q and f_w: one hidden layer followed by layer normalisation (thesis 5.3). The norm is on the hidden layer:
    on a write word of 2 floats it would leave only its sign ((x - mean) / std is +-1 in each)."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.LayerNorm(hidden), nn.LeakyReLU(), nn.Linear(hidden, outputs))


class ResidualMLP(nn.Module):
    """f_out: a 3-layer MLP with residual connections to one logit."""

    def __init__(self, inputs: int, hidden: int):
        super().__init__()
        self.inp = nn.Linear(inputs, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h = F.leaky_relu(self.inp(x))
        h = F.leaky_relu(self.mid(h)) + h
        return self.out(h).squeeze(-1)


class NeuralBloomFilter(nn.Module):
    """Algorithm 2. The memory M (B, m, d) of a set is the sum of w a^T over its elements: order-invariant, written
    in parallel, and trained without backpropagation through time."""

    def __init__(self, cfg: NBFConfig, enc: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.f_enc = encoder(enc)
        self.f_q = mlp_ln(enc.z_dim, cfg.hidden, cfg.query_dim)
        self.f_w = mlp_ln(enc.z_dim, cfg.hidden, cfg.word_size)
        self.A = nn.Parameter(torch.randn(cfg.query_dim, cfg.memory_slots))  # q is layer-normed: peaked addresses
        self.f_out = ResidualMLP(cfg.memory_slots * cfg.word_size + cfg.word_size + enc.z_dim, cfg.hidden)

    def controller(self, x):
        """(a, w, z): address (..., m), write word (..., d), embedding (..., z_dim)."""
        z = self.f_enc(x)
        a = torch.softmax(self.f_q(z) @ self.A, dim=-1)
        k = self.cfg.address_top_k
        if k:  # sigma_k: the k largest weights stay, the rest are zero (thesis Algorithm 4)
            top = a.topk(k, dim=-1)
            a = torch.zeros_like(a).scatter(-1, top.indices, top.values)
        return a, self.cfg.write_scale * self.f_w(z), z

    def write(self, x_set):
        """M = sum_i a_i w_i^T over the set (B, n, ...) -> (B, m, d)."""
        a, w, _ = self.controller(x_set)
        return torch.einsum("bnm,bnd->bmd", a, w)

    def read(self, memory, x_query):
        """o = f_out([flatten(M * a), w, z]) for each query (B, t, ...) -> (B, t) logits."""
        a, w, z = self.controller(x_query)
        r = (a.unsqueeze(-1) * memory.unsqueeze(1)).flatten(2)  # (B, t, m d): slot j read as a_j M_j
        return self.f_out(torch.cat([r, w, z], dim=-1))

    def state_floats(self, n: int) -> int:
        return self.cfg.memory_slots * self.cfg.word_size


class SequentialLSTM(nn.Module):
    """The LSTM baseline: the final (h, c) after reading the set's embeddings in order (trained through time); a
    query is classified by an MLP of [h, c, z]."""

    def __init__(self, cfg: LSTMConfig, enc: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.f_enc = encoder(enc)
        self.lstm = nn.LSTM(enc.z_dim, cfg.hidden_size, batch_first=True)
        self.f_out = ResidualMLP(2 * cfg.hidden_size + enc.z_dim, cfg.query_hidden)

    def write(self, x_set):
        _, (h, c) = self.lstm(self.f_enc(x_set))
        return torch.cat([h[-1], c[-1]], dim=-1)  # (B, 2 H)

    def read(self, state, x_query):
        z = self.f_enc(x_query)
        return self.f_out(torch.cat([state.unsqueeze(1).expand(-1, z.shape[1], -1), z], dim=-1))

    def state_floats(self, n: int) -> int:
        return 2 * self.cfg.hidden_size


class MemoryNetwork(nn.Module):
    """The slot baseline: each element's key (d floats) in its own slot; a query's logit is an affine map of its
    largest dot product with the stored keys (content-based attention)."""

    def __init__(self, cfg: MemNetConfig, enc: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.f_enc = encoder(enc)
        self.key = nn.Linear(enc.z_dim, cfg.word_size)
        self.scale = nn.Parameter(torch.tensor(10.0))  # cosines lie in [-1, 1]: start with a steep logit
        self.bias = nn.Parameter(torch.tensor(-5.0))

    def keys(self, x):
        return F.normalize(self.key(self.f_enc(x)), dim=-1)

    def write(self, x_set):
        return self.keys(x_set)  # (B, n, d)

    def read(self, slots, x_query):
        best = (self.keys(x_query) @ slots.transpose(1, 2)).amax(-1)  # the largest cosine
        return self.scale * best + self.bias

    def state_floats(self, n: int) -> int:
        return n * self.cfg.word_size


def build(kind: str, cfg, enc: EncoderConfig) -> nn.Module:
    models = {"nbf": NeuralBloomFilter, "lstm": SequentialLSTM, "memnet": MemoryNetwork}
    if kind not in models:
        raise ValueError(f"model kind must be one of {sorted(models)}, not {kind!r}")
    return models[kind](cfg, enc)
