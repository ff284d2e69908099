"""Fast binding of novel classes with the Hebbian Softmax: Rae's thesis, section 4.3.1 (Figures 4.3-4.5), on
synthetic glyphs instead of Omniglot (not available here).

    # the softmax's learning-rate sweep, then the comparison at its best (what languini/README.md reports)
    python scripts/hebbian_binding.py --models softmax --lrs 0.0015 0.003 0.006 0.012 --seeds 0 1 --channels 32 \
        --max_steps 3000 --out_dir results/hebbian_binding/sweep
    python scripts/hebbian_binding.py --models softmax hebbian --lrs 0.003 --seeds 0 1 2 3 4 --channels 32 \
        --max_steps 3000

Runs of other seeds or models can go in separate processes with the same --run_dir; the last command collects.

The data: every class is a random glyph, 2-4 strokes of 1-2 straight segments each between points of a 7 x 7 grid
on the canvas; each of its --examples (20) examples draws the glyph again with every stroke point moved a little,
the whole glyph rotated, scaled and shifted a little, and pixel noise added (handwritten variants of one character,
as Omniglot's 20 drawers give). The first --test_examples (5) examples of each class are its test set, the rest
its training set, as the thesis splits Omniglot. The same --data_seed gives the same glyphs and examples.

The curriculum (thesis 4.3.1): training starts on the first --start_classes (30) classes; every --eval_every steps
the test accuracy over every class introduced so far is measured, and when it exceeds --threshold (0.6) the level
is complete and --add_classes (5) new classes join. The steps each level took are recorded, until
--max_classes is complete or --max_steps steps have been taken in all (the level then running is recorded as
unfinished). A step: a batch of --batch_size training examples drawn uniformly from the classes introduced so far,
augmented (rotation within +-30 degrees and a shift, as the thesis), RMSProp on the cross-entropy.

The model (thesis 4.3.1, the Matching Networks encoder): --layers blocks of a 3 x 3 convolution with --channels
filters, batch norm, ReLU and 2 x 2 max pooling, down to a vector h of --channels; 20% dropout on h; the output
layer a Linear without bias from h to one row per class the curriculum can reach (--max_classes), Glorot-initialised.
`hebbian` adds languini.hebbian.HebbianSoftmax (T = --hebbian_limit 10, gamma = --hebbian_min_mix 0.1, the
thesis's Figure 4.5) on that layer after every optimiser step, with h before the dropout (as the thesis stores the
"pristine hidden activation pre-dropout").

Each run (model, learning rate, seed) is written to --run_dir as <model>_lr<lr>_seed<seed>.json when it ends and
is reused afterwards. Then --out_dir gets steps_per_level.csv (a row per run and level), summary.csv (per model,
learning rate and level: mean and standard deviation over the seeds that completed it, their number) and
steps_per_level.png: the steps per level against the classes, mean with a band of two standard deviations, as the
thesis's Figure 4.4, and the classes reached against the total steps, as its Figure 4.5. The table (mean ± sd over
the seeds that completed each level, and their number) is printed.
"""
import argparse
import csv
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from languini.flags import Parser, add_bool_flag  # noqa: E402
from languini.hebbian import HebbianSoftmax  # noqa: E402

MODELS = ("softmax", "hebbian")
GRID = 7  # stroke points lie on a GRID x GRID lattice of the canvas, so that glyphs differ by more than jitter
ALPHABET, POOL, STROKES = 10, 6, 3  # characters per alphabet, the strokes they are made of, strokes per character


