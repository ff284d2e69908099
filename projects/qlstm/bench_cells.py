"""Table 7 of the Languini paper for our implementations: training tokens/s of LSTM and quasi-LSTM cells.

Times one training step (forward, backward, AdamW update) of a stack of n_layers residual blocks
x + cell(LayerNorm(x)), with the state carried from step to step as in training. There is no MLP,
embedding or output head, so the numbers are higher than a full model's; they compare the
recurrence implementations: the minimal for-loop, block-parallel at several block lengths, and the
Triton scan. Timed by languini.timing: the median step, CUDA events on a GPU, a wall clock on CPU.

    python projects/qlstm/bench_cells.py                # qLSTM-small-sized stack on the GPU
    python projects/qlstm/bench_cells.py --d_model 16 --n_layers 1 --batch 2 --seq_len 33 \\
        --heads 1x16,2x8 --steps 1 --warmup 0            # a smoke test on CPU
"""

import argparse

import torch
from torch import nn

from languini.flags import Parser, add_bool_flag
from languini.timing import time_calls
from languini.trainer import detach
from languini.triton_utils import interpreting
from projects.qlstm.configs import ModelConfig
from projects.qlstm.model import make_cell


class CellStack(nn.Module):
    def __init__(self, make_cell, d_model, n_layers):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.cells = nn.ModuleList(make_cell() for _ in range(n_layers))

    def forward(self, x, states):
        new_states = []
        for norm, cell, state in zip(self.norms, self.cells, states):
            y, state = cell(norm(x), state)
            x = x + y
            new_states.append(state)
        return x, new_states


def time_training_steps(model, args, device, autocast_dtype):
    """Median seconds per training step (languini.timing), after warmup steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.seq_len, args.d_model, device=device)
    states = [None] * args.n_layers

    def step():
        nonlocal states
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
            y, new_states = model(x, states)
            loss = y.float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        states = detach(new_states)

    return time_calls(step, device, args.steps, args.warmup).median


def table_rows(args):
    """(model, n_heads, d_head, block length, implementation) in the order of Table 7."""
    heads = [tuple(int(v) for v in spec.split("x")) for spec in args.heads.split(",")]
    block_lens = [int(v) for v in args.block_lens.split(",")]
    rows = [("LSTM", h, d, None, "loop") for h, d in heads]
    rows += [("qLSTM", h, d, None, "loop") for h, d in heads]
    rows += [("qLSTM", h, d, b, "block") for h, d in heads for b in block_lens]
    rows += [("qLSTM", h, d, None, "triton") for h, d in heads]
    return rows


def run_row(row, args, device, autocast_dtype):
    """tokens/s, ms per step and peak GiB as printable strings."""
    model_name, n_heads, d_head, block_len, impl = row
    if impl == "triton" and device.type != "cuda" and not interpreting():
        return "skipped: needs CUDA or TRITON_INTERPRET=1", "-", "-"
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=args.d_model, n_heads=n_heads, d_head=d_head, cell=model_name.lower(), impl=impl,
                      block_len=block_len or ModelConfig.block_len)
    model = CellStack(lambda: make_cell(cfg), args.d_model, args.n_layers).to(device)
    if args.compile:
        model = torch.compile(model)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        seconds = time_training_steps(model, args, device, autocast_dtype)
    except torch.cuda.OutOfMemoryError:
        return "OOM", "-", "-"
    peak = f"{torch.cuda.max_memory_allocated() / 2**30:.1f}" if device.type == "cuda" else "-"
    return f"{args.batch * args.seq_len / seconds:,.0f}", f"{seconds * 1000:.1f}", peak


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d_model", type=int, default=768)
    parser.add_argument("--n_layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--heads", default="1x768,12x64", help="comma-separated n_heads x d_head")
    parser.add_argument("--block_lens", default="1,8,16,32", help="block lengths of the block-parallel rows")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per row")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                        help="autocast dtype; bf16 on CUDA, fp32 on CPU by default")
    add_bool_flag(parser, "--compile", False, "torch.compile the stack")
    parser.add_argument("--device", default=None, help="cuda or cpu; cuda when available")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    autocast_dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# {device_name}, {dtype_name}, torch {torch.__version__}, compile={args.compile}: "
          f"{args.n_layers} layers x (LayerNorm + cell), d_model {args.d_model}, "
          f"batch {args.batch}, seq_len {args.seq_len}, median of {args.steps} training steps")
    header = ("model", "n_heads", "d_head", "block length", "implementation", "tokens/s", "ms/step", "peak GiB")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for row in table_rows(args):
        model_name, n_heads, d_head, block_len, impl = row
        results = run_row(row, args, device, autocast_dtype)
        cells = (model_name, n_heads, d_head, block_len or "-", impl) + results
        print(" | ".join(str(c) for c in cells), flush=True)


if __name__ == "__main__":
    main()
