"""The Neural Bloom Filter against the Bloom filter, the cuckoo filter, an LSTM and a Memory Network: space at a
target false-positive rate (thesis Table 5.1, Figures 5.2 and 5.4) and latency and throughput (Table 5.2).

    python projects/neural_bloom/bench.py --task database --minutes 5      # Table 5.1 on pgbooks words
    python projects/neural_bloom/bench.py --task extrapolation --minutes 5 --plot extrapolation.png  # Fig. 5.4
    python projects/neural_bloom/bench.py --task class --minutes 2         # Figure 5.2 a (also heavy, uniform)
    python projects/neural_bloom/bench.py --task timing                    # Table 5.2 only

Tasks (projects/neural_bloom/tasks.py): `database`, sets of 5000 contiguous keys of the sorted unique words of
the pgbooks train split (--books), half of the words held out for evaluation; `extrapolation`, the same universe,
trained on sets of 2..200 and evaluated on 50..250; `class`, `heavy`, `uniform`, the three sampling strategies
of 5.6.2 on a synthetic class-structured universe of 64-dim vectors (10 classes).

The Neural Bloom Filter trains for --minutes on this machine (Algorithm 3; several --nbf_sizes share it), the
LSTM and the Memory Network for --baseline_minutes each; every model is then is evaluated at each target rate as in 5.5: its threshold passes alpha / 2 of 50,000
negative queries of 10 test sets, its misses go into a backup Bloom filter at alpha / 2, and the space is the
state's 32-bit floats plus that backup filter. Of several NBF sizes the smallest total at each rate is shown (the
thesis's sweep). The classical filters are built on the same test sets and measured on the same negatives.
Loading the words, evaluation and timing come on top.
"""
import argparse
import gzip
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from languini.atomic_write import write_atomically
from languini.flags import add_bool_flag
from languini.timing import time_calls
from languini.flags import Parser
from projects.neural_bloom import classical, meta_learning, tasks
from projects.neural_bloom.configs import EncoderConfig, LSTMConfig, MemNetConfig, NBFConfig
from projects.neural_bloom.model import build

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BOOKS = REPO_ROOT.parent / "shared" / "data" / "pgbooks" / "train"
TASKS = ("database", "extrapolation", "class", "heavy", "uniform", "timing")
# per task: training set size(s), evaluation sizes, sets per step, queries per set per step, NBF sizes
TASK_SHAPES = {
    "database": dict(train=5000, eval=(5000,), batch_sets=1, queries=1024, sizes="16x4"),
    "extrapolation": dict(train=(2, 200), eval=(50, 100, 150, 200, 250), batch_sets=8, queries=256, sizes="16x2"),
    "class": dict(train=200, eval=(200,), batch_sets=8, queries=256, sizes="2x2,8x2"),
    "heavy": dict(train=200, eval=(200,), batch_sets=8, queries=256, sizes="16x2,64x2"),
    "uniform": dict(train=200, eval=(200,), batch_sets=8, queries=256, sizes="16x2,64x2"),
    "timing": dict(sizes="16x4"),
}
COMMAND_FILE = "command.json"  # in a --run_dir: the training's flags
EVALUATION_FLAGS = ("rates", "test_sets", "negatives", "eval_sizes", "timing", "out", "plot", "device")
THESIS_TABLE_5_1 = {  # kilobits at 5%, 1%, 0.1%: storing 5000 row keys (GigaWord v5 tokens)
    "Neural Bloom Filter": (0.871, 1.5, 24.5), "Bloom Filter": (31.2, 47.9, 72.2), "Cuckoo Filter": (33.1, 45.3, 62.6)}
