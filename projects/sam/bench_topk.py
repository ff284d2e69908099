"""The exact K-nearest-word search (ops/topk) on a GPU: the Triton kernel against the PyTorch reference, for the
thesis's A.2 sizes (batch 8, 4 heads, words of 32, K = 4) and N = 2^10 .. 2^20 words.

A search reads the whole memory once (B x N x W x 4 bytes), so its speed limit is the memory bandwidth: the
table gives each implementation's time and the bytes it streams per second. On a CPU only the reference runs
(the kernel would run in the Triton interpreter).

    python projects/sam/bench_topk.py                  # on a GPU: both; on a CPU: the reference
    python projects/sam/bench_topk.py --words 10 14 --repeats 5
"""
import argparse
import sys

import torch

from languini.flags import Parser
from languini.timing import time_calls
from projects.sam.ops.topk import cosine_topk


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=int, nargs="+", default=list(range(10, 21, 2)), help="log2 of N")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    impls = ["naive", "triton"] if device.type == "cuda" else ["naive"]
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; batch {args.batch}, "
          f"{args.heads} heads, width {args.width}, K = {args.k}; median of {args.repeats}")
    print(f"{'N':>8s}" + "".join(f"{impl + ' ms':>14s}{impl + ' GB/s':>14s}" for impl in impls))
    for n in args.words:
        g = torch.Generator().manual_seed(n)
        memory = torch.randn(args.batch, 2 ** n, args.width, generator=g).to(device)
        query = torch.randn(args.batch, args.heads, args.width, generator=g).to(device)
        row = f"{'2^' + str(n):>8s}"
        results = {}
        for impl in impls:
            timing = time_calls(lambda impl=impl: cosine_topk(query, memory, args.k, impl), device, args.repeats,
                                args.warmup)
            results[impl] = cosine_topk(query, memory, args.k, impl)
            row += f"{timing.median * 1e3:14.3f}{memory.numel() * 4 / timing.median / 1e9:14.1f}"
        if "triton" in results:  # the same words, as a check beside the timing
            same = torch.equal(results["naive"][1].sort(-1).values, results["triton"][1].sort(-1).values)
            row += "" if same else "   (indices differ: ties?)"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
