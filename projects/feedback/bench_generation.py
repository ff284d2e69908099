"""Token-by-token generation of the Feedback Transformer against the GPT of the same width and depth with its
key/value cache, at long contexts (the slides: 2,176 against 592 tokens/s, because one memory vector per step is
shared by all layers: one key/value projection and one cache instead of L).

    python projects/feedback/bench_generation.py --config cpu --contexts 128 256 512 1024 2048 --streams 1 16 \
        --threads 1 --clock process --repeats 5

For each context C: the Feedback Transformer with a memory of tau = C steps and the GPT (projects/gpt's, from
languini/transformer.py in gpt_baseline.py) with a cache and position table of C positions, both with the config's
width, depth and heads and fresh random weights, in the run's precision; --streams sequences generated at once.
Two measurements per model, each after an untimed run of --tokens steps, every run with a fresh decoder, the two
models' runs alternating (a shared machine's load falls on both):
- **at C**: tokens/s of --tokens steps at positions C - tokens .. C - 1: the GPT's cache holds nearly C positions
  (random keys and values: the time does not depend on them), the Feedback Transformer's ring is full (a random
  carried memory of tau vectors). The median of --repeats runs.
- **from empty** (unless --from_empty false): tokens/s over generating C tokens from an empty context, the GPT's
  cache growing from 1 position, the Feedback Transformer's ring from 0 slots. One timed run.
A table is printed with the Feedback Transformer's ratio to the GPT; --csv writes its rows.
"""
import argparse
import csv
import dataclasses
import io
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from tqdm import tqdm

from languini.atomic_write import write_atomically
from languini.flags import Parser, add_bool_flag
from languini.throughput import local_device_name
from languini.timing import time_phases
from languini.trainer import precision_for
from projects.feedback import configs
from projects.feedback.bench_speed import cell
from projects.feedback.gpt_baseline import GPT, CachedDecoder, GPTConfig
from projects.feedback.model import Decoder, Model

COLUMNS = ("context", "streams", "gpt_at_context", "feedback_at_context", "ratio_at_context", "gpt_from_empty",
           "feedback_from_empty", "ratio_from_empty")


