"""Command-line entry of every project's train.py, the story of a run: read the flags into configs and check
their values, find the data, plan the budget (languini.plan), build the trainer, train, evaluate, and record
config.json and results.json in the run folder."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from languini import (
    compute_class,
    data_check,
    datasets,
    flops,
    hebbian,
    model_contract,
    model_parallel,
    neural_cache,
    run_folder,
    stages,
    throughput,
    tokenizer,
)
from languini import plan as planning
from languini.books import BooksDataset, DataError
from languini.checkpoint import CheckpointError
from languini.evaluation import describe_slow_protocol
from languini.flags import Parser, add_dataclass_flags, arg, overrides
from languini.logs import RunLog
from languini.plan import CPU_CONFIG, CPU_SUFFIX
from languini.stop import EXIT_UNFINISHED, StopRequested, StopSignals
from languini.trainer import (DIST_TIMEOUT_MINUTES, NonFiniteLoss, TrainConfig, Trainer, check_same_flags,
                              close_distributed, init_distributed, write_json)

REPO_ROOT = Path(__file__).resolve().parents[1]


def child_python_path() -> str:
    """PYTHONPATH for a child process: the repository first, then the caller's (packages installed beside the
    environment, as on machines without a package index, must stay importable)."""
    return os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


@dataclass
class RunConfig:
    """Where a run reads its data and writes its records: nothing here changes what is trained (TrainConfig)."""
    data_root: str | None = arg(None, "folder holding books_<vocab>/; None: data/ or the embedded default corpus")
    tokenizer: str | None = arg(None, "SentencePiece model of the data, if not inside the data folder")
    out_dir: str = arg("runs", "where run folders go")
    run_name: str | None = arg(None, "run folder name under --out_dir; None: <project>_<config>_<dataset>-<its "
                                     "fingerprint>_<compute class or N steps>_bs<batch>_seed<seed>[_stages...]")
    resume: str = arg("false", "continue the run in the run folder from its checkpoint: true, false, or auto "
                               "(continue if there is a checkpoint, else start; for requeued jobs)",
                      choices=("true", "false", "auto"))
    overwrite: bool = arg(False, "replace the run already in the run folder by a fresh one (true/false)")
    wandb: bool = arg(False, "log to Weights & Biases (true/false; offline without an API key)")
    wandb_project: str = arg("languini", "Weights & Biases project")
    tensorboard: bool = arg(False, "log to TensorBoard (true/false; needs the tensorboard package)")
    dry_run: bool = arg(False, "print the training plan and exit, writing nothing (true/false)")
    keep_timing: bool | None = arg(None, "keep this CPU's timing of a model without a row (<out_dir>/throughput.csv) "
                                         "for the next runs here; default: yes, but not for a dry run (a tool that "
                                         "plans runs with dry runs sets it)")
    plan_json: str | None = arg(None, "also write the plan (steps, tokens, parameters, expected wall time) to this "
                                      "JSON file, e.g. with --dry_run true for a tool that plans many runs")
    dist_timeout_minutes: float = arg(DIST_TIMEOUT_MINUTES, "with several processes: how long one waits for the "
                                                            "others (an evaluation, a checkpoint) before the run fails "
                                                            "instead of hanging, in minutes")


# this machine's copy of the data: the machines of one run may keep it under different paths
PER_MACHINE_FLAGS = ("data_root", "tokenizer")


class RunExtension(Protocol):
    """What a tool built on train.py adds to a run (scripts/distill.py, languini/distill.py): its own work charged
    to the budget, a tag on the run folder's default name, and entries for config.json and results.json."""

    run_tag: str  # appended to the default run name, so the run does not take a plain run's folder

    def plan(self, plan: planning.Plan) -> planning.Plan:
        """The plan with the extension's work charged to it (or said not to be), before it is printed."""
        ...

    def record(self) -> dict:
        """Entries for config.json and results.json (asked for once the trainer is built)."""
        ...


