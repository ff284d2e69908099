"""SAM language-model sizes, and the memory settings the tasks and benchmarks share (thesis Appendix A).

A token embedding of width d_model feeds the memory core (core.py: an LSTM controller of `hidden` units with an
external memory of `words` words of `word_size`, `heads` access heads reading K words each); the core's output,
Linear([h_t, r_t]) of width d_model, goes through a LayerNorm to the vocabulary.
"""
from dataclasses import dataclass, replace

from languini.flags import arg


@dataclass
class MemoryConfig:
    """The memory core alone (core.MemoryCore), as the tasks and the benchmark use it. Defaults: Appendix A."""
    kind: str = arg("sam", "the memory core: sam, sdnc, dam, dnc or lstm (core.KINDS)",
                    choices=("sam", "sdnc", "dam", "dnc", "lstm"))
    hidden: int = arg(100, "LSTM controller units (A.1, A.2)")
    heads: int = arg(4, "access heads (A.1, A.2)")
    word_size: int = arg(32, "W, the width of a memory word (A.2)")
    words: int = arg(1024, "N, memory words per stream")
    k: int = arg(4, "words each head reads (A.1: K = 4)")
    k_links: int = arg(8, "K_L, entries per row of the Sparse DNC's links (3.5.1)")
    delta: float = arg(0.005, "an access counts for SAM's usage when its weight exceeds delta (3.2.3)")
    usage_discount: float = arg(0.99, "lambda of DAM's discounted usage U^(1) (the thesis gives no value)")
    index: str = arg("exact", "the read's search: exact, or faiss (an approximate index; pip install faiss-cpu)",
                     choices=("exact", "faiss"))
    nlist: int = arg(0, "FAISS inverted lists; 0: round(sqrt(words))")
    nprobe: int = arg(4, "FAISS lists searched per query")
    topk_impl: str | None = arg(None, "the exact search: naive or triton; none: triton on CUDA, naive on CPU")
    initial_strength: float | None = arg(None, "the read strength beta of every head at initialisation (> 1; "
                                         "none: the interface's random bias, beta about 1.7)")
    cuda_graph: bool = arg(False, "on a GPU with exact search, replay each training segment's time loop, forward and "
                           "backward, from CUDA graphs (graphs.py; unverified on a GPU, so off by default)")

@dataclass
class ModelConfig(MemoryConfig):
    vocab_size: int = arg(16384, "tokens of the vocabulary (set to the dataset's unless given)")
    seq_len: int = arg(512, "tokens per segment; the memory and the controller's state are carried across segments")
    d_model: int = arg(768, "token embedding and output width")
    hidden: int = arg(768, "LSTM controller units")
    word_size: int = arg(64, "W, the width of a memory word")
    words: int = arg(16384, "N, memory words per stream")


SIZES = {
    "small": ModelConfig(),
    # Sized for a smoke test on 2 CPU cores with the embedded default corpus (as the GPT's); not a paper config.
    # 1024 words per stream hold the last ~500 tokens' writes of two heads.
    "cpu": ModelConfig(vocab_size=2048, seq_len=128, d_model=128, hidden=128, heads=2, word_size=32, words=1024),
}

# No published Languini runs of SAM: a class trains the named config (default small) at the trainer's batch size.
COMPUTE_CLASSES = {}


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown SAM config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
