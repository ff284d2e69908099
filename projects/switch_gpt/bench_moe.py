"""The Switch layer against a dense MLP at equal active FLOPs, and the grouped kernel against the per-expert loop:
training tokens/s (forward + backward) of one layer, for E experts.

With top-1 routing a token passes through one expert, a GPT MLP of the same width, so the dense MLP does the
token's expert FLOPs; the Switch layer adds the router, the sort and the gather/scatter. Each row times
forward + backward of the layer on `--tokens` tokens of width d_model (training mode: capacity 1.25, overflow
dropped) and reports tokens/s and its ratio to the dense MLP measured in the same run. The Triton rows need a GPU
(on CPU they would time the interpreter). Timed with CUDA events on a GPU, a wall clock on CPU; medians.

    python projects/switch_gpt/bench_moe.py                         # small's width, 16 x 512 tokens, E 8/32/64
    python projects/switch_gpt/bench_moe.py --d_model 64 --tokens 256 --experts 8 --steps 1 --warmup 0   # a smoke test
"""
import argparse
import statistics
import time

import torch

from languini.flags import Parser
from languini.transformer import MLP
from projects.switch_gpt import configs
from projects.switch_gpt.model import SwitchMLP


def time_steps(module, x, steps: int, warmup: int) -> float:
    """Median seconds of forward + backward (the layer's parameter gradients and its input's)."""
    def step():
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()

    for _ in range(warmup):
        step()
    durations = []
    for _ in range(steps):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            durations.append(start.elapsed_time(end) / 1000)
        else:
            started = time.perf_counter()
            step()
            durations.append(time.perf_counter() - started)
    return statistics.median(durations)


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d_model", type=int, default=768)
    parser.add_argument("--tokens", type=int, default=16 * 512, help="tokens per step (batch x sequence length)")
    parser.add_argument("--experts", type=str, default="8,32,64", help="comma-separated numbers of experts")
    parser.add_argument("--routing", choices=configs.ROUTING, default="top1")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                        help="default: bf16 autocast on a GPU, fp32 on CPU")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{where}, {precision}, {args.tokens} tokens of width {args.d_model}, {args.routing}, "
          f"torch {torch.__version__}")
    print(f"{'layer':<24}{'E':>4}{'tokens/s':>14}{'vs dense':>10}")
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.d_model, device=device, requires_grad=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        dense = time_steps(MLP(args.d_model, configs.get("small").mlp_ratio).to(device), x, args.steps, args.warmup)
    print(f"{'dense MLP':<24}{'-':>4}{args.tokens / dense:>14,.0f}{1.0:>10.2f}")
    impls = ["naive"] + (["triton"] if device.type == "cuda" else [])
    for E in (int(e) for e in args.experts.split(",")):
        for impl in impls:
            cfg = configs.get("small", d_model=args.d_model, n_experts=E, routing=args.routing, experts_impl=impl)
            layer = SwitchMLP(cfg).to(device)
            layer.init_weights()
            with autocast:
                seconds = time_steps(layer, x, args.steps, args.warmup)
            name = {"naive": "Switch, per-expert loop", "triton": "Switch, grouped Triton"}[impl]
            print(f"{name:<24}{E:>4}{args.tokens / seconds:>14,.0f}{dense / seconds:>10.2f}")


if __name__ == "__main__":
    main()
