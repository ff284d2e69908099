"""Command-line entry of every project's train.py: flags -> config, data, plan -> train -> evaluate -> results.json."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from languini import (compute_class, data_check, default_corpus, evaluation, flops, measure, model_contract,
                      run_folder, stages, throughput, tokenizer)
from languini.books import BooksDataset, DataError
from languini.evaluation import describe_slow_protocol
from languini.checkpoint import CheckpointError
from languini.flags import add_dataclass_flags, arg, overrides
from languini.logs import RunLog
from languini.stop import EXIT_UNFINISHED, StopRequested, StopSignals
from languini.trainer import (Dist, NonFiniteLoss, Trainer, TrainConfig, eval_every_max_batches, eval_interval,
                              init_distributed, precision_for, progress_split, write_json)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT / "data"
CPU_CONFIG = "cpu"
CPU_SUFFIX = "_cpu"  # configs named cpu or <anything>_cpu are sized for a CPU: without a GPU, timed on it
CPU_MEASURE_STEPS, CPU_MEASURE_WARMUP = 10, 2  # timing a model on this CPU when the registry has no row for it
RUN_CONFIG = "config.json"


@dataclass
class RunConfig:
    """Where a run reads its data and writes its records: nothing here changes what is trained (TrainConfig)."""
    data_root: str | None = arg(None, "folder holding books_<vocab>/; None: data/ or the embedded default corpus")
    tokenizer: str | None = arg(None, "SentencePiece model of the data, if not inside the data folder")
    out_dir: str = arg("runs", "where run folders go")
    run_name: str | None = arg(None, "run folder name; None: project_config_class_batch_seed")
    resume: str = arg("false", "continue the run in the run folder from its checkpoint: true, false, or auto "
                               "(continue if there is a checkpoint, else start; for requeued jobs)")
    overwrite: bool = arg(False, "replace the run already in the run folder by a fresh one (true/false)")
    wandb: bool = arg(False, "log to Weights & Biases (true/false; offline without an API key)")
    wandb_project: str = arg("languini", "Weights & Biases project")
    tensorboard: bool = arg(False, "log to TensorBoard (true/false; needs the tensorboard package)")
    dry_run: bool = arg(False, "print the training plan and exit (true/false)")


def run_record(tcfg: TrainConfig, rcfg: RunConfig) -> dict:
    """Both configs as one flat record, as the flags are (config.json's "train", results.json's "train_config")."""
    return {**dataclasses.asdict(tcfg), **dataclasses.asdict(rcfg)}


def build_parser(project: str, configs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"projects/{project}/train.py",
        # the generated usage lists every flag: 25 lines above each one-line error
        usage=f"python projects/{project}/train.py (--compute_class CLASS | --max_steps N) [--FLAG VALUE ...] "
              "(--help lists the flags)",
        description=f"Train and evaluate a {project} model for a compute class.")
    parser.add_argument("--config", default=None,
                        help=f"model size, one of {', '.join(configs.SIZES)} (default: the compute class's, "
                             f"or '{CPU_CONFIG}' on a machine without a GPU, where '{CPU_CONFIG}' and configs named "
                             f"*{CPU_SUFFIX} are timed on this CPU)")
    add_dataclass_flags(parser, TrainConfig, "training")
    add_dataclass_flags(parser, RunConfig, "data, run folder and logging")
    add_dataclass_flags(parser, configs.ModelConfig, "model (each overrides that field of --config)",
                        show_defaults=False)
    return parser


def cpu_sized(config_name: str | None) -> bool:
    """Whether a --config is sized for a CPU (None: the default there, 'cpu'): 'cpu' or a name ending in '_cpu'.
    On a machine without a GPU such a config takes the CPU path: reference hardware 'cpu', no compute class's
    GPU config or batch, and a model without a throughput row is timed on this CPU."""
    return config_name is None or config_name == CPU_CONFIG or config_name.endswith(CPU_SUFFIX)


def data_search_roots() -> list[Path]:
    """Where a prepared dataset is looked for without --data_root: the repository's data/ (and data/books/),
    then ./data."""
    roots = [DEFAULT_DATA, DEFAULT_DATA / "books"]  # data/books/books_16384: as the official download leaves it
    if (Path.cwd() / "data").resolve() != DEFAULT_DATA.resolve():
        roots += [Path.cwd() / "data", Path.cwd() / "data" / "books"]
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


def load_data(rcfg: RunConfig, model_cfg, vocab_given: bool, say, ddp: Dist) -> tuple[BooksDataset, object]:
    """The dataset and the model config, its vocab set to the data's unless --vocab_size was given.

    --data_root, else a dataset prepared under data/ (data_search_roots), else the embedded default corpus."""
    roots = [Path(rcfg.data_root)] if rcfg.data_root is not None else data_search_roots()
    for root in roots:
        vocab = dataset_vocab(root, model_cfg.vocab_size, vocab_given)
        if vocab is not None:
            ds = BooksDataset(root, vocab)
            break
    else:
        if rcfg.data_root is not None:
            ds = BooksDataset(rcfg.data_root, model_cfg.vocab_size)  # fails, saying how to prepare it
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


def load_tokenizer(ds: BooksDataset, rcfg: RunConfig, vocab_size: int):
    """The data's SentencePiece model: normalised perplexity counts the bytes and characters it decodes to."""
    path = Path(rcfg.tokenizer) if rcfg.tokenizer else ds.tokenizer_path()
    if path is None or not path.exists():
        raise DataError(f"Normalised perplexity needs the data's SentencePiece model to count bytes; none in {ds.dir}. "
                        "Pass --tokenizer PATH/books_<vocab>.model.")
    sp = tokenizer.load(path)
    if sp.get_piece_size() != vocab_size:
        raise DataError(f"The tokenizer {path} has {sp.get_piece_size()} tokens but the model's vocab is {vocab_size}.")
    return sp


