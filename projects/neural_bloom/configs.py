"""Plain configs of the Neural Bloom Filter and its neural baselines (Rae, thesis 5.3, 5.6, Appendix C).

The thesis's database encoder is a 256-unit character LSTM with a 256 feed-forward layer; here the encoder is a
byte CNN that keeps each byte's position (cheaper on a CPU; README.md says why). Memory and word sizes come from
the thesis's sweep (Table C.1: memory {2..64}, word {2..10}); the bench sweeps a few of them.
"""
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EncoderConfig:
    kind: str = "bytes"  # "bytes": strings as padded UTF-8 bytes; "vector": fixed-length float vectors
    max_len: int = 16  # bytes kept per string (longer ones are cut; 99% of the pgbooks words fit in 14)
    input_dim: int = 64  # length of a vector input (kind "vector")
    byte_dim: int = 16  # embedding of one byte
    channels: int = 64  # of the two convolutions over the bytes
    z_dim: int = 128  # the input embedding z

    def __post_init__(self):
        if self.kind not in ("bytes", "vector"):
            raise ValueError(f"encoder kind must be 'bytes' or 'vector', not {self.kind!r}")
        if min(self.max_len, self.input_dim, self.byte_dim, self.channels, self.z_dim) < 1:
            raise ValueError(f"every encoder size must be positive: {self}")


@dataclass(frozen=True)
class NBFConfig:
    """Algorithm 2: m memory slots of `word_size` floats, addressed by softmax(q^T A) (A learned)."""
    memory_slots: int = 8  # m
    word_size: int = 4  # d, the write word w
    query_dim: int = 32  # q, the rows of A
    hidden: int = 128  # of f_q, f_w (one hidden layer, then LayerNorm) and of the residual f_out
    address_top_k: int = 0  # 0: dense softmax; k > 0: keep the k largest address weights (sparse sigma_k)
    write_scale: float = 1.0  # w is written as write_scale * f_w(z): about 1 / set size keeps M of order one

    def __post_init__(self):
        if min(self.memory_slots, self.word_size, self.query_dim, self.hidden) < 1:
            raise ValueError(f"every size must be positive: {self}")
        if not self.write_scale > 0:
            raise ValueError(f"write_scale must be positive, not {self.write_scale}")
        if not 0 <= self.address_top_k <= self.memory_slots:
            raise ValueError(f"address_top_k must be in 0..memory_slots ({self.memory_slots}), not {self.address_top_k}")


@dataclass(frozen=True)
class LSTMConfig:
    """The sequential baseline: an LSTM reads the set's embeddings one by one; its final (h, c) is the state."""
    hidden_size: int = 16  # the thesis sweeps {2, ..., 64}
    query_hidden: int = 128  # the MLP that reads [h, c, z] of a query

    def __post_init__(self):
        if min(self.hidden_size, self.query_hidden) < 1:
            raise ValueError(f"every size must be positive: {self}")


@dataclass(frozen=True)
class MemNetConfig:
    """The slot baseline: one slot of `word_size` floats per stored element; familiarity = max attention score."""
    word_size: int = 2  # the thesis's smallest (Figure 5.2a solves class-based sets with 2)

    def __post_init__(self):
        if self.word_size < 1:
            raise ValueError(f"word_size must be positive, not {self.word_size}")


def with_memory(config: NBFConfig, slots: int, word_size: int) -> NBFConfig:
    return replace(config, memory_slots=slots, word_size=word_size)
