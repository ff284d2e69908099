"""Training and inference speed of the Feedback Transformer against the GPT of the same width, depth and segment
length, measured in one run on one device (the slides' table: training 84.4K vs 296K tokens/s, inference 2,176 vs
592 tokens/s for the Transformer).

    python projects/feedback/bench_speed.py --config cpu --batch_size 16            # the CPU rows of the README
    python projects/feedback/bench_speed.py --config small --batch_size 64 --gen_batch 1   # on a GPU

Training: tokens/s of the trainer's own step (languini.measure: forward, backward, Adam, the run's precision) on
random tokens, the median of --steps after --warmup, for the GPT with math and with sdpa attention (the copy in
gpt_baseline.py) and for the Feedback Transformer (its state carried from step to step, as in training), with each
one's ratio to the GPT's. Inference: token-by-token generation of --gen_tokens tokens for --gen_batch streams from
an empty context, the GPT from a key/value cache (sdpa over the cache), the Feedback Transformer from its ring of
tau keys and values; tokens/s and the ratio. A table is printed; --csv writes its rows.
"""
import argparse
import csv
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from languini.flags import Parser
from languini.measure import measure_batch_size
from languini.throughput import local_device_name
from languini.timing import time_calls
from languini.trainer import TrainConfig, precision_for
from projects.feedback import configs
from projects.feedback.gpt_baseline import GPT, CachedDecoder, GPTConfig
from projects.feedback.model import Decoder, Model


def gpt_config(cfg: configs.ModelConfig, attention: str) -> GPTConfig:
    """The GPT of the Feedback Transformer's width, depth, heads, vocabulary and segment length."""
    return GPTConfig(vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, d_model=cfg.d_model, n_layers=cfg.n_layers,
                     n_heads=cfg.n_heads, d_head=cfg.d_head, mlp_ratio=cfg.mlp_ratio, attention=attention)


def models(cfg: configs.ModelConfig):
    """(name, model class, model config) of the compared models, the baseline first."""
    return [("gpt sdpa", GPT, gpt_config(cfg, "sdpa")), ("gpt math", GPT, gpt_config(cfg, "math")),
            ("feedback", Model, cfg)]


def training_speed(model_cls, model_cfg, args, device) -> float | None:
    torch.manual_seed(0)
    model = model_cls(model_cfg).to(device).train()
    tcfg = TrainConfig(precision=args.precision)
    result = measure_batch_size(model, model_cfg, args.batch_size, device, tcfg, args.steps, args.warmup)
    return result.tokens_per_second


def inference_speed(model, decoder_cls, args, device) -> float:
    model.eval()
    tokens = torch.randint(model.cfg.vocab_size, (args.gen_tokens, args.gen_batch), device=device)
    autocast, _, _ = precision_for(device, args.precision)

    def generate():
        with autocast():
            decoder = decoder_cls(model, batch=args.gen_batch)
            for t in range(args.gen_tokens):
                decoder.step(tokens[t])

    timing = time_calls(generate, device, args.repeats, 1)
    return args.gen_batch * args.gen_tokens / timing.median


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cpu", choices=sorted(configs.SIZES))
    parser.add_argument("--batch_size", type=int, default=16, help="training batch (streams)")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps before them")
    parser.add_argument("--gen_tokens", type=int, default=None, help="tokens generated per stream (default seq_len)")
    parser.add_argument("--gen_batch", type=int, default=1, help="streams generated at once")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per model")
    parser.add_argument("--precision", default="auto", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp32")
    parser.add_argument("--attention_impl", default=None, help="the Feedback Transformer's (auto, naive, triton)")
    parser.add_argument("--cuda_graphs", default=None, choices=("true", "false"),
                        help="the Feedback Transformer's (default: its config's)")
    parser.add_argument("--skip_inference", action="store_true")
    parser.add_argument("--csv", default=None, help="write the rows to this CSV")
    args = parser.parse_args(argv)
    overrides = {}
    if args.attention_impl:
        overrides["attention_impl"] = args.attention_impl
    if args.cuda_graphs:
        overrides["cuda_graphs"] = args.cuda_graphs == "true"
    cfg = configs.get(args.config, **overrides)
    args.gen_tokens = args.gen_tokens or cfg.seq_len
    if args.gen_tokens > cfg.seq_len:
        raise SystemExit(f"--gen_tokens is at most seq_len = {cfg.seq_len} (the GPT's position table)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"{args.config}: d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.d_head}, "
          f"segment {cfg.seq_len}, memory tau {cfg.mem_len}, vocab {cfg.vocab_size}; {local_device_name(device)}, "
          f"{torch.get_num_threads()} threads, precision {args.precision}, torch {torch.__version__}; "
          f"training batch {args.batch_size} (median of {args.steps} steps after {args.warmup}); generation of "
          f"{args.gen_tokens} tokens x {args.gen_batch} streams (median of {args.repeats})")
    rows = []
    for name, model_cls, model_cfg in models(cfg):
        train = training_speed(model_cls, model_cfg, args, device)
        gen = None
        if not args.skip_inference and name != "gpt math":  # generation reads the cache with sdpa either way
            torch.manual_seed(0)
            model = model_cls(model_cfg).to(device)
            gen = inference_speed(model, Decoder if model_cls is Model else CachedDecoder, args, device)
        rows.append({"model": name, "train_tokens_per_second": train, "generate_tokens_per_second": gen})
    base = rows[0]
    header = f"{'model':<10} {'train tok/s':>12} {'vs gpt sdpa':>12} {'generate tok/s':>15} {'vs gpt':>8}"
    print(header)
    for row in rows:
        for key, ratio in (("train_tokens_per_second", "train_ratio"), ("generate_tokens_per_second", "generate_ratio")):
            row[ratio] = row[key] / base[key] if row[key] and base[key] else None
        print(f"{row['model']:<10} {cell(row['train_tokens_per_second'], '12,.0f')} {cell(row['train_ratio'], '12.3f')} "
              f"{cell(row['generate_tokens_per_second'], '15,.0f')} {cell(row['generate_ratio'], '8.3f')}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["config", "device", "batch_size", *rows[0].keys()])
            writer.writeheader()
            for row in rows:
                writer.writerow({"config": args.config, "device": local_device_name(device),
                                 "batch_size": args.batch_size, **row})
    return rows


def cell(value, spec):
    """`value` formatted by `spec`, or '-' as wide when there is none."""
    width = int(spec.split(",")[0].split(".")[0])
    return f"{value:{spec}}" if value is not None else f"{'-':>{width}}"


if __name__ == "__main__":
    main()