def models(cfg: configs.ModelConfig, context: int, device):
    """(GPT, Feedback Transformer) of cfg's width, depth and heads for a context of `context` tokens, in eval mode."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=cfg.vocab_size, seq_len=context, d_model=cfg.d_model, n_layers=cfg.n_layers,
                        n_heads=cfg.n_heads, d_head=cfg.d_head, mlp_ratio=cfg.mlp_ratio, attention="sdpa"))
    torch.manual_seed(0)
    feedback = Model(dataclasses.replace(cfg, seq_len=context, mem_len=context))
    return gpt.to(device).eval(), feedback.to(device).eval()


def new_decoder(model, streams: int, context: int, tokens: int, from_empty: bool, device, cuda_graph: bool = False):
    """A decoder of an empty context, or one about to generate positions context - tokens .. context - 1: the GPT's
    cache, the Feedback Transformer's ring of tau = context slots, full of random keys and values (cuda_graph: its
    full ring's steps replayed from a CUDA graph, captured here by one step; from empty the ring is full only after
    the context, so no step is replayed)."""
    if isinstance(model, Model):
        state = None if from_empty else torch.randn(streams, context, model.cfg.d_model, device=device)
        decoder = Decoder(model, state, batch=streams, cuda_graph=cuda_graph)
        if cuda_graph and state is not None:
            decoder.step(torch.zeros(streams, dtype=torch.long, device=device))
        return decoder
    decoder = CachedDecoder(model, batch=streams)
    if not from_empty:
        decoder.cache.normal_()
        decoder.steps = context - tokens
    return decoder


def tokens_per_second(models: dict, streams: int, context: int, tokens: int, repeats: int, from_empty: bool,
                      precision: str, device, clock, cuda_graph: bool = False) -> dict:
    """{name: tokens/s} of `tokens` steps at the end of the context, or of all `context` steps from an empty one:
    the median of `repeats` runs after an untimed one of `tokens` steps, each run with a fresh decoder (built
    untimed), the models' runs alternating so that both see the same load of a shared machine."""
    autocast, _, _ = precision_for(device, precision)
    inputs = torch.randint(min(m.cfg.vocab_size for m in models.values()), (context, streams), device=device)
    steps = context if from_empty else tokens
    seconds = {name: [] for name in models}
    for repeat in range(-1, repeats):
        for name, model in models.items():
            with autocast():
                decoder = new_decoder(model, streams, context, tokens, from_empty, device, cuda_graph)

            def run(mark, decoder=decoder, n=tokens if repeat < 0 else steps):
                with autocast():
                    for t in range(n):
                        decoder.step(inputs[t])
                mark()

            elapsed = time_phases(run, device, 1, 0, cpu_clock=clock)[0][0]
            if repeat >= 0:
                seconds[name].append(elapsed)
    return {name: streams * steps / statistics.median(runs) for name, runs in seconds.items()}


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cpu", choices=sorted(configs.SIZES),
                        help="width, depth and heads of both models (its mem_len and seq_len are set to each context)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16], help="sequences generated at once")
    parser.add_argument("--tokens", type=int, default=32, help="timed steps per run at each context")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs at each context (the median)")
    add_bool_flag(parser, "--from_empty", True, "also time generating the whole context from an empty one")
    parser.add_argument("--precision", default="auto", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp32")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    parser.add_argument("--clock", default="wall", choices=("wall", "process"),
                        help="on a CPU: wall time, or the seconds this process ran (with --threads 1: what other "
                             "processes of a shared machine take is not counted)")
    add_bool_flag(parser, "--cuda_graph", False, "on CUDA: the Feedback Transformer's full-ring steps replayed "
                  "from a CUDA graph (Decoder(cuda_graph=True), captured before the timed steps; at C only)")
    parser.add_argument("--csv", default=None, help="write the rows to this CSV")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if min(args.contexts) < args.tokens or args.tokens < 1 or min(args.streams) < 1 or args.repeats < 1:
        raise SystemExit(f"need every context >= --tokens ({args.tokens}) >= 1, streams >= 1 and repeats >= 1")
    cfg = configs.get(args.config)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.cuda_graph and device.type != "cuda":
        raise SystemExit("--cuda_graph needs a CUDA device")
    print(f"{args.config}: d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.d_head}, vocab "
          f"{cfg.vocab_size}; {local_device_name(device)}, {torch.get_num_threads()} threads, precision "
          f"{args.precision}, torch {torch.__version__}; {args.clock} clock; at each context {args.tokens} tokens, "
          f"median of {args.repeats}; tokens/s")
    rows = []
    jobs = [(c, s) for c in args.contexts for s in args.streams]
    for context, streams in tqdm(jobs, desc="contexts x streams", file=sys.stderr):
        gpt, feedback = models(cfg, context, device)
        row = {"context": context, "streams": streams}
        for kind, from_empty, repeats in (("at_context", False, args.repeats), ("from_empty", True, 1)):
            speeds = (tokens_per_second({"gpt": gpt, "feedback": feedback}, streams, context, args.tokens, repeats,
                                        from_empty, args.precision, device, clock, args.cuda_graph)
                      if args.from_empty or not from_empty else {"gpt": None, "feedback": None})
            row.update({f"{name}_{kind}": speed for name, speed in speeds.items()})
        for kind in ("at_context", "from_empty"):
            gpt_speed = row[f"gpt_{kind}"]
            row[f"ratio_{kind}"] = row[f"feedback_{kind}"] / gpt_speed if gpt_speed else None
        rows.append(row)
    print(f"{'context':>8} {'streams':>8} | {'at context: gpt':>16} {'feedback':>10} {'ratio':>7} | "
          f"{'from empty: gpt':>16} {'feedback':>10} {'ratio':>7}")
    for row in rows:
        print(f"{row['context']:>8} {row['streams']:>8} | {cell(row['gpt_at_context'], '16,.0f')} "
              f"{cell(row['feedback_at_context'], '10,.0f')} {cell(row['ratio_at_context'], '7.2f')} | "
              f"{cell(row['gpt_from_empty'], '16,.0f')} {cell(row['feedback_from_empty'], '10,.0f')} "
              f"{cell(row['ratio_from_empty'], '7.2f')}")
    if args.csv:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=["config", "device", *COLUMNS])
        writer.writeheader()
        for row in rows:
            writer.writerow({"config": args.config, "device": local_device_name(device), **row})
        write_atomically(Path(args.csv), lambda f: f.write(text.getvalue().encode()))
    return rows


if __name__ == "__main__":
    main()
