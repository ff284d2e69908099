"""A synthetic recall task that needs the Compressive Transformer's longer temporal range (Rae, thesis 6.3.3: a
Transformer-XL of memory n reaches l x n positions back, a Compressive Transformer l x (n_m + c n_cm) at the
attention cost of n_m + n_cm memories). Both models (projects/compressive, Transformer-XL with cmem_len 0 and
mem_len n_m + n_cm) are trained on the same streams and scored on queries whose answer lies at a distance no
Transformer-XL query can reach and every Compressive Transformer query can.

    python projects/compressive/recall.py                 # defaults: 1 layer, segment 16, n_m 16, n_cm 32, c 2

The task. Each stream is a sequence of episodes of E positions (E a multiple of c). An episode opens with a
payload symbol (one of --payloads) held for c positions, aligned to a multiple of c; the rest are random filler
symbols (--fillers, a set disjoint from the payloads), except a few query positions, which hold the query token
and whose target is the episode's payload. Only queries are scored (and trained): the target of every other
position is ignored. A query's distance d is the distance to the payload's nearest (last) copy. Queries are drawn
in three bands of distance, --queries distinct distances per band and episode:
  near:   1 .. n_m, uncompressed for both models (the control: both must learn the lookup here);
  far:    just beyond the farthest position any Transformer-XL query can reach, up to n_m + c n_cm, the span
          every Compressive Transformer query sees (its last c n_cm positions through the compressed memory);
  beyond: just beyond the farthest position any Compressive Transformer query can reach (the second control:
          neither model can answer, so both sit at chance).
E is at least the Compressive Transformer's farthest reach and the previous payload at least E + 1 back, so at
every query the episode's payload is the only one either model can see: recall is a content lookup (the query
attends to the one payload in view and copies it), which one attention layer learns, and which does not depend on
where in its segment a query falls. A positional task ("the symbol exactly D back") would: the relative positions
count the prefix [compressed; memory] as contiguous slots, so the slot D true positions back from segment index i
sits at a positional distance that changes with i (by 1 - 1/c per step), and a model without absolute positions
cannot know i.

Why held symbols and positions? f_c merges c consecutive memories into one slot. The segment, n_m and E are
multiples of c, so the compression's windows are the aligned c-blocks of the stream and a payload fills exactly
one window, and a compressed slot holds one symbol: a mean keeps it exactly (--compression mean), and the
attention-reconstruction loss rewards a convolution that keeps what the attention reads. Filler pairs are random
and may be blurred by f_c; nothing asks for them.

Which distances each model sees. Memories are carried from segment to segment; a query at index i of its segment
(0 <= i < T) reads the segment up to itself, the n_m memories before the segment and, for the Compressive
Transformer, the n_cm compressed slots that cover the c n_cm positions before those: every distance up to
i + W, with W = n_m + c n_cm (Compressive) or W = n_m + n_cm (Transformer-XL). With l layers a position's
output also carries what earlier positions read, so information can hop l times; the farthest reach is found by a
search over the l hops (for one layer it is T - 1 + W). The far band starts past the Transformer-XL's farthest
reach and ends at the Compressive Transformer's W (its reach at i = 0), so no Transformer-XL query sees the far
payload and every Compressive one does. With c = 2 and 2 layers the band is empty (a 2-layer Transformer-XL
reaches about T - 1 + 2 (n_m + n_cm)); use --compression_rate 4 or more there.

Scoring: accuracy of the arg-max over the whole vocabulary, per band, on fresh streams (another seed) read with
the memory carried, after training on streams of --batch_size rows, one segment per step, with AdamW and the
attention-reconstruction loss added to the task loss as the trainer does (aux["reconstruction"]). Chance is
1 / --payloads. This is a demonstration of the range, not a timed test; its numbers are this run's.
"""
import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from languini.flags import Parser
from projects.compressive import configs
from projects.compressive.model import Model

BANDS = ("near", "far", "beyond")
IGNORE = -1  # target of every position that is not a query


