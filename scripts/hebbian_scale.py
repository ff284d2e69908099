"""Why the thesis's Hebbian Softmax breaks a small model here: the output layer's input h against its rows, measured.

    python scripts/hebbian_scale.py                                   # gpt cpu, the default corpus, 60 steps
    python scripts/hebbian_scale.py --project qlstm --steps 60 --json scale.json
    python scripts/hebbian_scale.py --tie_embeddings true                 # head is the input embedding

Trains the project's config twice from the same seed, without and with --hebbian_softmax (the thesis's rule,
--hebbian_limit and --hebbian_min_mix at their defaults), on the embedded default corpus (built once in
--corpus_dir). Every --every steps it reads the first --eval_batches batches of the valid split
(fast evaluation's windows) and prints: the held-out loss per token; the median norm of h, the input of `head`
(after the final LayerNorm); the median norm of head's rows (with the rule: of the rows it has written, and of the
rest); the mean gain of the final LayerNorm. It prints the output layer's initialisation (the rows' standard
deviation and norm at step 0) and whether head is tied to the input embedding.

Then the probe of a row set to mean(h), at step 0 and after the plain run: for the most frequent target of the
next training batch, c, its row is replaced by the mean of h over that batch's positions predicting c (the first
sighting of the rule, lambda = 1), and on the held-out batches it prints that row's norm, its logit against the
largest logit of the other rows, on positions whose target is c and on the rest, how often it becomes the argmax,
and the held-out loss before and after; then the same with the row rescaled to the trained row's norm (as
--hebbian_scale rows does), which separates the row's scale from its direction. h_mean_norm, the norm of the mean
of h over the held-out positions, against h_norm measures the direction all positions' h share.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from languini import default_corpus  # noqa: E402
from languini.books import BooksDataset, eval_batches  # noqa: E402
from languini.flags import Parser, add_bool_flag  # noqa: E402
from languini.trainer import TrainConfig, Trainer  # noqa: E402
from projects.gpt import configs as gpt_configs  # noqa: E402
from projects.gpt.model import Model as GPT  # noqa: E402
from projects.qlstm import configs as qlstm_configs  # noqa: E402
from projects.qlstm.model import Model as QLSTM  # noqa: E402

PROJECTS = {"gpt": (gpt_configs, GPT), "qlstm": (qlstm_configs, QLSTM)}


def parse_args(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", default="gpt", choices=list(PROJECTS))
    parser.add_argument("--config", default="cpu")
    parser.add_argument("--corpus_dir", default=str(REPO / "data" / "default_corpus"),
                        help="where the embedded default corpus is built (once) and read")
    parser.add_argument("--steps", type=int, default=60, help="training steps of each run (its schedule's length)")
    parser.add_argument("--every", type=int, default=10, help="steps between measurements")
    parser.add_argument("--eval_batches", type=int, default=4, help="held-out batches of every measurement")
    parser.add_argument("--seed", type=int, default=0)
    add_bool_flag(parser, "--tie_embeddings", False, "the project's --tie_embeddings: head is the input embedding")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    return parser.parse_args(argv)


class HeadInputs:
    """Records the input of `head` (h) of every forward while it is on."""

    def __init__(self, head: torch.nn.Module):
        self.recorded = []
        self.handle = head.register_forward_hook(lambda module, inputs, output: self.recorded.append(inputs[0]))

    def take(self) -> torch.Tensor:
        h, self.recorded = torch.cat([x.reshape(-1, x.shape[-1]) for x in self.recorded]).float(), []
        return h


@torch.no_grad()
def held_out(model, batches, inputs: HeadInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, logits, targets) at the held-out batches' scored positions, the model in eval mode."""
    model.eval()
    logits, targets, masks = [], [], []
    for x, y, mask in batches:
        out = model(x)[0]
        logits.append(out.reshape(-1, out.shape[-1]).float())
        targets.append(y.reshape(-1))
        masks.append(mask.reshape(-1))
    model.train()
    mask = torch.cat(masks)
    return inputs.take()[mask], torch.cat(logits)[mask], torch.cat(targets)[mask]


def median(values: torch.Tensor) -> float:
    return float(values.median()) if values.numel() else float("nan")


def measure(model, batches, inputs, rule) -> dict:
    h, logits, targets = held_out(model, batches, inputs)
    rows = model.head.weight.detach().float().norm(dim=1)
    row = {"held_out_loss": float(F.cross_entropy(logits, targets)), "h_norm": median(h.norm(dim=1)),
           "h_mean_norm": float(h.mean(0).norm()),
           "row_norm": median(rows), "final_norm_gain": float(model.ln_f.weight.detach().mean())}
    if rule is not None:
        written = rule.counts > 0
        row |= {"row_norm_written": median(rows[written]), "row_norm_unwritten": median(rows[~written]),
                "rows_written": int(written.sum())}
    return row