THESIS_TABLE_5_2 = (  # name, query + insert latency CPU / GPU, query throughput CPU / GPU, insert CPU / GPU
    ("Bloom Filter*", "0.02ms", "-", "61K", "-", "61K", "-"),
    ("Neural Bloom Filter", "5.1ms", "13ms", "3.5K", "105K", "3.2K", "101K"),
    ("LSTM", "5.0ms", "13ms", "3.1K", "107K", "2.4K", "4.6K"),
    ("Learned Index", "780ms", "1.36s", "3.1K", "107K", "25", "816"))


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """'16x4,64x2' -> [(16, 4), (64, 2)]: memory slots x word size."""
    try:
        sizes = [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        sizes = []
    if not sizes or any(len(s) != 2 or min(s) < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes are SLOTSxWORD separated by commas (16x4,64x2), not {text!r}")
    return sizes


def parse_rates(text: str) -> list[float]:
    rates = [float(r) for r in text.split(",") if r]
    if not rates or not all(0 < r < 1 for r in rates):
        raise argparse.ArgumentTypeError(f"rates are false-positive rates in (0, 1), not {text!r}")
    return rates


def make_task(args):
    """(task, encoder config, a one-line description)."""
    shape = TASK_SHAPES[args.task]
    train_size = args.set_size or shape["train"]
    if args.task in ("database", "extrapolation"):
        started = time.perf_counter()
        words = tasks.read_words(args.books)
        train_words, eval_words = tasks.split_words(words, args.held_out, seed=args.seed)
        enc = EncoderConfig(kind="bytes", max_len=args.max_len, channels=args.channels, z_dim=args.z_dim)
        task = tasks.DatabaseTask(tasks.word_universe(train_words, enc.max_len),
                                  tasks.word_universe(eval_words, enc.max_len), train_size)
        what = (f"{len(words):,} unique words of {args.books} ({time.perf_counter() - started:.0f} s to read), "
                f"{len(train_words):,} to train on and {len(eval_words):,} held out")
        return task, enc, what
    train, held_out = tasks.synthetic_classes(10, args.per_class, args.per_class // 4, dim=64, seed=args.seed)
    enc = EncoderConfig(kind="vector", input_dim=64, z_dim=args.z_dim)
    if args.task == "class":
        task = tasks.ClassTask(train, held_out, train_size)
    elif args.task == "uniform":
        task = tasks.UniformTask(train, held_out, train_size)
    else:
        task = tasks.HeavyHitterTask(train, train_size, seed=args.seed)
    what = (f"synthetic 64-dim vectors, 10 classes, {len(train):,} to train on, "
            f"{len(task.eval):,} evaluated ({'the training universe, as the thesis' if args.task == 'heavy' else 'held out'})")
    return task, enc, what


def neural_models(args, enc: EncoderConfig, largest_set: int) -> list[tuple[str, str, object]]:
    """(label, kind, config) of every neural model to train."""
    models = [(f"NBF {m}x{d}", "nbf", NBFConfig(memory_slots=m, word_size=d, write_scale=1 / largest_set))
              for m, d in args.nbf_sizes]
    if args.lstm:
        models.append((f"LSTM {args.lstm_hidden}", "lstm", LSTMConfig(hidden_size=args.lstm_hidden)))
    if args.memnet:
        models.append((f"MemNet {args.memnet_word}", "memnet", MemNetConfig(word_size=args.memnet_word)))
    return models


def real_filter(name: str, keys: list, alpha: float):
    if name == "Bloom filter (real)":
        bloom = classical.BloomFilter(len(keys), alpha)
        bloom.add(keys)
        return bloom
    return classical.cuckoo_for(keys, alpha)


def classical_points(draws, task, rates) -> dict:
    """{name: {alpha: (mean bits, measured fpr)}} of the real Bloom and cuckoo filters built on every test set and
    queried with the same negatives as the neural models."""
    out = {}
    for name in ("Bloom filter (real)", "Cuckoo filter (real)"):
        out[name] = {}
        for alpha in rates:
            bits, hits, total = 0, 0, 0
            for members, negatives in draws:
                keys = [task.eval.keys[i] for i in members.tolist()]
                f = real_filter(name, keys, alpha)
                if not f.contains(keys).all():
                    raise AssertionError(f"{name} lost an element: a classical filter never may")
                hits += int(f.contains([task.eval.keys[i] for i in negatives.tolist()]).sum())
                total += len(negatives)
                bits += f.bits
            out[name][alpha] = (bits / len(draws), hits / total)
    return out


def kb(bits: float) -> str:
    return f"{bits / 1000:.3g}kb" if bits >= 1000 else f"{bits:.0f}b"


def pct(rate: float) -> str:
    return f"{100 * rate:.3g}%"


def space_table(n: int, rates, neural: dict, classic: dict) -> list[str]:
    """The Table 5.1-style rows: kilobits at each rate, the ratio to the Bloom filter, then the details."""
    lines = [f"{'space at the target rate':34s}" + "".join(f"{pct(a):>12s}" for a in rates)]

    def row(name, cells):
        lines.append(f"{name:34s}" + "".join(f"{c:>12s}" for c in cells))

    nbf = {a: min((p[a] for label, p in neural.items() if label.startswith("NBF")), key=lambda p: p.total_bits,
                  default=None) for a in rates}
    if any(nbf.values()):
        row("Neural Bloom Filter (+ backup)", [kb(nbf[a].total_bits) for a in rates])
    row("Bloom filter (analytic, optimal)", [kb(classical.bloom_bits(n, a)) for a in rates])
    row("Bloom filter (real)", [kb(classic["Bloom filter (real)"][a][0]) for a in rates])
    row("Cuckoo filter (thesis formula)", [kb(classical.cuckoo_bits(n, a)) for a in rates])
    row("Cuckoo filter (real)", [kb(classic["Cuckoo filter (real)"][a][0]) for a in rates])
    for label, points in neural.items():
        if not label.startswith("NBF") or len([k for k in neural if k.startswith("NBF")]) > 1:
            row(f"{label} (+ backup)", [kb(points[a].total_bits) for a in rates])
    if any(nbf.values()):
        row("Bloom (analytic) / NBF", [f"{classical.bloom_bits(n, a) / nbf[a].total_bits:.2f}x" for a in rates])
    lines.append("")
    lines.append(f"{'details':22s}{'rate':>6s}{'state':>9s}{'misses':>9s}{'backup':>9s}{'total':>9s}"
                 f"{'model FPR':>10s}{'+backup':>9s}{'fresh sets':>11s}")
    for label, points in neural.items():
        for a in rates:
            p = points[a]
            lines.append(f"{label:22s}{pct(a):>6s}{kb(p.state_bits):>9s}{p.false_negatives:9.1f}"
                         f"{kb(p.backup_bits):>9s}{kb(p.total_bits):>9s}{pct(p.model_fpr):>10s}"
                         f"{pct(p.combined_fpr):>9s}{pct(p.check_fpr):>11s}")
    for name, points in classic.items():
        lines.append(f"{name:22s} measured FPR " + ", ".join(f"{pct(points[a][1])} at {pct(a)}" for a in rates))
    return lines


def run_space(args) -> dict:
    task, enc, what = make_task(args)
    shape = TASK_SHAPES[args.task]
    device = torch.device(args.device)
    for universe in {id(u): u for u in (task.train, task.eval)}.values():  # the heavy task's are one universe
        universe.inputs = universe.inputs.to(device)
    largest = max(task.set_sizes)
    models = neural_models(args, enc, largest)
    nbf_seconds = 60 * args.minutes / max(1, sum(kind == "nbf" for _, kind, _ in models))
    baseline_seconds = 60 * (args.minutes / 4 if args.baseline_minutes is None else args.baseline_minutes)
    sizes = f"{task.set_sizes[0]}..{largest}" if task.set_sizes[0] != largest else f"{largest}"
    print(f"task {args.task}: {what}")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    nbf_budget = f"{args.nbf_steps} steps" if args.nbf_steps else f"{nbf_seconds:.0f} s"
    if args.curriculum:
        sizes += f" (growing from {args.curriculum.start} over the first {args.curriculum.steps} steps)"
    print(f"training on {where}, sets of {sizes}: each NBF for {nbf_budget}, "
          f"each baseline for {baseline_seconds:.0f} s")
    if args.run_dir:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        if not args.evaluate:  # the latest training command, for --evaluate to rebuild the task and the models
            write_atomically(args.run_dir / COMMAND_FILE, lambda f: f.write(json.dumps({"argv": args.argv}).encode()))
    trained = {}
    for i, (label, kind, cfg) in enumerate(models):
        torch.manual_seed(args.seed + i)
        model = build(kind, cfg, enc).to(device)
        by_steps = kind == "nbf" and args.nbf_steps
        seconds = math.inf if by_steps else nbf_seconds if kind == "nbf" else baseline_seconds
        # what a checkpoint must agree on: the model, its input and the task (not the budget)
        identity = {"model": label, "config": asdict(cfg), "encoder": asdict(enc), "task": args.task,
                    "books": str(args.books), "held_out": args.held_out, "per_class": args.per_class,
                    "set_size": args.set_size}
        training = dict(lr=args.lr, batch_sets=args.batch_sets or shape["batch_sets"],
                        queries=args.queries or shape["queries"], seed=args.seed + i, curriculum=args.curriculum)
        checkpoint = args.run_dir / checkpoint_name(label) if args.run_dir else None
        if args.evaluate:
            saved = meta_learning.load_checkpoint(checkpoint, meta_learning.run_identity(identity, **training))
            model.load_state_dict(saved["model"])
            model.eval()
            stats = meta_learning.trained_stats(saved)
        else:
            stats = meta_learning.train(model, task, seconds, desc=label, max_steps=args.nbf_steps if by_steps else None,
                                        checkpoint=checkpoint, save_every=args.save_every, identity=identity,
                                        **training)
        print(f"  {label}: {stats['steps']} steps in {stats['seconds']:.0f} s, loss {stats['loss']:.4f}"
              + (f" (from {checkpoint})" if args.evaluate else ""))
        trained[label] = (model, stats)
    results = {"task": args.task, "what": what, "sizes": {}}
    for n in args.eval_sizes or ([args.set_size] if args.set_size else shape["eval"]):
        neural, draws = {}, None
        for label, (model, _) in trained.items():
            neural[label], draws = meta_learning.evaluate(model, task, n, args.rates, test_sets=args.test_sets,
                                                          negatives=args.negatives, seed=args.seed + 1000)
        if draws is None:
            draws = meta_learning.draw_sets(task, n, args.test_sets, args.negatives,
                                            torch.Generator().manual_seed(args.seed + 1000))
        classic = classical_points(draws, task, args.rates)
        print(f"\nsets of {n}: false-positive rates over {sum(len(q) for _, q in draws):,} negative queries of "
              f"{len(draws)} test sets (1 kb = 1000 bits)")
        print("\n".join(space_table(n, args.rates, neural, classic)))
        results["sizes"][n] = {"neural": {k: {str(a): {**asdict(p), "backup_bits": p.backup_bits,
                                                         "total_bits": p.total_bits} for a, p in v.items()}
                                          for k, v in neural.items()},
                               "classical": {k: {str(a): {"bits": b, "fpr": f} for a, (b, f) in v.items()}
                                             for k, v in classic.items()}}
    if args.task == "database":
        print("\nthesis Table 5.1 (5000 GigaWord keys; kb):")
        for name, cells in THESIS_TABLE_5_1.items():
            print(f"{name:34s}" + "".join(f"{kb(1000 * c):>12s}" for c in cells))
    results["training"] = {label: stats for label, (_, stats) in trained.items()}
    return results


def checkpoint_name(label: str) -> str:
    """'NBF 16x4' -> 'nbf_16x4.pt'."""
    return label.lower().replace(" ", "_") + ".pt"


def parse_curriculum(text: str) -> meta_learning.Curriculum:
    """'50:1000' -> sets growing from 50 to the task's size over the first 1000 steps."""
    try:
        start, steps = (int(v) for v in text.split(":"))
        return meta_learning.Curriculum(start, steps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a curriculum is START:STEPS with START >= 1 and STEPS >= 1 (50:1000), "
                                         f"not {text!r}") from None


def random_keys(count: int, length: int, seed: int) -> list[bytes]:
    letters = np.random.default_rng(seed).integers(ord("a"), ord("z") + 1, size=(count, length), dtype=np.uint8)
    return [row.tobytes() for row in letters]


@torch.no_grad()
def run_timing(args) -> dict:
    """Table 5.2: latency of one insert + one query, throughput of a batch of --timing_batch queries or inserts;
    keys of --key_len random letters (the thesis's 64); the neural encoders read all of them."""
    device = torch.device(args.device)
    keys = random_keys(args.timing_batch, args.key_len, args.seed)
    one = keys[:1]
    enc = EncoderConfig(kind="bytes", max_len=args.key_len, channels=args.channels, z_dim=args.z_dim)
    batch_x = tasks.encode_bytes([k.decode() for k in keys], args.key_len).to(device)[None]
    one_x = batch_x[:, :1]
    rows = []

    def timed(fn, where=device):  # CUDA events time the GPU's work; the classical filters run on the CPU
        return time_calls(fn, where, args.timing_repeats, warmup=1).median

    # classical filters sized for twice the batch at 1%: half full after it, room for the repeated latency inserts
    for name, make in (("Bloom filter (real)", lambda: classical.BloomFilter(2 * len(keys), 0.01)),
                       ("Cuckoo filter (real)", lambda: classical.CuckooFilter(2 * len(keys), 0.01))):
        filled = make()
        filled.add(keys)
        cpu = torch.device("cpu")
        latency = timed(lambda: filled.add(one), cpu) + timed(lambda: filled.contains(one), cpu)
        rows.append((name, latency, len(keys) / timed(lambda: filled.contains(keys), cpu),
                     len(keys) / timed(lambda: make().add(keys), cpu), "cpu"))
    m, d = args.nbf_sizes[0]
    for name, kind, cfg in ((f"Neural Bloom Filter {m}x{d}", "nbf", NBFConfig(memory_slots=m, word_size=d)),
                            (f"LSTM {args.lstm_hidden}", "lstm", LSTMConfig(hidden_size=args.lstm_hidden))):
        model = build(kind, cfg, enc).to(device).eval()
        state = model.write(batch_x)
        if kind == "nbf":  # an insert adds one element's w a^T to the memory
            insert_one, insert_all = (lambda: state + model.write(one_x)), (lambda: state + model.write(batch_x))
        else:  # an insert is one more LSTM step from the current state
            h, c = state.chunk(2, dim=-1)
            z_one = lambda: model.f_enc(one_x)  # noqa: E731
            insert_one = lambda: model.lstm(z_one(), (h[None], c[None]))  # noqa: E731
            insert_all = lambda: model.write(batch_x)  # noqa: E731
        latency = timed(insert_one) + timed(lambda: model.read(state, one_x))
        rows.append((name, latency, len(keys) / timed(lambda: model.read(state, batch_x)),
                     len(keys) / timed(insert_all), device.type))
    print(f"\nTable 5.2 on this machine ({device.type}, {torch.get_num_threads()} threads): keys of {args.key_len} "
          f"bytes, batches of {len(keys):,}, median of {args.timing_repeats} runs; neural models untrained (same cost)")
    print(f"{'':32s}{'query+insert latency':>22s}{'query /s':>12s}{'insert /s':>12s}{'device':>8s}")
    for name, latency, query, insert, where in rows:
        print(f"{name:32s}{latency * 1e3:>20.3f}ms{query:>12,.0f}{insert:>12,.0f}{where:>8s}")
    print("thesis Table 5.2 (Xeon E5-1650 v2 CPU / Quadro P6000 GPU, TensorFlow):")
    print(f"{'':32s}{'latency CPU':>12s}{'GPU':>8s}{'query CPU':>11s}{'GPU':>8s}{'insert CPU':>11s}{'GPU':>8s}")
    for name, *cells in THESIS_TABLE_5_2:
        print(f"{name:32s}" + "".join(f"{c:>{w}s}" for c, w in zip(cells, (12, 8, 11, 8, 11, 8))))
    return {"device": device.type, "rows": [dict(zip(("name", "latency_s", "query_per_s", "insert_per_s", "device"),
                                                     r)) for r in rows]}


def plot_extrapolation(results: dict, rates, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results["sizes"])
    fig, axes = plt.subplots(1, len(rates), figsize=(4 * len(rates), 3.2), squeeze=False)
    for ax, alpha in zip(axes[0], rates):
        key = str(alpha)
        models = results["sizes"][sizes[0]]["neural"]
        for label in models:
            ax.plot(sizes, [results["sizes"][n]["neural"][label][key]["total_bits"] for n in sizes], "o-", label=label)
        ax.plot(sizes, [classical.bloom_bits(n, alpha) for n in sizes], "k--", label="Bloom (analytic)")
        ax.axvline(200, color="grey", lw=0.8)
        ax.set(title=f"FPR {pct(alpha)}", xlabel="set size", ylabel="bits")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    write_atomically(path, lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=120))
    print(f"plot: {path}")


def save_words(books: Path, folder: Path) -> dict:
    """The universe of `books` as one gzip file of words, a line each: read_words gives the same words back."""
    words = tasks.read_words(books)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "words.txt.gz"
    write_atomically(path, lambda f: f.write(gzip.compress("\n".join(words).encode(), mtime=0)))
    print(f"{len(words):,} unique words of {books} -> {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return {"words": len(words), "path": str(path)}


def evaluation_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The training command saved in args.evaluate, with this command's evaluation flags."""
    command = args.evaluate / COMMAND_FILE
    if not command.exists():
        p.error(f"--evaluate {args.evaluate}: no {COMMAND_FILE} there; it takes the --run_dir of a training")
    trained = p.parse_args(json.loads(command.read_text())["argv"])
    for flag in EVALUATION_FLAGS:
        setattr(trained, flag, getattr(args, flag))
    trained.run_dir, trained.evaluate, trained.argv = args.evaluate, args.evaluate, None
    return trained


def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=TASKS, default="database")
    p.add_argument("--minutes", type=float, default=5.0, help="training time of the NBF (shared by its sizes)")
    p.add_argument("--nbf_steps", type=int, default=0,
                   help="train each NBF for this many steps instead of --minutes (the same work on a busy machine)")
    p.add_argument("--baseline_minutes", type=float, default=None,
                   help="training time of the LSTM and of the Memory Network, each (default: a quarter of --minutes)")
    p.add_argument("--rates", type=parse_rates, default=[0.05, 0.01, 0.001], help="target false-positive rates")
    p.add_argument("--nbf_sizes", type=parse_sizes, default=None,
                   help="NBF memory sizes SLOTSxWORD, each trained; the smallest total per rate is shown "
                        "(default: the task's own)")
    add_bool_flag(p, "--lstm", True, "train and evaluate the LSTM baseline")
    add_bool_flag(p, "--memnet", True, "train and evaluate the Memory Network baseline")
    add_bool_flag(p, "--timing", True, "print Table 5.2 (latency, throughput) after the space table")
    p.add_argument("--lstm_hidden", type=int, default=16)
    p.add_argument("--memnet_word", type=int, default=2)
    p.add_argument("--books", type=Path, default=DEFAULT_BOOKS, help="folder of *.txt.gz books (database tasks)")
    p.add_argument("--held_out", type=float, default=0.5, help="share of the words held out for evaluation")
    p.add_argument("--per_class", type=int, default=2000, help="training elements per class (synthetic tasks)")
    p.add_argument("--set_size", type=int, default=0, help="training set size (0: the task's own)")
    p.add_argument("--eval_sizes", type=lambda t: [int(v) for v in t.split(",")], default=None)
    p.add_argument("--max_len", type=int, default=16, help="bytes of a word the encoder reads")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--z_dim", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch_sets", type=int, default=0, help="sets per training step (0: the task's own)")
    p.add_argument("--queries", type=int, default=0, help="queries per set and step (0: the task's own)")
    p.add_argument("--test_sets", type=int, default=10)
    p.add_argument("--negatives", type=int, default=50_000, help="negative queries over all test sets")
    p.add_argument("--key_len", type=int, default=64, help="timing: bytes per key")
    p.add_argument("--timing_batch", type=int, default=10_000)
    p.add_argument("--timing_repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the neural models train, are evaluated and timed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write every number as JSON here")
    p.add_argument("--plot", type=Path, help="extrapolation: bits against set size, one panel per rate")
    p.add_argument("--curriculum", type=parse_curriculum, default=None,
                   help="START:STEPS: training sets grow geometrically from START elements to the task's size over "
                        "the first STEPS steps (default: none, the task's sizes from the start)")
    p.add_argument("--run_dir", type=Path, default=None,
                   help="save each model's training here (every --save_every s and at the end) and continue from "
                        "it when run again: a long training that survives interruption")
    p.add_argument("--save_every", type=float, default=60.0, help="seconds between checkpoints of --run_dir")
    p.add_argument("--evaluate", type=Path, default=None, metavar="RUN_DIR",
                   help="evaluate the models saved in RUN_DIR (by a --run_dir training, finished or not) without "
                        "training: the task and models are the training command's, the evaluation flags (--rates, "
                        "--test_sets, --negatives, --eval_sizes, --timing, --out, --plot, --device) this one's")
    p.add_argument("--save_words", type=Path, default=None, metavar="FOLDER",
                   help="write the unique words of --books to FOLDER/words.txt.gz and stop: a --books folder of the "
                        "same universe for a machine without the corpus (a lent GPU; carry it, never commit it)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if args.save_words:
        return save_words(args.books, args.save_words)
    if args.evaluate:
        args = evaluation_args(p, args)
    else:
        args.argv = argv
    if args.plot and args.task != "extrapolation":
        p.error("--plot draws the extrapolation task (Figure 5.4)")
    if args.nbf_steps < 0:
        p.error(f"--nbf_steps must be a number of steps (0: train for --minutes), not {args.nbf_steps}")
    args.nbf_sizes = args.nbf_sizes or parse_sizes(TASK_SHAPES[args.task]["sizes"])
    results = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.task != "timing":
        results.update(run_space(args))
        if args.plot:
            plot_extrapolation(results, args.rates, args.plot)
    if args.task == "timing" or args.timing:
        results["timing"] = run_timing(args)
    if args.out:
        write_atomically(args.out, lambda f: f.write(json.dumps(results, indent=1, default=str).encode()))
        print(f"results: {args.out}")
    return results


if __name__ == "__main__":
    main()
