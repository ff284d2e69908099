"""Transformer-XL relative attention over a memory prefix against the GPT's plain causal attention at the same
segment length: tokens/s and peak memory of one attention layer, forward and forward + backward.

Each row times one layer (projections, the attention core, the output projection) on batch x seq_len tokens of
width d_model: the compressive project's RelativeAttention over n_m memories before the segment, through each of
its implementations (naive: the PyTorch reference; triton: the kernel; flex: FlexAttention), and the GPT's
attention layer (math: an explicit masked softmax, the kitchen's default; sdpa: PyTorch's fused kernels) over the
segment alone (languini/transformer.py's Attention, the layer every GPT project uses). `ratio` is the row's
tokens/s over the GPT math layer's in the same run and mode. The Triton rows need a GPU (on CPU they would time
the interpreter); FlexAttention has no backward on CPU. Peak memory is the CUDA allocator's peak above the inputs
(GPU only). Timed with CUDA events on a GPU, a wall clock on CPU; medians.

    python projects/compressive/bench_attention_memory.py           # GPU: small's width, 8 x 512 tokens
    python projects/compressive/bench_attention_memory.py --batch_size 1 --memories 0 128 \\
        --repeats 2 --warmup 1                                      # CPU smoke
"""
import dataclasses
import sys

import torch

from languini import transformer
from languini.flags import Parser
from languini.timing import time_calls
from projects.compressive import configs
from projects.compressive.model import RelativeAttention


@dataclasses.dataclass
class Row:
    layer: str
    memory: int
    mode: str
    seconds: float | None
    tokens: int
    peak_mib: float | None
    note: str = ""

    @property
    def tokens_per_second(self) -> float | None:
        return None if self.seconds is None else self.tokens / self.seconds


def measure(layer: torch.nn.Module, inputs: tuple, mode: str, device: torch.device, repeats: int, warmup: int,
            autocast: bool) -> tuple[float, float | None]:
    """(median seconds, peak MiB above the inputs on a GPU) of a forward, or a forward + backward, of the layer."""
    def run():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = layer(*inputs)
        if mode == "fwd+bwd":
            out.float().square().mean().backward()

    grad = torch.enable_grad() if mode == "fwd+bwd" else torch.no_grad()
    with grad:
        peak = None
        if device.type == "cuda":
            run()  # compile and allocate once before the peak is read
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            run()
            torch.cuda.synchronize(device)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
        return time_calls(run, device, repeats, warmup).median, peak


def rows(args, device: torch.device):
    d, T, B = args.d_model, args.seq_len, args.batch_size
    autocast = device.type == "cuda"
    x = torch.randn(B, T, d, device=device, requires_grad=True)
    for mode in ("fwd", "fwd+bwd"):
        for impl in ("math", "sdpa"):
            gpt = transformer.Attention(d, args.n_heads, args.d_head, impl).to(device)
            seconds, peak = measure(gpt, (x,), mode, device, args.repeats, args.warmup, autocast)
            yield Row(f"gpt {impl}", 0, mode, seconds, B * T, peak)
        for memory in args.memories:
            prefix = torch.randn(B, memory, d, device=device, requires_grad=True)
            for impl in ("naive", "triton", "flex"):
                if impl == "triton" and device.type != "cuda":
                    yield Row(f"compressive {impl}", memory, mode, None, B * T, None, "GPU only")
                    continue
                if impl == "flex" and device.type != "cuda" and mode == "fwd+bwd":
                    yield Row(f"compressive {impl}", memory, mode, None, B * T, None, "no CPU backward")
                    continue
                cfg = configs.ModelConfig(d_model=d, n_heads=args.n_heads, d_head=args.d_head, seq_len=T,
                                          attention_impl=impl)
                layer = RelativeAttention(cfg).to(device)
                try:
                    seconds, peak = measure(layer, (x, prefix), mode, device, args.repeats, args.warmup, autocast)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    yield Row(f"compressive {impl}", memory, mode, None, B * T, None, "out of memory")
                    continue
                yield Row(f"compressive {impl}", memory, mode, seconds, B * T, peak)


def main(argv=None) -> None:
    small = configs.get("small")
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d_model", type=int, default=small.d_model)
    parser.add_argument("--n_heads", type=int, default=small.n_heads)
    parser.add_argument("--d_head", type=int, default=small.d_head)
    parser.add_argument("--seq_len", type=int, default=small.seq_len, help="segment length T")
    parser.add_argument("--memories", type=int, nargs="+", default=[0, 512, 1024, 2048],
                        help="memories before the segment (n_m + n_cm)")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    if min(args.memories) < 0 or min(args.seq_len, args.batch_size, args.repeats) < 1:
        parser.error("memories must be >= 0; seq_len, batch_size and repeats >= 1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# {name}, torch {torch.__version__}, {'bf16 autocast' if device.type == 'cuda' else 'fp32'}; "
          f"batch {args.batch_size} x segment {args.seq_len}, d_model {args.d_model}, {args.n_heads} heads of "
          f"{args.d_head}; medians of {args.repeats} runs")
    print(f"{'layer':<18} {'memory':>6} {'mode':<8} {'ms':>9} {'tokens/s':>12} {'ratio':>6} {'peak MiB':>9}  note")
    reference = {}
    for row in rows(args, device):
        if row.layer == "gpt math":
            reference[row.mode] = row.tokens_per_second
        ms = "-" if row.seconds is None else f"{row.seconds * 1e3:.2f}"
        tps = "-" if row.seconds is None else f"{row.tokens_per_second:,.0f}"
        ratio = "-" if row.seconds is None else f"{row.tokens_per_second / reference[row.mode]:.2f}"
        peak = "-" if row.peak_mib is None else f"{row.peak_mib:,.0f}"
        print(f"{row.layer:<18} {row.memory:>6} {row.mode:<8} {ms:>9} {tps:>12} {ratio:>6} {peak:>9}  {row.note}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
