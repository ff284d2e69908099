"""Where a memory layer's time goes on a GPU: its kernels, one row each, from torch.profiler.

Runs the LRAM block (projects.lram_gpt) or the product-key memory (projects.pkm_gpt) on random inputs
[batch, seq_len, width], forward or forward + backward under the trainer's mixed precision, and prints
the CUDA kernels by total device time per step: the lookup kernels against the glue around them
(elementwise ops, sorts, the dense projections). The benchmark (bench_memory_layers.py) says how fast a
layer is; this says which kernel to make faster.

    python scripts/profile_memory_layer.py --layer lram --width 768 --memory_size 2^18
    python scripts/profile_memory_layer.py --layer pkm --width 768 --n_keys 256 --mode forward
"""

import argparse
import shlex
import sys
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from languini.flags import Parser
from languini.trainer import precision_for
from projects.lram_gpt.memory import LRAMBlock
from projects.pkm_gpt.pkm import LRAM_PAPER_PKM, ProductKeyMemory


def power_of_two(text: str) -> int:
    return 2 ** int(text[2:]) if text.startswith("2^") else int(text)


def build(args) -> torch.nn.Module:
    if args.layer == "lram":
        return LRAMBlock(args.width, memory_size=args.memory_size, value_grad=args.value_grad, use_triton=True)
    config = replace(LRAM_PAPER_PKM, n_keys=args.n_keys, value_grad=args.value_grad)
    return ProductKeyMemory.from_config(args.width, config, use_triton=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", choices=["lram", "pkm"], default="lram")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--memory_size", type=power_of_two, default=2**18, help="LRAM rows, e.g. 2^18")
    parser.add_argument("--n_keys", type=int, default=256, help="PKM sub-keys per half (memory n_keys^2)")
    parser.add_argument("--value_grad", choices=["atomic", "segment"], default="atomic",
                        help="value gradient: atomics, or segment sums over the reverse index")
    parser.add_argument("--mode", choices=["forward", "train"], default="train", help="forward only, or + backward")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after --warmup untimed ones)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20, help="kernels listed")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this profiles CUDA kernels: no CUDA device here")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")
    device = torch.device("cuda")
    autocast, _, precision = precision_for(device, args.precision)
    torch.manual_seed(0)
    layer = build(args).to(device).train()
    x = torch.randn(args.batch, args.seq_len, args.width, device=device, requires_grad=args.mode == "train")

    def step():
        with autocast():
            y = layer(x)
        if args.mode == "train":
            y.float().square().mean().backward()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()

    tokens = args.batch * args.seq_len
    print(f"# {torch.cuda.get_device_name()}, {precision}, torch {torch.__version__}")
    print(f"# {shlex.join(['python', 'scripts/profile_memory_layer.py', *argv])}")
    print(f"# {args.layer} width {args.width}, {tokens} tokens per step, {args.mode}; "
          f"device time per step, mean over {args.steps} steps")
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in kernels)
    print(f"{'ms/step':>8}  {'share':>6}  {'calls/step':>10}  kernel")
    for e in kernels[:args.rows]:
        print(f"{e.self_device_time_total / 1000 / args.steps:8.3f}  {e.self_device_time_total / total:6.1%}  "
              f"{e.count / args.steps:10g}  {e.key[:110]}")
    rest = kernels[args.rows:]
    if rest:
        print(f"{sum(e.self_device_time_total for e in rest) / 1000 / args.steps:8.3f}  "
              f"{sum(e.self_device_time_total for e in rest) / total:6.1%}  {'':>10}  ({len(rest)} more kernels)")
    print(f"{total / 1000 / args.steps:8.3f}  100.0%  {'':>10}  all kernels: "
          f"{total / 1000 / args.steps * 1000 / tokens:.3f} µs per token")


if __name__ == "__main__":
    main()