def eval_work(dataset: BooksDataset, tcfg: TrainConfig, seq_len: int, steps: int,
              stateful: bool) -> compute_class.EvalWork:
    """The evaluation a run of `steps` steps will do with these eval settings, in token positions."""
    held_out = [s for s in dataset.splits if s != "train"]
    final = sum(evaluation.fast_positions(dataset.books(s), tcfg.eval_batch_size, seq_len, tcfg.eval_max_batches)
                + evaluation.slow_positions(dataset.books(s), seq_len, tcfg.slow_eval_max_windows, stateful,
                                            tcfg.slow_eval, tcfg.slow_eval_last_n)
                for s in held_out)
    each = evaluation.fast_positions(dataset.books(progress_split(dataset.splits)), tcfg.eval_batch_size, seq_len,
                                     eval_every_max_batches(tcfg))
    return compute_class.EvalWork(each, (steps - 1) // eval_interval(tcfg, steps), final)


def cpu_row(model: throughput.ModelSpec, model_cls, model_cfg, tcfg: TrainConfig, out_dir: str, device: torch.device,
            say) -> throughput.ThroughputRow:
    """This CPU's row for `model` when the project's registry has none: from <out_dir>/throughput.csv, where the
    first run of the model here keeps the row it timed, so later runs (and resumed ones) get the same steps."""
    kept = Path(out_dir) / "throughput.csv"
    try:
        return throughput.lookup(kept, model, throughput.local_device_name(device), tcfg.compile)
    except throughput.ThroughputNotFoundError:
        pass
    say(f"No throughput row for {model} on this CPU: timing {CPU_MEASURE_STEPS} training steps at batch "
        f"{tcfg.batch_size}...")
    precision = precision_for(device, tcfg.precision)[2]
    torch.manual_seed(0)
    timed = measure.measure_batch_size(model_cls(model_cfg).to(device).train(), model_cfg, tcfg.batch_size, device,
                                       tcfg, CPU_MEASURE_STEPS, CPU_MEASURE_WARMUP)  # the steps this run trains
    row = throughput.ThroughputRow(
        model.project, model.config, model.fingerprint, model.flags, throughput.local_device_name(device),
        tcfg.batch_size, model_cfg.seq_len, timed.tokens_per_second, None, precision, tcfg.compile, torch.__version__,
        datetime.date.today().isoformat(), "measured", f"fixed batch size; timed by train.py before its run (micro_batches {tcfg.micro_batches}, "
        f"grad_clip {tcfg.grad_clip})")
    throughput.append_row(kept, row)
    say(f"Measured {row.tokens_per_second:,.0f} tokens/s; kept in {throughput.display_path(kept)} for the next runs of "
        f"this model here. Its compute classes are this machine's time.")
    return row


def budget(tcfg: TrainConfig, model: throughput.ModelSpec, model_cls, model_cfg, device: torch.device, ddp: Dist,
           fwd_flops: float | None, dataset: BooksDataset, stateful: bool, cpu_path: bool, out_dir: str, say,
           staged: tuple | None = None) -> tuple[int, float | None, throughput.ThroughputRow | None, stages.Schedule]:
    """The run's budget from --max_steps or --compute_class: (steps, tokens/s on the reference hardware, the
    throughput row they came from, the sequence-length schedule). Without a row, --max_steps leaves the
    throughput None (accelerator time unknown); --compute_class prints its plan, and on the CPU path (a CPU-sized
    config without a GPU, cpu_sized) times a model it has no row for. `staged`: the parsed --stages, each charged
    at its own length's throughput."""
    registry, local_hw = throughput.registry_path(model.project), throughput.local_device_name(device)
    row = None
    if tcfg.max_steps is not None:
        steps = tcfg.max_steps
        tok_s = tcfg.tokens_per_second
        if tok_s is None:
            try:
                row = throughput.lookup(registry, model, tcfg.reference_hardware, tcfg.compile)
                tok_s = row.tokens_per_second
            except throughput.ThroughputNotFoundError:
                pass  # accelerator time is unknown without a throughput
        schedule = stages.schedule_for_steps(tcfg.stages, model_cfg.seq_len, steps, tok_s)
        if staged:  # each stage at its own throughput, where known
            rates = [tcfg.tokens_per_second or _stage_rate(registry, model.project, model.config, model_cfg,
                                                           s.seq_len, tcfg) for s in staged]
            schedule = dataclasses.replace(schedule, tokens_per_second=tuple(rates))
        say(f"Training {model.project}/{model.config} for --max_steps {steps} (no compute class)"
            + (f" in stages: {describe_schedule(schedule)}." if staged else "."))
    elif tcfg.compute_class is not None:
        def plan_for(row=None, time_stages=None):
            return compute_class.plan_training(
                model, tcfg.compute_class, tcfg.batch_size, model_cfg.seq_len, registry, tcfg.reference_hardware,
                tcfg.tokens_per_second, fwd_flops, local_hw, ddp.world_size, compiled=tcfg.compile, row=row,
                stage_models=stage_models(model.project, model.config, model_cfg, staged, time_stages)
                if staged else None)

        try:
            plan = plan_for()
        except throughput.ThroughputNotFoundError as error:
            # The CPU path's reference is this machine: a model it has no row for (another vocabulary, other
            # flags) is timed here. Processes would time it differently, so not under torchrun.
            if not (cpu_path and ddp.world_size == 1 and throughput.hardware_matches(tcfg.reference_hardware,
                                                                                      local_hw)):
                if device.type == "cpu" and not cpu_path:
                    raise throughput.ThroughputNotFoundError(
                        f"{error}\nWithout a GPU only a CPU-sized config ('{CPU_CONFIG}' or a name ending in "
                        f"'{CPU_SUFFIX}') is timed on this CPU; '{model.config}' is planned against the registry."
                    ) from None
                raise

            def time_stage(spec, cfg):  # this CPU's row for a stage's length where the registry has none
                try:
                    return throughput.lookup(registry, spec, tcfg.reference_hardware, tcfg.compile)
                except throughput.ThroughputNotFoundError:
                    return cpu_row(spec, model_cls, cfg, tcfg, out_dir, device, say)

            plan = (plan_for(time_stages=time_stage) if staged
                    else plan_for(cpu_row(model, model_cls, model_cfg, tcfg, out_dir, device, say)))
        if ddp.main:
            plan = dataclasses.replace(plan, evaluation=eval_work(dataset, tcfg, model_cfg.seq_len, plan.steps, stateful))
        say(compute_class.format_plan(plan))
        if cpu_path and tcfg.compute_class in compute_class.PAPER_COMPUTE_CLASSES:
            say(f"Note: without a GPU, --compute_class {tcfg.compute_class} means {tcfg.compute_class} of this CPU "
                f"training the toy config '{model.config}', not the paper's {tcfg.compute_class} class on an RTX 3090. "
                "For a smoke run of a few minutes use --compute_class 2m; to plan the paper's class, name its "
                "config (--config small --dry_run true) on the book data it is defined for (vocab 16384).")
        steps, tok_s, row, schedule = plan.steps, plan.tokens_per_second, plan.throughput_row, plan.schedule()
    else:
        raise ValueError("Give a budget: --compute_class (e.g. 6h, 24h, 15m, 90s) or --max_steps N.")
    return steps, tok_s, row, schedule


def budget_of_run(run_dir: Path, steps: int, tok_s: float, row, say) -> tuple:
    """A resumed run keeps the budget it started with, even if the registry has gained a newer row since."""
    try:
        started = json.loads((run_dir / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return steps, tok_s, row
    if "tokens_per_second" not in started or (started["steps"], started["tokens_per_second"]) == (steps, tok_s):
        return steps, tok_s, row
    say(f"Continuing with the budget the run started with: {started['steps']:,} steps at "
        f"{started['tokens_per_second']:,.0f} tokens/s (the registry now gives {steps:,} steps at {tok_s:,.0f}).")
    kept = started.get("throughput_row")
    kept_row = throughput.ThroughputRow(**kept) if kept and "project" in kept else None
    return started["steps"], started["tokens_per_second"], kept_row


def stage_settings(tcfg: TrainConfig, model_cfg, configs) -> tuple[TrainConfig, tuple | None]:
    """--stages as the schedule it names (a project's configs.STAGES) and its stages (None without --stages);
    a clear error for a bad one before any work."""
    named = getattr(configs, "STAGES", {})
    if tcfg.stages in named:
        tcfg = dataclasses.replace(tcfg, stages=named[tcfg.stages])
    if tcfg.stages is None:
        return tcfg, None
    try:
        return tcfg, stages.parse(tcfg.stages, model_cfg.seq_len)
    except ValueError as error:
        names = f" or one of this project's named schedules: {', '.join(named)}" if named else ""
        raise ValueError(f"{error}{names}") from None


def _stage_rate(registry, project: str, config_name: str, model_cfg, seq_len: int, tcfg: TrainConfig):
    """The reference throughput of the model at a stage's length, or None if the registry has none."""
    spec = throughput.model_spec(project, config_name, dataclasses.replace(model_cfg, seq_len=seq_len))
    try:
        return throughput.lookup(registry, spec, tcfg.reference_hardware, tcfg.compile).tokens_per_second
    except throughput.ThroughputNotFoundError:
        return None


def stage_models(project: str, config_name: str, model_cfg, staged: tuple, time_stage=None) -> list[tuple]:
    """Each stage with the model at its length (the config at the stage's seq_len), charged at that model's
    throughput, and its row from `time_stage(spec, config)` where given (else None: the registry's)."""
    models = []
    for stage in staged:
        cfg = dataclasses.replace(model_cfg, seq_len=stage.seq_len)
        spec = throughput.model_spec(project, config_name, cfg)
        models.append((stage, spec, time_stage(spec, cfg) if time_stage else None))
    return models


def describe_schedule(schedule: stages.Schedule) -> str:
    return ", then ".join(f"{n:,} steps at {length}" for length, n in zip(schedule.seq_lens, schedule.steps))


def schedule_of_run(run_dir: Path, schedule: stages.Schedule) -> stages.Schedule:
    """A resumed staged run keeps the stages it started with (as budget_of_run keeps its budget); `schedule`
    otherwise."""
    try:
        started = json.loads((run_dir / RUN_CONFIG).read_text()).get("stages")
    except (OSError, ValueError):
        return schedule
    if not started:
        return schedule
    return stages.Schedule(tuple(s["seq_len"] for s in started), tuple(s["steps"] for s in started),
                           tuple(s["tokens_per_second"] for s in started))


def row_record(row: throughput.ThroughputRow | None, tokens_per_second: float | None) -> dict | None:
    """The throughput a run's budget came from, for results.json: the registry row, or the hand-set value."""
    if row is not None:
        return dataclasses.asdict(row)
    return None if tokens_per_second is None else {"source": "--tokens_per_second",
                                                   "tokens_per_second": tokens_per_second}


def run_results(trainer: Trainer, rcfg: RunConfig, evals: dict) -> dict:
    """The body of results.json: what was trained, for how long, and its evaluations (`evals`)."""
    tcfg, pos, fwd = trainer.tcfg, trainer.position(trainer.step), trainer.flops_per_forward
    return {
        "project": trainer.project, "config": trainer.config_name,
        "model_config": dataclasses.asdict(trainer.model_cfg), "train_config": run_record(tcfg, rcfg),
        "compute_class": tcfg.compute_class, "reference_hardware": tcfg.reference_hardware,
        "tokens_per_second": trainer.tokens_per_second, "global_batch_size": tcfg.batch_size,
        "seq_len": trainer.seq_len, "steps": trainer.step, "tokens_seen": pos["tokens"],
        **({"stages": trainer.schedule.records(tcfg.batch_size)} if tcfg.stages else {}),
        "accelerator_seconds": pos["accelerator_seconds"],
        "accelerator_hours": pos["accelerator_seconds"] / 3600 if pos["accelerator_seconds"] is not None else None,
        "train_wall_seconds": trainer.train_seconds,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "flops_per_forward": fwd,
        "total_flops": flops.train_flops_per_token(fwd, trainer.seq_len) * pos["tokens"] if fwd else None,
        "dataset": str(trainer.dataset.dir.resolve()), "dataset_name": trainer.dataset.name,
        "dataset_fingerprint": trainer.dataset.fingerprint, "precision": trainer.precision,
        "wall_seconds": {**trainer.wall_seconds, "total": sum(trainer.wall_seconds.values())},
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **evals,
    }


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


def main(project: str, configs, model_cls, argv: list[str] | None = None, trainer_cls: type[Trainer] = Trainer
         ) -> dict | None:
    """The command line of projects/<project>/train.py; trainer_cls: a subclass of Trainer (its own training
    step, say) to train with."""
    args = build_parser(project, configs).parse_args(argv)
    try:
        # SIGTERM/SIGUSR1/SIGINT: the run stops after its current step with a checkpoint and exits unfinished
        with StopSignals(announce=int(os.environ.get("RANK", "0")) == 0) as stop:
            return run(project, configs, model_cls, args, stop, trainer_cls)
    except StopRequested as e:  # exit code EXIT_UNFINISHED tells a requeue script to run the same command again
        if e.announce:
            command = run_folder.continue_command(project, sys.argv[1:] if argv is None else argv,
                                                  int(os.environ.get("WORLD_SIZE", "1")))
            print(f"{e}\nContinue with the same command and --resume auto:\n  {command}", flush=True)
        sys.exit(EXIT_UNFINISHED)
    except KeyboardInterrupt:  # Ctrl-C after a first stop signal
        print("Interrupted at once: the run's last checkpoint is kept; continue with --resume auto.", file=sys.stderr)
        sys.exit(130)
    except (DataError, ValueError, FileExistsError, FileNotFoundError, throughput.ThroughputNotFoundError,
            NonFiniteLoss, CheckpointError, model_contract.ContractError) as e:
        sys.exit(f"error: {e}")


def run(project: str, configs, model_cls, args: argparse.Namespace, stop: StopSignals | None = None,
        trainer_cls: type[Trainer] = Trainer) -> dict | None:
    stop = stop or StopSignals()  # not installed: never stops
    stateful = model_contract.stateful(model_cls)  # a model that does not declare it fails before any work
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
    cpu_path = device.type == "cpu" and cpu_sized(args.config)
    if cpu_path:  # this CPU is the reference: a compute class's GPU config and batch do not apply
        config_name, class_defaults = args.config or CPU_CONFIG, {}
        train_over.setdefault("reference_hardware", "cpu")
        if args.config is None:
            say(f"No GPU: using the CPU-sized config '{CPU_CONFIG}' with reference hardware 'cpu' (pass --config to "
                "choose).")
        else:
            say(f"No GPU: '{config_name}' is a CPU-sized config (named '{CPU_CONFIG}' or '*{CPU_SUFFIX}'), with "
                f"reference hardware '{train_over['reference_hardware']}'.")
    config_name = config_name or "small"
    tcfg = TrainConfig(**{**class_defaults, **train_over})
    rcfg = RunConfig(**overrides(args, RunConfig))
    if tcfg.compute_class is not None:
        compute_class.compute_class_seconds(tcfg.compute_class)  # a typo fails before any work is done
    model_over = overrides(args, configs.ModelConfig)
    model_cfg = configs.get(config_name, **model_over)
    check_values(tcfg, model_cfg)
    tcfg, staged = stage_settings(tcfg, model_cfg, configs)

    dataset, model_cfg = load_data(rcfg, model_cfg, "vocab_size" in model_over, say, ddp)
    sp = load_tokenizer(dataset, rcfg, model_cfg.vocab_size)
    bytes_per_token = torch.from_numpy(tokenizer.bytes_per_token(sp))
    tokenizer_file = Path(rcfg.tokenizer) if rcfg.tokenizer else dataset.tokenizer_path()  # load_tokenizer's

    local_hw = throughput.local_device_name(device)
    model = throughput.model_spec(project, config_name, model_cfg)
    fwd_flops = None
    if ddp.main:
        fwd_flops = flops.forward_flops(model_cls(model_cfg).to(device), model_cfg.seq_len, model_cfg.vocab_size,
                                        device)
    steps, tok_s, row, schedule = budget(tcfg, model, model_cls, model_cfg, device, ddp, fwd_flops, dataset,
                                         stateful, cpu_path, rcfg.out_dir, say, staged)
    if rcfg.dry_run:
        return None

    run_name = rcfg.run_name or (f"{project}_{config_name}_{dataset.name}-{dataset.fingerprint[:8]}"
                                 f"_{tcfg.compute_class or f'{steps}steps'}_bs{tcfg.batch_size}_seed{tcfg.seed}"
                                 + (f"_stages{tcfg.stages.replace(':', 'x').replace(',', '-')}" if staged else ""))
    run_dir = Path(rcfg.out_dir) / run_name
    resume = run_folder.start_or_continue(run_dir, rcfg.resume, rcfg.overwrite, say, ddp.main)
    if resume and tcfg.compute_class is not None:
        steps, tok_s, row = budget_of_run(run_dir, steps, tok_s, row, say)
        schedule = schedule_of_run(run_dir, stages.Schedule.single(model_cfg.seq_len, steps, tok_s))
    finished = run_folder.finished_results(run_dir, dataclasses.asdict(model_cfg), steps) if resume else None
    if finished is not None:
        say(f"{run_dir} is finished (results.json of {finished.get('finished')}): nothing left to train or "
            "evaluate. Train it again with --overwrite true, or another run with --run_name NAME.")
        return finished
    data_check.check_run_data(dataset, say, ddp.rank, ddp.world_size)  # a bad file fails now, not after training

    provenance = {"tokenizer": str(tokenizer_file.resolve()), "tokenizer_fingerprint": file_fingerprint(tokenizer_file),
                  "git": git_state()}
    peak = flops.device_peak(local_hw)
    trainer = trainer_cls(project=project, config_name=config_name, model_cfg=model_cfg, model_cls=model_cls,
                          tcfg=tcfg, dataset=dataset, bytes_per_token=bytes_per_token, run_dir=run_dir,
                          total_steps=steps, tokens_per_second=tok_s, flops_per_forward=fwd_flops,
                          peak_flops=peak.flops_per_second if peak else None, device=device, ddp=ddp,
                          decode=sp.decode, resume=resume, schedule=schedule)
    if ddp.main:  # only now: a batch the data cannot fill fails above without leaving an empty run folder
        run_dir.mkdir(parents=True, exist_ok=True)
    config = {"project": project, "config": config_name, "model": dataclasses.asdict(model_cfg),
              "train": run_record(tcfg, rcfg), "steps": steps, "tokens_per_second": tok_s,
              "throughput_row": row_record(row, tcfg.tokens_per_second),
              **({"stages": schedule.records(tcfg.batch_size)} if staged else {})}
    if ddp.main:  # what scripts/evaluate.py needs to rebuild the model and its data
        write_json(run_dir / RUN_CONFIG, config)
    log = RunLog(run_dir, config, rcfg.wandb, rcfg.wandb_project, rcfg.tensorboard, enabled=ddp.main,
                 resume_step=trainer.step if resume else None, resume_rows=trainer.log_rows)
    say(f"{sum(p.numel() for p in trainer.model.parameters()):,} parameters, {trainer.precision} on {local_hw}"
        f"{f' x {ddp.world_size}' if ddp.world_size > 1 else ''}; run folder {run_dir}")
    try:
        trainer.train(log, stop)
        if trainer.step < steps:
            if stop.received:
                saved = f"its checkpoint is saved in {run_dir}" if trainer.step else "nothing was trained yet"
                raise StopRequested(f"Stopped by {stop.received} after step {trainer.step} of {steps}; {saved}.",
                                    ddp.main)
            say(f"Stopped after step {trainer.step} of {steps} as asked; continue with --resume true.")
            return None
        stop.agreed(ddp.world_size, device)
        stop.stop_at_once()  # the last step's checkpoint is on disk: a signal may end the evaluation at once
        say(f"Final evaluation (fast: all predictions of eval batches; slow: "
            f"{describe_slow_protocol(trainer.evaluator.slow_protocol_for(trainer.stateful))}):")
        evals = trainer.final_evaluation(log)
        results = {**run_results(trainer, rcfg, evals), "model_fingerprint": model.fingerprint,
                   "model_flags": model.flags, "throughput_row": row_record(row, tcfg.tokens_per_second), **provenance}
    finally:
        log.close()
    if ddp.main:
        write_json(run_dir / "results.json", results)
        say(f"Wrote {run_dir / 'results.json'}")
    return results
