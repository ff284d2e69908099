"""Command-line entry of every project's train.py: flags -> config, data, plan -> train -> evaluate -> results.json."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from languini import compute_class, default_corpus, flops, throughput, tokenizer
from languini.books import BooksDataset, DataError
from languini.flags import add_dataclass_flags, overrides
from languini.logs import RunLog
from languini.trainer import Dist, NonFiniteLoss, Trainer, TrainConfig, init_distributed, write_json

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT / "data"
CPU_CONFIG = "cpu"


def build_parser(project: str, configs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"projects/{project}/train.py",
        # the generated usage lists every flag: 25 lines above each one-line error
        usage=f"python projects/{project}/train.py (--compute_class CLASS | --max_steps N) [--FLAG VALUE ...] "
              "(--help lists the flags)",
        description=f"Train and evaluate a {project} model for a compute class.")
    parser.add_argument("--config", default=None,
                        help=f"model size, one of {', '.join(configs.SIZES)} (default: the compute class's, "
                             f"or '{CPU_CONFIG}' on a machine without a GPU)")
    add_dataclass_flags(parser, TrainConfig, "training")
    add_dataclass_flags(parser, configs.ModelConfig, "model (each overrides that field of --config)",
                        show_defaults=False)
    return parser


def data_search_roots() -> list[Path]:
    """Where a prepared dataset is looked for without --data_root: the repository's data/, then ./data."""
    roots = [DEFAULT_DATA]
    if (Path.cwd() / "data").resolve() != DEFAULT_DATA.resolve():
        roots.append(Path.cwd() / "data")
    return roots


def prepared_datasets(root: Path) -> dict[int, Path]:
    """The books_<vocab>/ folders directly under root, by vocab size."""
    found = {}
    for path in sorted(root.glob("books_*")) if root.is_dir() else []:
        vocab = path.name[len("books_"):]
        if path.is_dir() and vocab.isdigit():
            found[int(vocab)] = path
    return found


def dataset_vocab(root: Path, config_vocab: int, vocab_given: bool) -> int | None:
    """The vocab of the dataset to train on under root: the config's if prepared (or given with --vocab_size),
    else the only one there; None when root holds no dataset."""
    found = prepared_datasets(root)
    if not found:
        return None
    if config_vocab in found or vocab_given:
        return config_vocab  # a --vocab_size with no dataset fails in BooksDataset, naming what is there
    if len(found) == 1:
        return next(iter(found))
    raise DataError(f"{root} holds several datasets ({', '.join(p.name for p in found.values())}) and none for the "
                    f"config's vocab {config_vocab}: choose one with --vocab_size.")


def load_data(tcfg: TrainConfig, model_cfg, vocab_given: bool, say, ddp: Dist) -> tuple[BooksDataset, object]:
    """The dataset and the model config, its vocab set to the data's unless --vocab_size was given.

    --data_root, else a dataset prepared under data/ (data_search_roots), else the embedded default corpus."""
    roots = [Path(tcfg.data_root)] if tcfg.data_root is not None else data_search_roots()
    for root in roots:
        vocab = dataset_vocab(root, model_cfg.vocab_size, vocab_given)
        if vocab is not None:
            ds = BooksDataset(root, vocab)
            break
    else:
        if tcfg.data_root is not None:
            ds = BooksDataset(tcfg.data_root, model_cfg.vocab_size)  # fails, saying how to prepare it
        else:
            if not ddp.main:
                dist.barrier()  # rank 0 builds the corpus once
            ds = default_corpus.ensure(DEFAULT_DATA / "default_corpus")
            if ddp.main and ddp.world_size > 1:
                dist.barrier()
            say(f"No dataset given (--data_root) or prepared in {' or '.join(map(str, roots))} "
                f"(books_<vocab>/ from scripts/prepare_books.py): using the {default_corpus.LABEL}.")
    vocab_note = ""
    if model_cfg.vocab_size != ds.vocab_size:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=ds.vocab_size)
        vocab_note = f"; the model's vocab set to its {ds.vocab_size}"
    say(f"Dataset {ds.name}: {ds.dir.resolve()} (fingerprint {ds.fingerprint}){vocab_note}.")
    return ds, model_cfg