def build_parser(project: str, configs, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """train.py's flags; the model flags' defaults shown are those of the --config in argv (else the default
    config here: 'cpu' without a GPU, else 'small')."""
    parser = Parser(
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
    shown = _config_named(argv, configs) or (CPU_CONFIG if not torch.cuda.is_available() else "small")
    add_dataclass_flags(parser, configs.ModelConfig, f"model (each overrides that field of --config; the defaults "
                        f"shown are config '{shown}')", defaults=dataclasses.asdict(configs.get(shown)))
    return parser


def _config_named(argv: list[str] | None, configs) -> str | None:
    """The --config of argv, if it names one of the project's configs (a wrong one fails in the full parse)."""
    first = Parser(add_help=False)
    first.add_argument("--config")
    name = first.parse_known_args(sys.argv[1:] if argv is None else argv)[0].config
    return name if name in configs.SIZES else None


def main(project: str, configs, model_cls, argv: list[str] | None = None, trainer_cls: type[Trainer] = Trainer,
         extension: RunExtension | None = None, script: tuple[str, list[str]] | None = None) -> dict | None:
    """The command line of projects/<project>/train.py; trainer_cls: a subclass of Trainer (its own training
    step, say) to train with; extension: what a tool built on train.py adds to the run (RunExtension); script: the
    tool's path and its whole command line, for the command that continues a stopped run."""
    args = build_parser(project, configs, argv).parse_args(argv)
    try:
        # SIGTERM/SIGUSR1/SIGINT: the run stops after its current step with a checkpoint and exits unfinished
        with StopSignals(announce=int(os.environ.get("RANK", "0")) == 0) as stop:
            return run(project, configs, model_cls, args, stop, trainer_cls, extension)
    except StopRequested as e:  # exit code EXIT_UNFINISHED tells a requeue script to run the same command again
        if e.announce:
            path, script_argv = script or (None, sys.argv[1:] if argv is None else argv)
            command = run_folder.continue_command(project, script_argv, int(os.environ.get("WORLD_SIZE", "1")),
                                                  e.drop_flags, path)
            print(f"{e}\nContinue with the same command and --resume auto:\n  {command}", flush=True)
        sys.exit(EXIT_UNFINISHED)
    except KeyboardInterrupt:  # Ctrl-C after a first stop signal
        print("Interrupted at once: the run's last checkpoint is kept; continue with --resume auto.", file=sys.stderr)
        sys.exit(130)
    except (DataError, ValueError, FileExistsError, FileNotFoundError, throughput.ThroughputNotFoundError,
            NonFiniteLoss, CheckpointError, model_contract.ContractError) as e:
        sys.exit(f"error: {e}")


def run(project: str, configs, model_cls, args: argparse.Namespace, stop: StopSignals | None = None,
        trainer_cls: type[Trainer] = Trainer, extension: RunExtension | None = None) -> dict | None:
    """One run: settings, data, plan, run folder, trainer, training, evaluation, records (None: a dry run; the
    finished results otherwise). A run stopped before its last step (a signal, --stop_at_step) raises
    StopRequested, which main() turns into the exit code EXIT_UNFINISHED. The run folder is locked while it runs."""
    with run_folder.locks_released_on_exit():
        return _run(project, configs, model_cls, args, stop, trainer_cls, extension)


def _run(project: str, configs, model_cls, args: argparse.Namespace, stop: StopSignals | None,
         trainer_cls: type[Trainer], extension: RunExtension | None) -> dict | None:
    stop = stop or StopSignals()  # not installed: never stops
    stateful = model_contract.stateful(model_cls)  # a model that does not declare it fails before any work
    ddp = init_distributed(RunConfig(**overrides(args, RunConfig)).dist_timeout_minutes)
    say = print if ddp.main else (lambda *a, **k: None)
    device = torch.device(f"cuda:{ddp.local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    # the settings, each value checked before any work, and the same on every process
    settings = read_settings(args, configs, device, say)
    config_name, tcfg, rcfg = settings.config_name, settings.tcfg, settings.rcfg
    check_same_flags(resolved_flags(settings), ddp.world_size)

    # the data, which sets the model's vocab
    dataset, model_cfg = datasets.load_data(rcfg.data_root, settings.model_cfg, settings.vocab_given, say, ddp,
                                            smoke_corpus=planning.cpu_sized(config_name), dry_run=rcfg.dry_run)
    if dataset is not None:  # None: a dry run of a paper config without prepared data
        sp = datasets.load_tokenizer(dataset, rcfg.tokenizer, model_cfg.vocab_size)
        bytes_per_token = torch.from_numpy(tokenizer.bytes_per_token(sp))
        tokenizer_file = datasets.tokenizer_file(dataset, rcfg.tokenizer)

    # the plan: printed here (the dry run stops after it), followed by the trainer, recorded in config.json
    local_hw = throughput.local_device_name(device)
    model = throughput.model_spec(project, config_name, model_cfg, hebbian.settings(tcfg))  # Hebbian: its own row
    fwd_flops = n_parameters = None
    if ddp.main:  # counted on this process alone, on the whole model
        with model_parallel.single_process():
            whole = model_cls(model_cfg).to(device)
            n_parameters = model_parallel.parameter_count(whole)
            fwd_flops = flops.forward_flops(whole, model_cfg.seq_len, model_cfg.vocab_size, device)
            del whole
    # every process plans the evaluation: its caps, sized to the class, must be the same on all of them
    plan = planning.plan_run(model, model_cls, model_cfg, tcfg, device, ddp.world_size, fwd_flops, dataset, stateful,
                             settings.cpu_path, rcfg.out_dir, say,
                             keep_timing=not rcfg.dry_run if rcfg.keep_timing is None else rcfg.keep_timing)
    if extension is not None:
        plan = extension.plan(plan)
    say(planning.format_plan(plan))
    if rcfg.plan_json and ddp.main:
        write_json(Path(rcfg.plan_json), planning.plan_summary(plan, n_parameters))
    if rcfg.dry_run:
        return None

    # the run folder: a continued run keeps the plan it started with
    run_dir = Path(rcfg.out_dir) / (rcfg.run_name or default_run_name(project, config_name, dataset, tcfg, plan.steps)
                                    + (extension.run_tag if extension is not None else ""))
    if ddp.main and run_dir.is_dir():  # held before anything in it is continued or cleared
        run_folder.lock(run_dir)
    resume = run_folder.start_or_continue(run_dir, rcfg.resume, rcfg.overwrite, say, ddp.main)
    if resume:
        plan = planning.resumed(plan, run_dir, say)
    tcfg = plan.training_config(tcfg)  # with the evaluation caps sized to the class, if the plan sized them
    finished = run_folder.finished_results(run_dir, model_cfg, plan.steps) if resume else None
    if finished is not None:
        say(f"{run_dir} is finished (results.json of {finished.get('finished')}): nothing left to train or "
            "evaluate. Train it again with --overwrite true, or another run with --run_name NAME.")
        return finished
    data_check.check_run_data(dataset, say, ddp.rank, ddp.world_size)  # a bad file fails now, not after training

    # the trainer, the run's config.json and its log
    provenance = {"tokenizer": str(tokenizer_file.resolve()), "tokenizer_fingerprint": file_fingerprint(tokenizer_file),
                  "git": git_state()}
    peak = flops.device_peak(local_hw)
    trainer = trainer_cls(project=project, config_name=config_name, model_cfg=model_cfg, model_cls=model_cls,
                          tcfg=tcfg, dataset=dataset, bytes_per_token=bytes_per_token, run_dir=run_dir,
                          total_steps=plan.steps, tokens_per_second=plan.tokens_per_second, flops_per_forward=fwd_flops,
                          peak_flops=peak.flops_per_second if peak else None, device=device, ddp=ddp,
                          decode=sp.decode, resume=resume, schedule=plan.schedule())
    if ddp.main:  # only now: a batch the data cannot fill fails above without leaving an empty run folder
        run_dir.mkdir(parents=True, exist_ok=True)
        run_folder.lock(run_dir)
    extra = extension.record() if extension is not None else {}
    config = {"project": project, "config": config_name, "model": dataclasses.asdict(model_cfg),
              "train": run_record(tcfg, rcfg), "dataset_name": dataset.name,
              "dataset_fingerprint": dataset.fingerprint, **plan.record(), **extra}
    if ddp.main:  # what scripts/evaluate.py needs to rebuild the model and its data
        write_json(run_dir / run_folder.RUN_CONFIG, config)
    log = RunLog(run_dir, config, rcfg.wandb, rcfg.wandb_project, rcfg.tensorboard, enabled=ddp.main,
                 resume_step=trainer.step if resume else None, resume_rows=trainer.log_rows)
    say(f"{model_parallel.parameter_count(trainer.model):,} parameters, {trainer.precision} on {local_hw}"
        f"{f' x {ddp.world_size}' if ddp.world_size > 1 else ''}; run folder {run_dir}")
    # train, evaluate, record results.json
    try:
        trainer.train(log, stop)
        if trainer.step < plan.steps:
            if stop.received:
                saved = f"its checkpoint is saved in {run_dir}" if trainer.step else "nothing was trained yet"
                raise StopRequested(f"Stopped by {stop.received} after step {trainer.step} of {plan.steps}; "
                                    f"{saved}.", ddp.main)
            raise StopRequested(f"Stopped after step {trainer.step} of {plan.steps} as asked (--stop_at_step); its "
                                f"checkpoint is saved in {run_dir}.", ddp.main, drop_flags=("--stop_at_step",))
        check = planning.throughput_check(plan, trainer.position(trainer.step)["tokens"], trainer.train_seconds)
        if check is not None and not check["within_margin"]:
            say(planning.describe_throughput_check(check))
            log.write({"event": "throughput_check", **trainer.position(trainer.step), **check})
        stop.agreed(ddp.world_size, device)
        stop.stop_at_once()  # the last step's checkpoint is on disk: a signal may end the evaluation at once
        say(f"Final evaluation (fast: all predictions of eval batches; slow: "
            f"{describe_slow_protocol(trainer.evaluator.slow_protocol_for(trainer.stateful))}):")
        evals = trainer.final_evaluation(log)
        results = {**run_results(trainer, rcfg, evals), "model_fingerprint": model.fingerprint,
                   "model_flags": model.flags, "throughput_row": plan.throughput_record(), "throughput_check": check,
                   **provenance, **extra}
    finally:
        log.close()
    if ddp.main:
        write_json(run_dir / "results.json", results)
        say(f"Wrote {run_dir / 'results.json'}")
    close_distributed(ddp)
    return results


@dataclass(frozen=True)
class Settings:
    """What the flags ask for, checked: the named config, the training, run and model configs, and whether the run
    takes the CPU path (planning.cpu_sized without a GPU)."""
    config_name: str
    tcfg: TrainConfig
    rcfg: RunConfig
    model_cfg: object
    vocab_given: bool  # --vocab_size: the data does not set the model's vocab
    cpu_path: bool


def resolved_flags(settings: Settings) -> dict:
    """Every setting of the run by its flag's name (the named config's values filled in), but PER_MACHINE_FLAGS."""
    flags = {"config": settings.config_name, **dataclasses.asdict(settings.tcfg), **dataclasses.asdict(settings.rcfg),
             **dataclasses.asdict(settings.model_cfg)}
    return {name: value for name, value in flags.items() if name not in PER_MACHINE_FLAGS}


def read_settings(args: argparse.Namespace, configs, device: torch.device, say) -> Settings:
    """The flags over the compute class's defaults (its config, batch and settings; none on the CPU path, where
    this CPU is the reference hardware) over the named config, each value checked before any work."""
    train_over = overrides(args, TrainConfig)
    cc = train_over.get("compute_class")
    class_defaults = dict(configs.COMPUTE_CLASSES.get(cc, {})) if cc else {}
    config_name = args.config or class_defaults.pop("config", None)
    class_defaults.pop("config", None)
    # a GPU named as the reference hardware means the class's GPU config, planned against the registry
    gpu_reference = train_over.get("reference_hardware") not in (None, "cpu")
    cpu_path = device.type == "cpu" and planning.cpu_sized(args.config) and not gpu_reference
    if device.type == "cpu" and gpu_reference:
        say(f"No GPU here: planning for the reference hardware {train_over['reference_hardware']!r} from its "
            f"registry row{'' if args.config else ' (the compute class config)'}; only a dry run is useful here.")
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
    tcfg = stage_settings(tcfg, model_cfg, configs)
    return Settings(config_name, tcfg, rcfg, model_cfg, "vocab_size" in model_over, cpu_path)


def check_values(tcfg: TrainConfig, model_cfg) -> None:
    """One clear error for values no run can use, before any work (the trainer would fail later, obscurely)."""
    at_least = {"batch_size": 1, "micro_batches": 1, "eval_batch_size": 1, "log_every": 1, "warmup_steps": 0,
                "max_steps": 1, "eval_every": 1, "checkpoint_every": 1, "stop_at_step": 1, "eval_max_batches": 1,
                "slow_eval_max_windows": 1}
    for name, low in at_least.items():
        value = getattr(tcfg, name)
        if value is not None and value < low:
            raise ValueError(f"--{name} must be at least {low}, got {value}.")
    if tcfg.eval_budget is not None and tcfg.eval_budget < 0:
        raise ValueError(f"--eval_budget must be 0 (no limit) or a positive fraction, got {tcfg.eval_budget}.")
    for name in ("lr", "grad_clip", "tokens_per_second"):
        value = getattr(tcfg, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be positive, got {value}.")
    if not 0 <= tcfg.final_lr_fraction <= 1:
        raise ValueError(f"--final_lr_fraction must be in [0, 1], got {tcfg.final_lr_fraction}.")
    for name in ("seq_len", "vocab_size"):
        if getattr(model_cfg, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(model_cfg, name)}.")
    if tcfg.slow_eval_last_n is not None and not 0 < tcfg.slow_eval_last_n <= model_cfg.seq_len:
        raise ValueError(f"--slow_eval_last_n must be in 1..seq_len ({model_cfg.seq_len}), not "
                         f"{tcfg.slow_eval_last_n}.")
    if tcfg.hebbian_limit < 0 or not 0 <= tcfg.hebbian_min_mix <= 1:
        raise ValueError(f"--hebbian_limit must be at least 0 and --hebbian_min_mix in [0, 1], got "
                         f"{tcfg.hebbian_limit} and {tcfg.hebbian_min_mix}.")
    neural_cache.settings(tcfg)  # a bad --eval_cache_* fails now, not after training
    if tcfg.max_steps is not None and tcfg.compute_class is not None:
        raise ValueError("--max_steps and --compute_class are two budgets; give one. To train only the first N "
                         "steps of a compute class (its schedule unchanged), add --stop_at_step N to the class.")


def stage_settings(tcfg: TrainConfig, model_cfg, configs) -> TrainConfig:
    """--stages as the schedule it names (a project's configs.STAGES); a clear error for a bad one before any
    work."""
    named = getattr(configs, "STAGES", {})
    if tcfg.stages in named:
        tcfg = dataclasses.replace(tcfg, stages=named[tcfg.stages])
    if tcfg.stages is not None:
        try:
            stages.rows_per_stream(stages.parse(tcfg.stages, model_cfg.seq_len), tcfg.stage_batch)
        except ValueError as error:
            names = f" or one of this project's named schedules: {', '.join(named)}" if named else ""
            raise ValueError(f"{error}{names}") from None
    return tcfg


def default_run_name(project: str, config_name: str, dataset: BooksDataset, tcfg: TrainConfig, steps: int) -> str:
    return (f"{project}_{config_name}_{dataset.name}-{dataset.fingerprint[:8]}"
            f"_{tcfg.compute_class or f'{steps}steps'}_bs{tcfg.batch_size}_seed{tcfg.seed}"
            + (f"_stages{tcfg.stages.replace(':', 'x').replace(',', '-')}" if tcfg.stages is not None else ""))


def run_record(tcfg: TrainConfig, rcfg: RunConfig) -> dict:
    """Both configs as one flat record, as the flags are (config.json's "train", results.json's "train_config")."""
    return {**dataclasses.asdict(tcfg), **dataclasses.asdict(rcfg)}


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
        "parameters": model_parallel.parameter_count(trainer.model),
        "flops_per_forward": fwd,
        "total_flops": flops.train_flops_per_token(fwd, trainer.seq_len) * pos["tokens"] if fwd else None,
        "dataset": str(trainer.dataset.dir.resolve()), "dataset_name": trainer.dataset.name,
        "dataset_fingerprint": trainer.dataset.fingerprint, "precision": trainer.precision,
        "wall_seconds": {**trainer.wall_seconds, "total": sum(trainer.wall_seconds.values())},
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **({"hebbian_softmax": trainer.hebbian.summary()} if trainer.hebbian else {}),
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
