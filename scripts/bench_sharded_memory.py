"""The memory layers with their value table split over processes (--memory_shards): time and bytes per token.

For each process count R of --ranks, R processes (gloo on CPU, NCCL with one GPU each) run the LRAM and the PKM
layer of --width with each value table split by columns over all R of them (R = 1: the whole table, no
communication; languini/memory_layers.py: sharded_bag). Every process reads --tokens tokens of its own. Per layer
and R it prints, per token of one process (the slowest process's median of --repeats runs after --warmup):
- forward (no grad) and forward + backward (to the parameters and the input) times;
- the bytes one process sends to the others per token, counted from the collectives' sizes
  (languini.model_parallel.bytes_sent), in the forward and in forward + backward, beside what the formulas of
  the README ("Running on several GPUs") give: LRAM with h heads of k reads of m values,
  forward (S-1) h (8k + 4m/S), with the backward (S-1) h (12k + 8m/S); PKM with r = heads x knn reads of v values,
  (S-1) (8r + 4v/S) and (S-1) (12r + 8v/S);
- the bytes of its part of the table with its gradient and Adam's two moments (16 per value in fp32).
On CPU every process runs one thread, so R processes use R cores: compare the time per token across R as the cost
of the communication, not as a speed-up. Writes the table to --out/sharded_memory_<device>.csv.

    python scripts/bench_sharded_memory.py                        # CPU: 1 and 2 processes, small sizes
    python scripts/bench_sharded_memory.py --ranks 1,2,4,8 --width 1024 --tokens 8192 --lram_memory 2^24 \\
        --pkm_keys 1024                                           # a machine with 8 GPUs
"""
import argparse
import csv
import datetime
import json
import math
import os
import shlex
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from languini import model_parallel, timing
from languini.flags import Parser
from projects.lram_gpt.memory import LRAMBlock
from projects.pkm_gpt.pkm import ProductKeyMemory

COLUMNS = ("layer", "width", "values", "ranks", "fwd_us_per_token", "fwd_bwd_us_per_token", "fwd_bytes_per_token",
           "fwd_bytes_formula", "fwd_bwd_bytes_per_token", "fwd_bwd_bytes_formula", "table_mib_per_process")


def build(layer: str, args, shards):
    torch.manual_seed(0)
    if layer == "LRAM":
        return LRAMBlock(args.width, memory_size=args.lram_memory, use_triton=None, shards=shards)
    return ProductKeyMemory(args.width, heads=8, k_dim=64, n_keys=args.pkm_keys, knn=32, shards=shards)


def formula_bytes(layer, shards: int) -> tuple[float, float]:
    """Bytes one process sends per token (forward, forward + backward), from the sizes of what it sends."""
    if layer.__class__ is LRAMBlock:
        bags, pairs, columns = layer.n_heads, layer.topk, layer.value_dim
    else:
        bags, pairs, columns = 1, layer.heads * layer.knn, layer.v_dim
    forward = (shards - 1) * bags * (8 * pairs + 4 * columns / shards)
    return forward, forward + (shards - 1) * bags * (4 * pairs + 4 * columns / shards)