def bytes_table(ds: BooksDataset, tcfg: TrainConfig, vocab_size: int) -> torch.Tensor:
    path = Path(tcfg.tokenizer) if tcfg.tokenizer else ds.tokenizer_path()
    if path is None or not path.exists():
        raise DataError(f"Normalised perplexity needs the data's SentencePiece model to count bytes; none in {ds.dir}. "
                        "Pass --tokenizer PATH/books_<vocab>.model.")
    sp = tokenizer.load(path)
    if sp.get_piece_size() != vocab_size:
        raise DataError(f"The tokenizer {path} has {sp.get_piece_size()} tokens but the model's vocab is {vocab_size}.")
    return torch.from_numpy(tokenizer.bytes_per_token(sp))


def file_fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def git_state(repo: Path = REPO_ROOT) -> dict:
    """The commit of the code that runs, and whether the checkout differs from it (None outside git)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != repo.resolve():
            return {"commit": None, "dirty": None}  # an installed copy inside some other checkout
        # untracked files count as changes (a new project not yet committed); ignored ones (runs/, data/) do not
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def check_values(tcfg: TrainConfig, model_cfg) -> None:
    """One clear error for values no run can use, before any work (the trainer would fail later, obscurely)."""
    at_least = {"batch_size": 1, "micro_batches": 1, "eval_batch_size": 1, "log_every": 1, "warmup_steps": 0,
                "max_steps": 1, "eval_every": 1, "checkpoint_every": 1, "stop_at_step": 1, "eval_max_batches": 1,
                "slow_eval_max_windows": 1}
    for name, low in at_least.items():
        value = getattr(tcfg, name)
        if value is not None and value < low:
            raise ValueError(f"--{name} must be at least {low}, got {value}.")
    for name in ("lr", "grad_clip", "tokens_per_second"):
        value = getattr(tcfg, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be positive, got {value}.")
    if not 0 <= tcfg.final_lr_fraction <= 1:
        raise ValueError(f"--final_lr_fraction must be in [0, 1], got {tcfg.final_lr_fraction}.")
    for name in ("seq_len", "vocab_size"):
        if getattr(model_cfg, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(model_cfg, name)}.")
    if tcfg.max_steps is not None and tcfg.compute_class is not None:
        raise ValueError("--max_steps and --compute_class are two budgets; give one. To train only the first N "
                         "steps of a compute class (its schedule unchanged), add --stop_at_step N to the class.")


def main(project: str, configs, model_cls, argv: list[str] | None = None) -> dict | None:
    args = build_parser(project, configs).parse_args(argv)
    try:
        return run(project, configs, model_cls, args)
    except (DataError, ValueError, FileExistsError, FileNotFoundError, throughput.ThroughputNotFoundError,
            NonFiniteLoss) as e:
        sys.exit(f"error: {e}")


def run(project: str, configs, model_cls, args: argparse.Namespace) -> dict | None:
    ddp = init_distributed()
    say = print if ddp.main else (lambda *a, **k: None)
    device = torch.device(f"cuda:{ddp.local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    train_over = overrides(args, TrainConfig)
    cc = train_over.get("compute_class")
    class_defaults = dict(configs.COMPUTE_CLASSES.get(cc, {})) if cc else {}
    config_name = args.config or class_defaults.pop("config", None)
    class_defaults.pop("config", None)
    if args.config is None and device.type == "cpu":
        config_name, class_defaults = CPU_CONFIG, {}
        train_over.setdefault("reference_hardware", "cpu")
        say(f"No GPU: using the CPU-sized config '{CPU_CONFIG}' with reference hardware 'cpu' (pass --config to choose).")
    config_name = config_name or "small"
    tcfg = TrainConfig(**{**class_defaults, **train_over})
    if tcfg.compute_class is not None:
        compute_class.compute_class_seconds(tcfg.compute_class)  # a typo fails before any work is done
    model_over = overrides(args, configs.ModelConfig)
    model_cfg = configs.get(config_name, **model_over)
    check_values(tcfg, model_cfg)

    dataset, model_cfg = load_data(tcfg, model_cfg, "vocab_size" in model_over, say, ddp)
    bytes_per_token = bytes_table(dataset, tcfg, model_cfg.vocab_size)
    tokenizer_file = Path(tcfg.tokenizer) if tcfg.tokenizer else dataset.tokenizer_path()  # bytes_table's

    local_hw = throughput.local_device_name(device)
    fwd_flops = None
    if ddp.main:
        fwd_flops = flops.forward_flops(model_cls(model_cfg).to(device), model_cfg.seq_len, model_cfg.vocab_size,
                                        device)
    registry = throughput.registry_path(project)
    if tcfg.max_steps is not None:
        steps = tcfg.max_steps
        tok_s = tcfg.tokens_per_second
        if tok_s is None:
            try:
                tok_s = throughput.lookup(registry, project, config_name, tcfg.reference_hardware,
                                          model_cfg.seq_len).tokens_per_second
            except throughput.ThroughputNotFoundError:
                tok_s = None  # accelerator time is unknown without a throughput
        say(f"Training {project}/{config_name} for --max_steps {steps} (no compute class).")
    elif tcfg.compute_class is not None:
        plan = compute_class.plan_training(
            project, config_name, tcfg.compute_class, tcfg.batch_size, model_cfg.seq_len, registry,
            tcfg.reference_hardware, tcfg.tokens_per_second, fwd_flops, local_hw, ddp.world_size)
        say(compute_class.format_plan(plan))
        steps, tok_s = plan.steps, plan.tokens_per_second
    else:
        raise ValueError("Give a budget: --compute_class (e.g. 6h, 24h, 15m, 90s) or --max_steps N.")
    if tcfg.dry_run:
        return None

    run_name = tcfg.run_name or (f"{project}_{config_name}_{dataset.name}-{dataset.fingerprint[:8]}"
                                 f"_{tcfg.compute_class or f'{steps}steps'}_bs{tcfg.batch_size}_seed{tcfg.seed}")
    run_dir = Path(tcfg.out_dir) / run_name
    if (run_dir / "checkpoint.pt").exists() and not tcfg.resume:
        raise FileExistsError(f"{run_dir} already holds a run; continue it with --resume true "
                              "or start another with --run_name NAME.")

    provenance = {"tokenizer": str(tokenizer_file.resolve()), "tokenizer_fingerprint": file_fingerprint(tokenizer_file),
                  "git": git_state()}
    peak = flops.device_peak(local_hw)
    trainer = Trainer(project=project, config_name=config_name, model_cfg=model_cfg, model_cls=model_cls,
                      tcfg=tcfg, dataset=dataset, bytes_per_token=bytes_per_token, run_dir=run_dir,
                      total_steps=steps, tokens_per_second=tok_s, reference_hardware=tcfg.reference_hardware,
                      flops_per_forward=fwd_flops, device=device, ddp=ddp, extra_results=provenance)
    trainer.peak_flops = peak.flops_per_second if peak else None
    if ddp.main:  # only now: a batch the data cannot fill fails above without leaving an empty run folder
        run_dir.mkdir(parents=True, exist_ok=True)
    config = {"project": project, "config": config_name, "model": dataclasses.asdict(model_cfg),
              "train": dataclasses.asdict(tcfg), "steps": steps}
    log = RunLog(run_dir, config, tcfg.wandb, tcfg.wandb_project, tcfg.tensorboard, enabled=ddp.main,
                 resume_step=trainer.step if tcfg.resume else None)
    say(f"{sum(p.numel() for p in trainer.model.parameters()):,} parameters, {trainer.precision} on {local_hw}"
        f"{f' x {ddp.world_size}' if ddp.world_size > 1 else ''}; run folder {run_dir}")
    try:
        trainer.train(log)
        if trainer.step < steps:
            say(f"Stopped after step {trainer.step} of {steps} as asked; continue with --resume true.")
            return None
        slow = ("the stream read once, state carried" if trainer.stateful
                else "windows moved by a quarter, their last quarter scored")
        say(f"Final evaluation (fast: all predictions of eval batches; slow: {slow}):")
        results = trainer.results(trainer.final_evaluation(log), tcfg.compute_class)
    finally:
        log.close()
    if ddp.main:
        write_json(run_dir / "results.json", results)
        say(f"Wrote {run_dir / 'results.json'}")
    return results
