"""Why a run's slow evaluation differs from its fast one: the same targets scored with short and long context.

    python scripts/slow_vs_fast.py runs/<run> --split valid

Scores every target of a split, read as one stream (as the slow evaluation reads it), twice with the run's
checkpoint: in windows of seq_len laid side by side (a target at window position p sees p tokens of context,
as in the fast evaluation) and in the run's slow-evaluation windows (its --slow_eval protocol; with the
default last_n = seq_len/4 every target scored sees at least 3/4 seq_len tokens). Prints both mean losses and
their difference per target over the targets both score,
by the context the target has in the side-by-side windows. A model that predicts worse from long context
than from short (a model trained for a few hundred steps does) shows positive differences at short context,
and its slow evaluation comes out worse than its fast one. Targets with 3/4 seq_len of context or more sit
at the same window positions in both, so their difference is zero up to rounding: a check that the model's
output does not depend on the batch it is in. Stateless models only (a stateful model's slow evaluation
carries its state through the stream instead of using windows).
"""
import argparse
import importlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from languini import aux_loss, checkpoint
from languini.books import BooksDataset, Stream, window_plan
from languini.flags import Parser

BUCKETS = 8  # rows of the table: context lengths in eighths of seq_len


def load_run(run_dir: Path):
    """The run's model (its checkpoint's weights, eval mode), model config, dataset and slow-eval protocol."""
    results = json.loads((run_dir / "results.json").read_text())
    project = results["project"]
    configs = importlib.import_module(f"projects.{project}.configs")
    model_cls = importlib.import_module(f"projects.{project}.model").Model
    ckpt, _ = checkpoint.load(run_dir, torch.device("cpu"))
    cfg = configs.ModelConfig(**ckpt["model_config"])
    model = model_cls(cfg)
    model.load_state_dict(ckpt["model"])
    dataset_dir = Path(results["dataset"])
    train = results.get("train_config", {})
    protocol = (train.get("slow_eval", "last_n"), train.get("slow_eval_last_n") or max(cfg.seq_len // 4, 1))
    return model.eval(), cfg, BooksDataset(dataset_dir.parent, cfg.vocab_size), protocol


@torch.no_grad()
def target_losses(model, tokens: torch.Tensor, windows: list[tuple[int, int, int]], batch_size: int) -> torch.Tensor:
    """Loss in nats of every target position scored by a window (first input position, first and last target
    position scored), the format of books.sliding_windows' plan; NaN where no window scores a target."""
    losses = torch.full((len(tokens),), float("nan"), dtype=torch.float64)
    for i in range(0, len(windows), batch_size):
        group = windows[i:i + batch_size]
        width = max(last - start for start, _, last in group)
        x = torch.zeros(len(group), width, dtype=torch.long)
        y = torch.zeros(len(group), width, dtype=torch.long)
        for row, (start, _, last) in enumerate(group):
            x[row, :last - start] = tokens[start:last]
            y[row, :last - start] = tokens[start + 1:last + 1]
        logits, state, _ = aux_loss.unpack(model(x, None))
        if state is not None:
            raise SystemExit("a stateful model: its slow evaluation carries the state, not windows")
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y).double()
        for row, (start, first, last) in enumerate(group):
            losses[first:last + 1] = loss[row, first - start - 1:last - start]
    return losses


def compare(model, tokens: torch.Tensor, seq_len: int, batch_size: int = 16, protocol: str = "last_n",
            last_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-target losses (index = target position in the stream) in side-by-side and in slow-eval windows."""
    n = len(tokens)
    side_by_side = [(s, s + 1, min(s + seq_len, n - 1)) for s in range(0, n - 1, seq_len)]
    slow = window_plan(n, seq_len, last_n or max(seq_len // 4, 1), protocol)
    return target_losses(model, tokens, side_by_side, batch_size), target_losses(model, tokens, slow, batch_size)


def report(fast: torch.Tensor, slow: torch.Tensor, seq_len: int) -> str:
    """Mean losses over the targets both score, and their difference by side-by-side context."""
    targets = torch.arange(len(fast))
    both = ~(fast.isnan() | slow.isnan())
    context = (targets - 1) % seq_len  # tokens before the target in its side-by-side window
    difference = slow - fast
    lines = [f"{int(both.sum()):,} targets; mean loss (nats/token): side by side {fast[both].mean():.4f}, "
             f"slow eval's windows {slow[both].mean():.4f} (slow - side by side {difference[both].mean():+.4f})",
             "context in side-by-side windows  targets  slow - side by side (nats/token)"]
    width = seq_len // BUCKETS
    for low in range(0, seq_len, width):
        chosen = both & (context >= low) & (context < low + width)
        lines.append(f"{low:>13}-{low + width - 1:<17} {int(chosen.sum()):>7}  {difference[chosen].mean():+.4f}")
    return "\n".join(lines)


def main(argv=None) -> tuple[torch.Tensor, torch.Tensor]:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder with results.json and checkpoint.pt")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--max_tokens", type=int, default=None, help="only the first N tokens of the split")
    parser.add_argument("--batch_size", type=int, default=16,
                        help="windows per forward pass; a model whose output does not depend on its batch prints "
                             "the same table for any")
    args = parser.parse_args(argv)
    model, cfg, dataset, (protocol, last_n) = load_run(Path(args.run))
    stream = Stream(dataset.books(args.split), cfg.vocab_size, repeat=False)
    tokens = torch.from_numpy(stream.read(0, min(stream.length, args.max_tokens or stream.length)))
    fast, slow = compare(model, tokens, cfg.seq_len, args.batch_size, protocol, last_n)
    print(f"{args.run}, split {args.split} (slow evaluation: {protocol}, last_n {last_n}):")
    print(report(fast, slow, cfg.seq_len))
    return fast, slow


if __name__ == "__main__":
    main()