def measure(rank: int, world: int, args, device: torch.device) -> list[dict]:
    shards = model_parallel.shard_group(world, "--ranks")
    rows = []
    for name in ("LRAM", "PKM"):
        layer = build(name, args, shards).to(device)
        generator = torch.Generator(device=device).manual_seed(rank)
        x = torch.randn(args.tokens, args.width, device=device, generator=generator, requires_grad=True)
        grad = torch.randn(args.tokens, args.width, device=device, generator=generator)

        def forward():
            with torch.no_grad():
                layer(x)

        def forward_backward():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).backward(grad)

        sent = []
        for run in (forward, forward_backward):
            before = model_parallel.bytes_sent()
            run()
            sent.append((model_parallel.bytes_sent() - before) / args.tokens)
        seconds = torch.tensor([timing.time_calls(run, device, args.repeats, args.warmup).median
                                for run in (forward, forward_backward)], device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # a step waits for the slowest process
        fwd_formula, fwd_bwd_formula = formula_bytes(layer, world)
        part = layer.values.numel()
        rows.append({"layer": name, "width": args.width, "values": part * world, "ranks": world,
                     "fwd_us_per_token": seconds[0].item() / args.tokens * 1e6,
                     "fwd_bwd_us_per_token": seconds[1].item() / args.tokens * 1e6,
                     "fwd_bytes_per_token": sent[0], "fwd_bytes_formula": fwd_formula,
                     "fwd_bwd_bytes_per_token": sent[1], "fwd_bwd_bytes_formula": fwd_bwd_formula,
                     "table_mib_per_process": 16 * part / 2 ** 20})
    return rows


def worker(rank: int, world: int, args, store: str, out: str) -> None:
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # one core per process
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        rows = measure(rank, world, args, device)
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
        dist.barrier()  # no process tears its connections down while another still talks to it (gloo aborts)
    finally:
        dist.destroy_process_group()


def run(args, world: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        store, out = os.path.join(folder, "store"), os.path.join(folder, "rows.json")
        mp.start_processes(worker, args=(world, args, store, out), nprocs=world, start_method="spawn")
        return json.loads(Path(out).read_text())


def parse_power(text: str) -> int:
    """An integer, or a power written as 2^14."""
    base, _, exponent = text.partition("^")
    return int(base) ** int(exponent) if exponent else int(base)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ranks", default=None, help="process counts, comma-separated (default: 1,2 on CPU; 1, 2, "
                                                      "4, ... up to every GPU)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per process")
    parser.add_argument("--lram_memory", type=parse_power, default=2 ** 14, help="LRAM locations (64 values each)")
    parser.add_argument("--pkm_keys", type=parse_power, default=64, help="PKM n_keys (n_keys^2 values of --width)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args(argv)
    if args.ranks is None:
        gpus = torch.cuda.device_count() if args.device == "cuda" else 2
        args.ranks = ",".join(str(2 ** i) for i in range(int(math.log2(gpus)) + 1))
    ranks = [int(r) for r in args.ranks.split(",")]
    if args.device == "cuda" and max(ranks) > torch.cuda.device_count():
        parser.error(f"--ranks {args.ranks} needs {max(ranks)} GPUs; this machine has {torch.cuda.device_count()}")
    if args.width % 16 or any(64 % r or args.width % r for r in ranks):
        parser.error("--width must be a multiple of 16, and 64 and --width multiples of every process count")
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"# {device_name}, one {'GPU' if args.device == 'cuda' else 'thread'} per process; "
          f"{shlex.join(['python', 'scripts/bench_sharded_memory.py', *argv])}", flush=True)
    rows = [row for world in ranks for row in run(args, world)]
    header = (f"{'layer':<5} {'values':>10} {'ranks':>5} {'fwd us/tok':>11} {'fwd+bwd us/tok':>15} "
              f"{'fwd B/tok (formula)':>21} {'fwd+bwd B/tok (formula)':>25} {'table MiB/process':>18}")
    print(header)
    for r in rows:
        print(f"{r['layer']:<5} {r['values']:>10,} {r['ranks']:>5} {r['fwd_us_per_token']:>11.1f} "
              f"{r['fwd_bwd_us_per_token']:>15.1f} {r['fwd_bytes_per_token']:>10.0f} ({r['fwd_bytes_formula']:>7.0f}) "
              f"{r['fwd_bwd_bytes_per_token']:>13.0f} ({r['fwd_bwd_bytes_formula']:>7.0f}) "
              f"{r['table_mib_per_process']:>18.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sharded_memory_{'gpu' if args.device == 'cuda' else 'cpu'}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*COLUMNS, "device", "date", "torch", "command"])
        meta = [device_name, datetime.date.today().isoformat(), torch.__version__,
                shlex.join(["python", "scripts/bench_sharded_memory.py", *argv])]
        for r in rows:
            writer.writerow([r[c] for c in COLUMNS] + meta)
    print(f"Wrote {path}")
    return rows


if __name__ == "__main__":
    main()