@dataclass(frozen=True)
class RecallTask:
    seq_len: int = 16  # T: tokens per segment
    mem_len: int = 16  # n_m of the Compressive Transformer
    cmem_len: int = 32  # n_cm; the Transformer-XL gets mem_len + cmem_len memories
    compression_rate: int = 2  # c
    n_layers: int = 1
    n_payloads: int = 16
    n_fillers: int = 16
    queries: int = 3  # distinct query distances per band and episode (fewer when a band is narrower)

    def __post_init__(self):
        c = self.compression_rate
        if min(self.seq_len, self.mem_len, self.cmem_len, c, self.n_layers, self.n_payloads, self.n_fillers,
               self.queries) < 1 or c < 2:
            raise ValueError(f"every size must be positive and the compression rate at least 2: {self}")
        if self.seq_len % c or self.mem_len % c:
            raise ValueError(f"the segment ({self.seq_len}) and n_m ({self.mem_len}) must be multiples of c ({c}), "
                             "so that the compression windows are the stream's aligned c-blocks")
        far = self.bands()["far"]
        if far[0] > far[1]:
            raise ValueError(f"no distance is beyond the Transformer-XL's farthest reach ({far[0] - 1}) and within "
                             f"the Compressive Transformer's n_m + c n_cm ({far[1]}); raise cmem_len or the "
                             "compression rate, or lower the segment or the layers")

    # tokens: fillers 0 .. F-1, payloads F .. F+P-1, then the query token
    @property
    def query_token(self) -> int:
        return self.n_fillers + self.n_payloads

    @property
    def vocab_size(self) -> int:
        return self.n_fillers + self.n_payloads + 1

    def window(self, compressive: bool) -> int:
        """W: a query at segment index i reads every distance up to i + W (memories full)."""
        if compressive:
            return self.mem_len + self.compression_rate * self.cmem_len
        return self.mem_len + self.cmem_len

    def farthest(self, compressive: bool) -> int:
        """The farthest distance any query can draw information from through n_layers hops: a hop from segment
        index i reaches back any distance up to i + W and lands at index (i - distance) mod T."""
        T, W = self.seq_len, self.window(compressive)
        reach = [0] * T  # farthest reach from each segment index with 0 hops
        for _ in range(self.n_layers):
            reach = [max(hop + reach[(i - hop) % T] for hop in range(i + W + 1)) for i in range(T)]
        return max(reach)

    def bands(self) -> dict[str, tuple[int, int]]:
        """Inclusive ranges of query distances (to the payload's last copy)."""
        far = (self.farthest(False) + 1, self.window(True))
        width = max(far[1] - far[0] + 1, 1)
        beyond_start = self.farthest(True) + 1
        return {"near": (1, self.mem_len), "far": far, "beyond": (beyond_start, beyond_start + width - 1)}

    def coverage(self, band: str, compressive: bool) -> str:
        """'all' when every query of the band is within the model's reach, 'none' when none is, else 'some'."""
        lo, hi = self.bands()[band]
        return "all" if hi <= self.window(compressive) else "none" if lo > self.farthest(compressive) else "some"

    @property
    def episode_len(self) -> int:
        """E: long enough for the farthest query, and for the previous episode's payload to be out of every
        model's reach at every query (its last copy is at least E + 1 back); a multiple of c."""
        c = self.compression_rate
        need = max(self.bands()["beyond"][1] + c, self.farthest(True))
        return -(-need // c) * c


def make_stream(task: RecallTask, length: int, generator: torch.Generator, phase: int | None = None):
    """One stream of `length` positions: (tokens, targets, distances), each (length,) int64; targets and distances
    are IGNORE except at queries. The stream starts `phase` positions into an episode (a multiple of c, random by
    default); the queries of an episode whose payload lies before the stream are left out."""
    c, E = task.compression_rate, task.episode_len
    if phase is None:
        phase = c * int(torch.randint(E // c, (1,), generator=generator))
    if phase % c or not 0 <= phase < E:
        raise ValueError(f"phase must be a multiple of {c} in [0, {E}), got {phase}")
    starts = torch.arange(-phase, length, E)  # episode starts; the payload sits at start .. start + c - 1
    n_episodes = len(starts)
    total = n_episodes * E
    tokens = torch.randint(task.n_fillers, (total,), generator=generator)
    payloads = task.n_fillers + torch.randint(task.n_payloads, (n_episodes,), generator=generator)
    tokens.view(n_episodes, E)[:, :c] = payloads[:, None]
    targets = torch.full((total,), IGNORE)
    distances = torch.full((total,), IGNORE)
    for lo, hi in task.bands().values():
        k = min(task.queries, hi - lo + 1)
        picked = lo + torch.rand(n_episodes, hi - lo + 1, generator=generator).argsort(dim=1)[:, :k]
        where = (starts[:, None] + phase) + (c - 1) + picked  # positions in the uncropped stream
        tokens[where] = task.query_token
        targets[where] = payloads[:, None].expand(-1, k)
        distances[where] = picked
    # crop to [0, length): the uncropped stream starts at -phase; drop queries of a payload before position 0
    first_payload_cut = phase > 0
    keep = slice(phase, phase + length)
    tokens, targets, distances = tokens[keep], targets[keep], distances[keep]
    if first_payload_cut:
        cut = slice(0, E - phase)
        orphan = targets[cut] != IGNORE
        tokens[cut][orphan] = torch.randint(task.n_fillers, (int(orphan.sum()),), generator=generator)
        targets[cut][orphan] = IGNORE
        distances[cut][orphan] = IGNORE
    return tokens, targets, distances


def make_batch(task: RecallTask, rows: int, length: int, generator: torch.Generator):
    """(tokens, targets, distances), each (rows, length): independent streams."""
    return tuple(torch.stack(parts) for parts in zip(*(make_stream(task, length, generator) for _ in range(rows))))


def band_of(task: RecallTask, distances: torch.Tensor) -> torch.Tensor:
    """Index into BANDS of every query's distance (-1 elsewhere)."""
    out = torch.full_like(distances, -1)
    for index, (lo, hi) in enumerate(task.bands().values()):
        out[(distances >= lo) & (distances <= hi)] = index
    return out


def model_config(task: RecallTask, args, compressive: bool) -> configs.ModelConfig:
    return configs.ModelConfig(
        vocab_size=task.vocab_size, seq_len=task.seq_len,
        mem_len=task.mem_len if compressive else task.mem_len + task.cmem_len,
        cmem_len=task.cmem_len if compressive else 0, compression_rate=task.compression_rate,
        compression=args.compression, d_model=args.d_model, n_layers=task.n_layers, n_heads=args.n_heads,
        d_head=args.d_model // args.n_heads, mlp_ratio=4)


def count(task, logits, targets, distances, hits, totals):
    """Add each band's correct answers and queries (arg-max over the vocabulary) to hits and totals."""
    bands = band_of(task, distances)
    correct = logits.argmax(-1) == targets
    for index in range(len(BANDS)):
        chosen = bands == index
        hits[index] += int((correct & chosen).sum())
        totals[index] += int(chosen.sum())


def train(task: RecallTask, cfg: configs.ModelConfig, args, label: str) -> Model:
    torch.manual_seed(args.seed)
    model = Model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    data = torch.Generator().manual_seed(args.seed)  # the same training streams for both models
    T = task.seq_len
    tokens, targets, distances = make_batch(task, args.batch_size, args.steps * T, data)
    state, started = None, time.perf_counter()
    hits, totals, loss_sum, recon_sum, window = [0] * 3, [0] * 3, 0.0, 0.0, 0
    log_every = max(1, args.steps // 10)
    model.train()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = tokens[:, step * T:(step + 1) * T], targets[:, step * T:(step + 1) * T]
        logits, state, aux = model(x, state)
        task_loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
        task_loss = task_loss / max(1, int((y != IGNORE).sum()))
        loss = task_loss + sum(aux.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        count(task, logits.detach(), y, distances[:, step * T:(step + 1) * T], hits, totals)
        loss_sum += task_loss.item()
        recon_sum += aux["reconstruction"].item() if "reconstruction" in aux else 0.0
        window += 1
        if (step + 1) % log_every == 0 or step + 1 == args.steps:
            accuracy = " ".join(f"{name} {h / max(1, n):.3f}" for name, h, n in zip(BANDS, hits, totals))
            recon = f" reconstruction {recon_sum / window:.4f}" if cfg.cmem_len else ""
            print(f"  [{label}] step {step + 1:>5}/{args.steps}  loss {loss_sum / window:.3f}  train accuracy "
                  f"{accuracy}{recon}  {time.perf_counter() - started:.0f}s", flush=True)
            hits, totals, loss_sum, recon_sum, window = [0] * 3, [0] * 3, 0.0, 0.0, 0
    return model


@torch.no_grad()
def evaluate(task: RecallTask, model: Model, args) -> tuple[list[int], list[int]]:
    data = torch.Generator().manual_seed(args.seed + 1_000_003)  # streams never trained on
    T = task.seq_len
    segments = max(1, math.ceil(args.eval_tokens / T))
    tokens, targets, distances = make_batch(task, args.eval_streams, segments * T, data)
    model.eval()
    state, hits, totals = None, [0] * 3, [0] * 3
    for s in range(segments):
        cols = slice(s * T, (s + 1) * T)
        logits, state, _ = model(tokens[:, cols], state)
        count(task, logits, targets[:, cols], distances[:, cols], hits, totals)
    return hits, totals


def describe(task: RecallTask) -> None:
    bands = task.bands()
    print(f"task: segment {task.seq_len}, {task.n_layers} layer(s), {task.n_payloads} payloads held for "
          f"{task.compression_rate} positions, {task.n_fillers} fillers, episode {task.episode_len} positions, "
          f"vocabulary {task.vocab_size}; query distance bands: "
          + ", ".join(f"{name} {lo}-{hi}" for name, (lo, hi) in bands.items()))
    for compressive, name in ((False, "Transformer-XL"), (True, "Compressive")):
        inside = [b for b in BANDS if task.coverage(b, compressive) == "all"] or ["none"]
        outside = [b for b in BANDS if task.coverage(b, compressive) == "none"] or ["none"]
        print(f"  {name}: every query sees distances 1-{task.window(compressive)}, no query sees beyond "
              f"{task.farthest(compressive)}; bands inside its range for every query: {', '.join(inside)}; "
              f"outside for every query: {', '.join(outside)}")


def parse_args(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_argument_group("task and memory sizes")
    size.add_argument("--seq_len", type=int, default=16, help="segment length T (default 16)")
    size.add_argument("--mem_len", type=int, default=16, help="n_m of the Compressive Transformer (default 16)")
    size.add_argument("--cmem_len", type=int, default=32, help="n_cm; the Transformer-XL gets n_m + n_cm memories "
                      "(default 32)")
    size.add_argument("--compression_rate", type=int, default=2, help="c (default 2)")
    size.add_argument("--compression", default="conv", choices=("conv", "max", "mean"), help="f_c (default conv)")
    size.add_argument("--n_layers", type=int, default=1, help="layers of both models (default 1)")
    size.add_argument("--payloads", type=int, default=16, help="payload symbols; chance is 1/payloads (default 16)")
    size.add_argument("--fillers", type=int, default=16, help="filler symbols (default 16)")
    size.add_argument("--queries", type=int, default=3, help="query distances per band and episode (default 3)")
    model = parser.add_argument_group("models and training")
    model.add_argument("--d_model", type=int, default=64, help="width (default 64)")
    model.add_argument("--n_heads", type=int, default=4, help="attention heads (default 4)")
    model.add_argument("--steps", type=int, default=1500, help="training steps, one segment each (default 1500)")
    model.add_argument("--batch_size", type=int, default=32, help="streams per step (default 32)")
    model.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    model.add_argument("--warmup", type=int, default=100, help="linear warm-up steps (default 100)")
    model.add_argument("--grad_clip", type=float, default=1.0, help="gradient-norm clip (default 1.0)")
    model.add_argument("--eval_streams", type=int, default=64, help="evaluation streams (default 64)")
    model.add_argument("--eval_tokens", type=int, default=2048, help="positions per evaluation stream (default 2048)")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    if args.d_model % args.n_heads:
        parser.error(f"--d_model {args.d_model} is not a multiple of --n_heads {args.n_heads}")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        task = RecallTask(seq_len=args.seq_len, mem_len=args.mem_len, cmem_len=args.cmem_len,
                          compression_rate=args.compression_rate, n_layers=args.n_layers, n_payloads=args.payloads,
                          n_fillers=args.fillers, queries=args.queries)
    except ValueError as error:
        raise SystemExit(f"recall.py: error: {error}") from None
    describe(task)
    started, rows = time.perf_counter(), []
    for compressive, label in ((True, "Compressive"), (False, "Transformer-XL")):
        cfg = model_config(task, args, compressive)
        print(f"training {label} (n_m {cfg.mem_len}, n_cm {cfg.cmem_len}, c {cfg.compression_rate}, "
              f"{cfg.compression if cfg.cmem_len else 'no compression'}) for {args.steps} steps", flush=True)
        model = train(task, cfg, args, label)
        hits, totals = evaluate(task, model, args)
        for name, h, n in zip(BANDS, hits, totals):
            rows.append({"model": label, "n_m": cfg.mem_len, "n_cm": cfg.cmem_len, "c": cfg.compression_rate,
                         "thesis_range": task.n_layers * task.window(compressive), "band": name,
                         "distances": task.bands()[name], "in_range": task.coverage(name, compressive),
                         "accuracy": h / max(1, n), "queries": n})
    chance = 1 / task.n_payloads
    print(f"\n{'model':<15} {'n_m':>4} {'n_cm':>5} {'c':>2} {'range':>6} {'distance':>14} {'in range':>9} "
          f"{'queries':>8} {'accuracy':>9} {'chance':>7}")
    for r in rows:
        lo, hi = r["distances"]
        c = r["c"] if r["n_cm"] else "-"
        print(f"{r['model']:<15} {r['n_m']:>4} {r['n_cm']:>5} {c:>2} {r['thesis_range']:>6} "
              f"{r['band'] + f' {lo}-{hi}':>14} {r['in_range']:>9} {r['queries']:>8} {r['accuracy']:>9.3f} "
              f"{chance:>7.3f}")
    print(f"range: the thesis's temporal range l x (n_m + c n_cm) (6.3.3; n_cm = 0 for Transformer-XL). in range: "
          f"for how many query positions the distance is within reach. Seed {args.seed}, {args.steps} steps, "
          f"wall {time.perf_counter() - started:.0f}s.")
    return rows


if __name__ == "__main__":
    main()