@torch.no_grad()
def probe_mean_row(model, train_batch, batches, inputs) -> dict:
    """Row c := mean(h : y = c) over a training batch, c its most frequent target; its effect on held-out logits."""
    x, y = (t[0] for t in train_batch)  # the first micro-batch: batches are (micro_batches, batch, seq_len)
    model.eval()
    model(x)
    model.train()
    h_train, y_train = inputs.take(), y.reshape(-1)
    c = int(torch.bincount(y_train).argmax())
    mean_h = h_train[y_train == c].mean(0)
    h, logits, targets = held_out(model, batches, inputs)
    before = float(F.cross_entropy(logits, targets))
    trained_row_logit = logits[:, c].clone()
    trained_norm = float(model.head.weight[c].float().norm())
    own = targets == c
    others = torch.cat([logits[:, :c], logits[:, c + 1:]], dim=1).max(1).values
    result = {"class": c, "positions_with_c_in_batch": int((y_train == c).sum()), "mean_h_norm": float(mean_h.norm()),
              "trained_row_norm": trained_norm, "trained_row_logit_median": median(trained_row_logit),
              "largest_other_logit_median": median(others), "held_out_loss_before": before}
    # the row as eq. 4.2 writes it, then rescaled to the trained row's norm (what --hebbian_scale rows does)
    for name, row in (("mean_row", mean_h), ("rescaled_row", mean_h * trained_norm / mean_h.norm())):
        logits[:, c] = h @ row  # the head has no bias: the logit of a row is its dot product with h
        result |= {f"{name}_logit_median_target_c": median(logits[own, c]),
                   f"{name}_logit_median_other_targets": median(logits[~own, c]),
                   f"{name}_share_of_positions_it_wins": float((logits.argmax(1) == c).float().mean()),
                   f"{name}_held_out_loss_after": float(F.cross_entropy(logits, targets))}
    return result


def run(args, rule_on: bool, dataset: BooksDataset, run_dir: Path) -> dict:
    configs, model_cls = PROJECTS[args.project]
    cfg = configs.get(args.config, vocab_size=dataset.vocab_size, tie_embeddings=args.tie_embeddings)
    tcfg = TrainConfig(hebbian_softmax=rule_on, seed=args.seed)
    trainer = Trainer(project=args.project, config_name=args.config, model_cfg=cfg, model_cls=model_cls, tcfg=tcfg,
                      dataset=dataset, bytes_per_token=torch.ones(dataset.vocab_size), run_dir=run_dir,
                      total_steps=args.steps, tokens_per_second=1.0)
    model = trainer.model
    batches = list(eval_batches(dataset.books("valid"), dataset.vocab_size, tcfg.eval_batch_size, cfg.seq_len,
                                max_batches=args.eval_batches))
    weight = model.head.weight.detach().float()
    result = {"rule": rule_on, "head_init_std": float(weight.std()), "head_init_row_norm": median(weight.norm(dim=1)),
              "tied": model.head.weight is model.tok_emb.weight, "steps": []}
    inputs = HeadInputs(model.head)
    if not rule_on:
        result["probe_at_init"] = probe_mean_row(model, trainer.batches(0), batches, inputs)
    result["steps"].append({"step": 0, **measure(model, batches, inputs, trainer.hebbian)})
    for step in range(args.steps):
        inputs.handle.remove()  # the trainer's own hook records the training forwards
        trainer.train_step(*trainer.batches(step))
        inputs = HeadInputs(model.head)
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            result["steps"].append({"step": step + 1, **measure(model, batches, inputs, trainer.hebbian)})
    if not rule_on:
        result["probe_after_training"] = probe_mean_row(model, trainer.batches(args.steps), batches, inputs)
    inputs.handle.remove()
    return result


def print_run(result: dict) -> None:
    print(f"\n{'with' if result['rule'] else 'without'} the rule: head initialised at std "
          f"{result['head_init_std']:.4f} (median row norm {result['head_init_row_norm']:.3f}), "
          f"{'tied to' if result['tied'] else 'untied from'} the input embedding")
    columns = [k for k in result["steps"][0] if k != "step"]
    print("step " + " ".join(f"{c:>18}" for c in columns))
    for row in result["steps"]:
        print(f"{row['step']:4d} " + " ".join(f"{row[c]:18.4g}" for c in columns))
    for name in ("probe_at_init", "probe_after_training"):
        if name in result:
            print(f"{name}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in result[name].items()))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)  # a shared 2-core machine; the runs count steps, not seconds
    dataset = default_corpus.ensure(args.corpus_dir)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rule_on in (False, True):
            results.append(run(args, rule_on, dataset, Path(tmp) / str(rule_on)))
            print_run(results[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