def parse_args(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--lrs", nargs="+", type=float, default=[0.006], help="RMSProp learning rates (the thesis's "
                        "best for the softmax: 0.006)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4],
                        help="each seed draws the model's initialisation, the batches and the augmentation")
    parser.add_argument("--data_seed", type=int, default=0, help="the glyphs and their examples (the same for "
                        "every run, as Omniglot is)")
    parser.add_argument("--start_classes", type=int, default=30)
    parser.add_argument("--add_classes", type=int, default=5)
    parser.add_argument("--max_classes", type=int, default=100, help="the last level's classes")
    parser.add_argument("--threshold", type=float, default=0.6, help="test accuracy that completes a level")
    parser.add_argument("--max_steps", type=int, default=20000, help="training steps of a run at most")
    parser.add_argument("--eval_every", type=int, default=10, help="steps between test evaluations")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--examples", type=int, default=20, help="examples per class")
    parser.add_argument("--jitter", type=float, default=0.08, help="how far (canvas widths, standard deviation) an "
                        "example moves each stroke point of its glyph")
    parser.add_argument("--test_examples", type=int, default=5, help="the first of each class's examples: its test set")
    parser.add_argument("--image_size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--future_classes", default="scored", choices=("scored", "masked"),
                        help="scored: the softmax runs over every class the curriculum can reach, so the rows of "
                             "classes not yet introduced are trained down until they are; masked: over the classes "
                             "introduced so far")
    parser.add_argument("--hebbian_limit", type=int, default=10, help="T of the Hebbian Softmax")
    parser.add_argument("--hebbian_min_mix", type=float, default=0.1, help="gamma of the Hebbian Softmax")
    parser.add_argument("--run_dir", default="runs/hebbian_binding", help="one JSON per run")
    parser.add_argument("--out_dir", default="results/hebbian_binding", help="the CSVs and the plot")
    add_bool_flag(parser, "--train", True, "run the runs not yet in --run_dir (false: only collect the table)")
    args = parser.parse_args(argv)
    if args.start_classes > args.max_classes or (args.max_classes - args.start_classes) % args.add_classes:
        parser.error("--max_classes must be --start_classes plus a multiple of --add_classes")
    if not 0 < args.test_examples < args.examples:
        parser.error("--test_examples must leave training examples: 0 < --test_examples < --examples")
    return args


# ---- data ----------------------------------------------------------------------------------------------------


def draw(strokes: torch.Tensor, size: int) -> torch.Tensor:
    """Images (n, size, size) in [0, 1] of n glyphs, each strokes[i] a set of segments (segments, 2 ends, xy) in
    canvas units [0, 1]: a pixel's ink falls off linearly from the segment's centre line (anti-aliased lines)."""
    centres = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    pixels = torch.stack(torch.meshgrid(centres, centres, indexing="xy"), dim=-1).reshape(1, 1, -1, 2)
    a, b = strokes[:, :, None, 0], strokes[:, :, None, 1]  # (n, segments, 1, 2)
    ab = b - a
    t = (((pixels - a) * ab).sum(-1) / (ab * ab).sum(-1).clamp_min(1e-12)).clamp(0, 1)
    distance = (pixels - (a + t[..., None] * ab)).norm(dim=-1)  # (n, segments, pixels)
    half_width, pixel = 0.035, 1 / size
    ink = (1 - (distance.min(dim=1).values - half_width) / pixel).clamp(0, 1)
    return ink.reshape(-1, size, size)


def glyph_dataset(classes: int, examples: int, size: int, seed: int, jitter: float = 0.08) -> torch.Tensor:
    """(classes, examples, 1, size, size) images: per class a glyph, per example a variant of it.

    Glyphs come in alphabets of ALPHABET characters, as Omniglot's: an alphabet has POOL strokes (chains of 1-2
    segments between lattice points) and each of its characters is a different set of STROKES of them, so the
    characters of one alphabet share strokes and can be confused. Class c is character c % ALPHABET of alphabet
    c // ALPHABET. Alphabets are drawn one after another in equal draws, so the first classes are the same
    whatever `classes` is."""
    gen = torch.Generator().manual_seed(seed)
    combinations = torch.tensor(list(itertools.combinations(range(POOL), STROKES)))
    images = [_alphabet(combinations, examples, size, jitter, gen) for _ in range(-(-classes // ALPHABET))]
    return torch.cat(images)[:classes]


def _alphabet(combinations: torch.Tensor, examples: int, size: int, jitter: float, gen) -> torch.Tensor:
    """(ALPHABET, examples, 1, size, size): one alphabet's characters and their examples."""
    # each pool stroke: 3 lattice points; a stroke of one segment repeats its second point
    chains = (torch.randint(GRID, (POOL, 3, 2), generator=gen) + 0.5) / GRID
    chains = 0.1 + 0.8 * chains  # keep the glyph off the border, as a character sits in its box
    one_segment = torch.rand(POOL, generator=gen) < 0.5
    chains[:, 2] = torch.where(one_segment[:, None], chains[:, 1], chains[:, 2])
    chosen = combinations[torch.randperm(len(combinations), generator=gen)[:ALPHABET]]  # distinct stroke sets
    points = chains[chosen]  # (ALPHABET, STROKES, 3, 2)
    # every example: points jittered, then the glyph rotated, scaled and shifted about the canvas centre
    points = points[:, None] + jitter * torch.randn(ALPHABET, examples, STROKES, 3, 2, generator=gen)
    angle = math.radians(10) * (2 * torch.rand(ALPHABET, examples, generator=gen) - 1)
    scale = 1 + 0.1 * (2 * torch.rand(ALPHABET, examples, generator=gen) - 1)
    shift = 0.06 * (2 * torch.rand(ALPHABET, examples, 2, generator=gen) - 1)
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    rotation = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (c, e, 2, 2)
    points = torch.einsum("ceij,cespj->cespi", rotation, points - 0.5) + 0.5 + shift[:, :, None, None]
    segments = torch.stack([points[..., :-1, :], points[..., 1:, :]], dim=-2)  # (c, e, STROKES, 2, 2 ends, 2)
    images = draw(segments.reshape(ALPHABET * examples, STROKES * 2, 2, 2), size)
    images = (images + 0.1 * torch.randn(images.shape, generator=gen)).clamp(0, 1)
    return images.reshape(ALPHABET, examples, 1, size, size)


def augment(images: torch.Tensor, gen: torch.Generator, degrees: float = 30, shift: float = 0.1) -> torch.Tensor:
    """The thesis's augmentation of training examples: a rotation within +-degrees and a shift of up to `shift` of
    the image each way (bilinear, ink outside the canvas is lost)."""
    n = images.shape[0]
    angle = math.radians(degrees) * (2 * torch.rand(n, generator=gen) - 1)
    offset = 2 * shift * (2 * torch.rand(n, 2, generator=gen) - 1)  # affine_grid's canvas spans [-1, 1]
    theta = torch.stack([torch.stack([angle.cos(), -angle.sin(), offset[:, 0]], -1),
                         torch.stack([angle.sin(), angle.cos(), offset[:, 1]], -1)], -2)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, align_corners=False)


# ---- model ---------------------------------------------------------------------------------------------------


class Classifier(nn.Module):
    """The Matching Networks encoder, dropout on its output h, and the output layer `head` (one row per class)."""

    def __init__(self, classes: int, channels: int, layers: int, dropout: float):
        super().__init__()
        blocks, width = [], 1
        for _ in range(layers):
            blocks += [nn.Conv2d(width, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2)]
            width = channels
        self.encoder = nn.Sequential(*blocks, nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels, classes, bias=False)
        nn.init.xavier_uniform_(self.head.weight)  # the thesis: Glorot initialisation of the softmax weights

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, h): h the encoder's output before the dropout, which the Hebbian Softmax stores."""
        h = self.encoder(images)
        return self.head(self.dropout(h)), h


# ---- the curriculum --------------------------------------------------------------------------------------------


@torch.no_grad()
def class_accuracies(model: Classifier, images: torch.Tensor, labels: torch.Tensor, scored: int,
                     chunk: int = 500) -> torch.Tensor:
    """The test accuracy of each class in `labels` (0, 1, ..., n - 1, equally many examples each) in eval mode, a
    prediction being the best of the first `scored` classes."""
    model.eval()
    correct = torch.cat([model(images[i:i + chunk])[0][:, :scored].argmax(1) == labels[i:i + chunk]
                         for i in range(0, len(labels), chunk)])
    model.train()
    return correct.float().reshape(int(labels.max()) + 1, -1).mean(1)


def level_record(classes: int, steps: int, finished: bool, per_class: torch.Tensor, new: int) -> dict:
    """A level: its classes, the steps it took, and the test accuracy over all its classes and over its `new` ones."""
    return {"classes": classes, "steps": steps, "finished": finished, "test_accuracy": float(per_class.mean()),
            "new_class_accuracy": float(per_class[-new:].mean())}


def run_curriculum(data: torch.Tensor, model_name: str, lr: float, seed: int, args, bar: tqdm | None = None) -> dict:
    """One run: the levels completed and the level running when --max_steps ran out."""
    torch.manual_seed(seed)  # the initialisation and the dropout
    gen = torch.Generator().manual_seed(seed)  # the batches and the augmentation
    model = Classifier(args.max_classes, args.channels, args.layers, args.dropout)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=lr)
    rule = (HebbianSoftmax(model.head.weight, args.hebbian_limit, args.hebbian_min_mix)
            if model_name == "hebbian" else None)
    test, train = data[:, :args.test_examples], data[:, args.test_examples:]
    per_class = train.shape[1]
    classes, new, level_start, levels = args.start_classes, args.start_classes, 0, []
    test_labels = torch.arange(classes).repeat_interleave(args.test_examples)
    scored = classes if args.future_classes == "masked" else args.max_classes  # the classes a prediction picks from
    for step in range(1, args.max_steps + 1):
        index = torch.randint(classes * per_class, (args.batch_size,), generator=gen)
        labels = index // per_class
        images = augment(train[labels, index % per_class], gen)
        logits, h = model(images)
        loss = F.cross_entropy(logits[:, :classes] if args.future_classes == "masked" else logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rule is not None:  # Algorithm 1: after the optimiser step, with this step's activations
            rule.update(h.detach(), labels)
        if bar is not None:
            bar.update()
        if step % args.eval_every:
            continue
        accuracies = class_accuracies(model, test[:classes].flatten(0, 1), test_labels, scored)
        if bar is not None:
            bar.set_postfix(classes=classes, acc=f"{float(accuracies.mean()):.2f}", refresh=False)
        if accuracies.mean() > args.threshold:
            levels.append(level_record(classes, step - level_start, True, accuracies, new))
            if classes == args.max_classes:
                break
            classes, new, level_start = classes + args.add_classes, args.add_classes, step
            test_labels = torch.arange(classes).repeat_interleave(args.test_examples)
            scored = classes if args.future_classes == "masked" else args.max_classes
    else:  # out of steps within a level
        accuracies = class_accuracies(model, test[:classes].flatten(0, 1), test_labels, scored)
        levels.append(level_record(classes, args.max_steps - level_start, False, accuracies, new))
    return {"model": model_name, "lr": lr, "seed": seed, "levels": levels,
            "total_steps": sum(level["steps"] for level in levels)}


def run_name(model_name: str, lr: float, seed: int, future_classes: str) -> str:
    return f"{model_name}_lr{lr:g}_seed{seed}" + ("_masked" if future_classes == "masked" else "")


SETTINGS = ("data_seed", "start_classes", "add_classes", "max_classes", "threshold", "max_steps", "eval_every",
            "batch_size", "examples", "jitter", "test_examples", "image_size", "channels", "layers", "dropout",
            "future_classes",
            "hebbian_limit", "hebbian_min_mix")


def run_all(args) -> list[dict]:
    """Every run asked for: read from --run_dir when it is there with the same settings, else trained now."""
    settings = {name: getattr(args, name) for name in SETTINGS}
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(m, lr, s) for lr in args.lrs for m in args.models for s in args.seeds]
    runs, data = [], None
    for i, (model_name, lr, seed) in enumerate(jobs):
        name = run_name(model_name, lr, seed, args.future_classes)
        path = run_dir / f"{name}.json"
        if path.exists():
            saved = json.loads(path.read_text())
            if saved["settings"] != settings:
                raise SystemExit(f"{path} was run with other settings ({saved['settings']}); give another --run_dir")
            runs.append(saved)
            continue
        if not args.train:
            raise SystemExit(f"{path} is missing; run it first (--train true)")
        if data is None:
            data = glyph_dataset(args.max_classes, args.examples, args.image_size, args.data_seed, args.jitter)
        with tqdm(total=args.max_steps, desc=f"[{i + 1}/{len(jobs)}] {name}", unit="step", leave=False,
                  mininterval=2) as bar:
            result = run_curriculum(data, model_name, lr, seed, args, bar)
        result["settings"] = settings
        path.write_text(json.dumps(result, indent=1) + "\n")
        completed = max((lv["classes"] for lv in result["levels"] if lv["finished"]), default=0)
        tqdm.write(f"{name}: {result['total_steps']} steps, the level of {completed} classes completed last")
        runs.append(result)
    return runs


# ---- the table and the plot ----------------------------------------------------------------------------------


def summarise(runs: list[dict]) -> list[dict]:
    """Per model, learning rate and level: the steps of the seeds that completed it (mean, standard deviation),
    how many did, and how many runs there were."""
    rows = []
    for key in sorted({(r["model"], r["lr"]) for r in runs}, key=lambda k: (k[1], MODELS.index(k[0]))):
        mine = [r for r in runs if (r["model"], r["lr"]) == key]
        for classes in sorted({lv["classes"] for r in mine for lv in r["levels"]}):
            steps = [lv["steps"] for r in mine for lv in r["levels"] if lv["classes"] == classes and lv["finished"]]
            rows.append({"model": key[0], "lr": key[1], "classes": classes, "runs": len(mine),
                         "completed": len(steps), "mean_steps": statistics.fmean(steps) if steps else math.nan,
                         "std_steps": statistics.stdev(steps) if len(steps) > 1 else math.nan})
    return rows


def write_tables(runs: list[dict], summary: list[dict], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "steps_per_level.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "lr", "seed", "classes", "steps", "finished", "test_accuracy", "new_class_accuracy"])
        for r in runs:
            for lv in r["levels"]:
                writer.writerow([r["model"], r["lr"], r["seed"], lv["classes"], lv["steps"], lv["finished"],
                                 f"{lv['test_accuracy']:.4f}", f"{lv['new_class_accuracy']:.4f}"])
    with open(out_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows({**row, "mean_steps": f"{row['mean_steps']:.1f}", "std_steps": f"{row['std_steps']:.1f}"}
                         for row in summary)


def print_table(runs: list[dict], summary: list[dict]) -> None:
    """Steps per level, mean +- standard deviation over the seeds that completed it and their number, a column per
    model and learning rate; then each one's total steps to its last level completed by every seed (mean +- sd),
    and the last level each seed completed."""
    keys = sorted({(r["model"], r["lr"]) for r in runs}, key=lambda k: (k[1], MODELS.index(k[0])))
    cell = {(row["model"], row["lr"], row["classes"]): row for row in summary}
    print("| classes | " + " | ".join(f"{m} (lr {lr:g})" for m, lr in keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    for classes in sorted({row["classes"] for row in summary}):
        cells = []
        for m, lr in keys:
            row = cell.get((m, lr, classes))
            if row is None or not row["completed"]:
                cells.append("-")
                continue
            text = f"{row['mean_steps']:.0f}" + (f" ± {row['std_steps']:.0f}" if row["completed"] > 1 else "")
            cells.append(text + f" ({row['completed']}/{row['runs']})")
        print(f"| {classes} | " + " | ".join(cells) + " |")
    for m, lr in keys:
        mine = [r for r in runs if (r["model"], r["lr"]) == (m, lr)]
        reached = min(max((lv["classes"] for lv in r["levels"] if lv["finished"]), default=0) for r in mine)
        totals = [sum(lv["steps"] for lv in r["levels"] if lv["classes"] <= reached) for r in mine]
        spread = f" ± {statistics.stdev(totals):.0f}" if len(totals) > 1 else ""
        print(f"{m} lr {lr:g}: {statistics.fmean(totals):.0f}{spread} steps to complete {reached} classes "
              f"(every seed; {len(mine)} seeds)")
        last = [max((lv["classes"] for lv in r["levels"] if lv["finished"]), default=0) for r in mine]
        spread = f" ± {statistics.stdev(last):.1f}" if len(last) > 1 else ""
        print(f"{m} lr {lr:g}: the last level completed has {statistics.fmean(last):.1f}{spread} classes "
              f"(per seed: {', '.join(map(str, last))})")


def plot(runs: list[dict], summary: list[dict], out: Path) -> None:
    """Left: steps per level, mean and 2-sigma band (Figure 4.4). Right: classes trained on against total steps, each
    seed a thin line (Figure 4.5)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["model"], r["lr"]) for r in runs}, key=lambda k: (k[1], MODELS.index(k[0])))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (m, lr) in enumerate(keys):
        color, label = f"C{i}", f"{m}, lr {lr:g}"
        rows = [row for row in summary if (row["model"], row["lr"]) == (m, lr) and row["completed"] > 1]
        x = [row["classes"] for row in rows]
        mean = [row["mean_steps"] for row in rows]
        band = [2 * row["std_steps"] for row in rows]
        left.plot(x, mean, color=color, marker="o", ms=3, label=label)
        left.fill_between(x, [a - b for a, b in zip(mean, band)], [a + b for a, b in zip(mean, band)], color=color,
                          alpha=0.2)
        for r in (r for r in runs if (r["model"], r["lr"]) == (m, lr)):
            done = [lv for lv in r["levels"] if lv["finished"]]
            ends = [sum(lv["steps"] for lv in done[:k + 1]) for k in range(len(done))]
            # the classes trained on: the first level's, then each completed level's plus the ones it adds
            trained = [r["levels"][0]["classes"]] + [min(lv["classes"] + r["settings"]["add_classes"],
                                                         r["settings"]["max_classes"]) for lv in done]
            right.step([0] + ends + [r["total_steps"]], trained + trained[-1:], where="post", color=color,
                       alpha=0.5, lw=1)
        right.plot([], [], color=color, label=label)
    left.set(xlabel="classes in the level", ylabel="training steps to complete the level",
             title="steps per level (mean, 2 sigma over seeds)")
    right.set(xlabel="total training steps", ylabel="classes trained on", title="curriculum progress (each seed)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)  # runs count steps, not seconds: one thread leaves the shared machine its other core
    runs = run_all(args)
    summary = summarise(runs)
    out_dir = Path(args.out_dir)
    write_tables(runs, summary, out_dir)
    plot(runs, summary, out_dir / "steps_per_level.png")
    print_table(runs, summary)
    print(f"wrote {out_dir / 'steps_per_level.csv'}, {out_dir / 'summary.csv'}, {out_dir / 'steps_per_level.png'}")
    return runs


if __name__ == "__main__":
    main()
