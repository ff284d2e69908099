"""Evaluate a run's checkpoint as the final evaluation of train.py does, into the run's results.json.

    python scripts/evaluate.py runs/gpt_small_books_16384-1a2b3c4d_6h_bs128_seed0     # every held-out split
    python scripts/evaluate.py runs/gpt_small_books_16384-1a2b3c4d_6h_bs128_seed0 --split test ood_holmes --mode slow \
        --last_n 64
    torchrun --standalone --nproc_per_node 4 scripts/evaluate.py RUN_DIR                # shared by 4 GPUs

The model is rebuilt from the run's config.json (written when training starts; a results.json serves too)
and the weights of its checkpoint.pt (RUN_DIR is runs/<project>_<config>_<dataset>-<fingerprint>_<class>_bs<batch>
_seed<seed>, as train.py names it, or its --run_name), and the data is found as in training (--data_root, --tokenizer to
look elsewhere). Each split and mode evaluated replaces its entry in results.json's eval (created if the run has
none yet; the entry it replaces is kept in replaced_eval, and eval_by names what wrote each entry that train.py
did not), with the fields training writes: normalised perplexity per byte and per character, top-1 and
top-10 accuracy, tokens, bytes and characters scored, loss and perplexity by training frequency, and for the
slow eval its protocol. --eval_cache_size N adds the slow eval with a neural cache (mode slow_cache) beside the
plain one, from the same forward passes: sweep its --eval_cache_theta and --eval_cache_lambda on a validation
split, as the thesis does (Appendix B.2).
"""
import argparse
import dataclasses
import datetime
import importlib
import json
import sys
from pathlib import Path

import torch

from languini import (checkpoint, datasets, experiment, frequency, memory_layers, model_contract, model_parallel,
                      neural_cache, run_folder, tokenizer)
from languini.books import SLOW_EVAL_PROTOCOLS, SLOW_EVAL_SAMPLES, DataError
from languini.evaluation import Evaluator, describe_slow_protocol, evaluate_splits
from languini.flags import Parser
from languini.trainer import TrainConfig, close_distributed, init_distributed, precision_for, write_json

RESULTS = "results.json"
RUN_DEFAULT = "the run's"
CAPS = ("slow_eval_last_n", "eval_max_batches", "slow_eval_max_windows", "eval_cache_size")  # none is a value


def optional_int(text: str) -> int | None:
    return None if text.strip().lower() == "none" else int(text)


def parse_args(argv=None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run folder of train.py (holding config.json and checkpoint.pt)")
    parser.add_argument("--split", nargs="+", default=None, help="splits to evaluate (default: all but train)")
    parser.add_argument("--mode", choices=("fast", "slow", "both"), default="both", help="default: both")
    parser.add_argument("--slow_eval", choices=SLOW_EVAL_PROTOCOLS, default=None,
                        help=f"slow eval protocol of stateless models (default: {RUN_DEFAULT}; see train.py --help)")
    parser.add_argument("--last_n", dest="slow_eval_last_n", type=optional_int, default=argparse.SUPPRESS,
                        metavar="N",
                        help="slow eval: targets scored per window, and the windows' stride (default: the "
                             "run's; none: seq_len // 4)")
    parser.add_argument("--eval_batch_size", type=int, default=None, help=f"default: {RUN_DEFAULT}")
    parser.add_argument("--eval_max_batches", type=optional_int, default=argparse.SUPPRESS,
                        help=f"fast eval: batches per split (none: all; default: {RUN_DEFAULT})")
    parser.add_argument("--slow_eval_max_windows", type=optional_int, default=argparse.SUPPRESS,
                        help=f"slow eval: windows per split (none: all; default: {RUN_DEFAULT})")
    parser.add_argument("--slow_eval_sample", choices=SLOW_EVAL_SAMPLES, default=None,
                        help=f"a capped slow eval's windows: spread or first (default: {RUN_DEFAULT}; see train.py "
                             "--help)")
    parser.add_argument("--eval_cache_size", type=optional_int, default=argparse.SUPPRESS,
                        help=f"slow eval: also with a neural cache of this many entries (none: off; default: "
                             f"{RUN_DEFAULT})")
    parser.add_argument("--eval_cache_theta", type=float, default=None, help=f"default: {RUN_DEFAULT}")
    parser.add_argument("--eval_cache_lambda", type=float, default=None, help=f"default: {RUN_DEFAULT}")
    parser.add_argument("--data_root", default=None, help=f"folder holding books_<vocab>/ (default: {RUN_DEFAULT})")
    parser.add_argument("--tokenizer", default=None, help=f"SentencePiece model of the data (default: {RUN_DEFAULT})")
    parser.add_argument("--precision", default=None, help=f"auto, bf16, fp16 or fp32 (default: {RUN_DEFAULT})")
    parser.add_argument("--out", default=None, help=f"results file to update (default: RUN_DIR/{RESULTS})")
    return parser.parse_args(argv)


def load_run(run_dir: Path) -> dict:
    """Project, config name and training config of a run, from config.json or else results.json."""
    for name, train_key in ((run_folder.RUN_CONFIG, "train"), (RESULTS, "train_config")):
        path = run_dir / name
        if path.exists():
            saved = json.loads(path.read_text())
            return {"project": saved["project"], "config": saved["config"], "train": saved[train_key]}
    raise FileNotFoundError(f"{run_dir} holds neither {run_folder.RUN_CONFIG} nor {RESULTS}: not a run folder "
                            "of a train.py.")


def run_configs(saved: dict, args: argparse.Namespace) -> tuple[TrainConfig, experiment.RunConfig]:
    """The run's training and run configs (saved as one flat record) with the flags given on the command line."""
    def fields_of(cls, given: dict):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in {**saved, **given}.items() if k in names})

    given = {"data_root": args.data_root, "tokenizer": args.tokenizer, "eval_batch_size": args.eval_batch_size,
             "slow_eval": args.slow_eval, "slow_eval_sample": args.slow_eval_sample, "precision": args.precision, "eval_cache_theta": args.eval_cache_theta,
             "eval_cache_lambda": args.eval_cache_lambda}
    given = {k: v for k, v in given.items() if v is not None}
    given.update({field: getattr(args, field) for field in CAPS if hasattr(args, field)})
    return fields_of(TrainConfig, given), fields_of(experiment.RunConfig, given)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    try:
        return evaluate(args)
    except (DataError, ValueError, FileNotFoundError, checkpoint.CheckpointError, model_contract.ContractError) as e:
        sys.exit(f"error: {e}")


def evaluate(args: argparse.Namespace) -> dict | None:
    ddp = init_distributed()
    say = print if ddp.main else (lambda *a, **k: None)
    device = torch.device(f"cuda:{ddp.local_rank}" if torch.cuda.is_available() else "cpu")
    run_dir = Path(args.run_dir)
    run = load_run(run_dir)
    if not checkpoint.exists(run_dir):
        raise FileNotFoundError(f"{run_dir} holds no {checkpoint.CHECKPOINT}: nothing to evaluate.")
    ckpt, _ = checkpoint.load(run_dir, device)  # the previous checkpoint, with a warning, if the latest is unreadable
    out = Path(args.out) if args.out else run_dir / RESULTS
    results = json.loads(out.read_text()) if out.exists() else {}
    if results.get("steps", ckpt["step"]) != ckpt["step"]:
        raise ValueError(f"{out} holds the results of step {results['steps']} but the checkpoint is of step "
                         f"{ckpt['step']}; write these elsewhere with --out FILE.")

    configs = importlib.import_module(f"projects.{run['project']}.configs")
    model_cls = importlib.import_module(f"projects.{run['project']}.model").Model
    memory_layers.check_renamed(ckpt["model_config"], configs.ModelConfig)
    model_cfg = configs.ModelConfig(**ckpt["model_config"])
    tcfg, rcfg = run_configs(run["train"], args)
    dataset, _ = datasets.load_data(rcfg.data_root, model_cfg, True, say, ddp)  # the trained model's vocab decides
    splits = args.split or [s for s in dataset.splits if s != "train"]
    for split in splits:
        dataset.books(split)  # an unknown split fails here, before any work, with the splits there are
    sp = datasets.load_tokenizer(dataset, rcfg.tokenizer, model_cfg.vocab_size)

    with model_parallel.single_process():  # the whole model on every process (checkpoint.load merged its shards)
        model = model_cls(model_cfg).to(device)
    model.load_state_dict(ckpt["model"])
    stateful = model_contract.stateful(model_cls)
    autocast, _, precision = precision_for(device, tcfg.precision)
    evaluator = Evaluator(torch.from_numpy(tokenizer.bytes_per_token(sp)), model_cfg.vocab_size, model_cfg.seq_len,
                          device, tcfg.eval_batch_size, tcfg.eval_max_batches, tcfg.slow_eval_max_windows, autocast,
                          ddp.rank, ddp.world_size, sp.decode, tcfg.slow_eval, tcfg.slow_eval_last_n,
                          frequency=frequency.FrequencyBuckets.of_dataset(dataset, model_cfg.vocab_size, ddp.main),
                          cache=neural_cache.settings(tcfg), slow_sample=tcfg.slow_eval_sample)
    modes = ("fast", "slow") if args.mode == "both" else (args.mode,)
    say(f"Evaluating {run['project']}/{run['config']} at step {ckpt['step']} ({precision}) on {', '.join(splits)}"
        + (f"; slow: {describe_slow_protocol(evaluator.slow_protocol_for(stateful))}" if "slow" in modes
           else ""))
    evals = evaluate_splits(evaluator, model, dataset, splits, stateful, modes, say=say)
    close_distributed(ddp)
    if not ddp.main:
        return None
    if not results:
        results = {"project": run["project"], "config": run["config"], "model_config": ckpt["model_config"],
                   "train_config": experiment.run_record(tcfg, rcfg), "steps": ckpt["step"]}
    evaluated_by = f"scripts/evaluate.py, {datetime.datetime.now().isoformat(timespec='seconds')}"
    for mode, rows in evals["eval"].items():
        for split, row in rows.items():
            earlier = results.get("eval", {}).get(mode, {}).get(split)
            if earlier is not None:  # kept: the training's own numbers are never lost silently
                results.setdefault("replaced_eval", {}).setdefault(mode, {}).setdefault(split, []).append(earlier)
                say(f"{mode} {split}: replaces the earlier evaluation, kept in {out.name}'s replaced_eval")
            results.setdefault("eval", {}).setdefault(mode, {})[split] = row
            results.setdefault("eval_by", {}).setdefault(mode, {})[split] = evaluated_by
    if "memory_stats" in evals:
        results.setdefault("memory_stats", {}).update(evals["memory_stats"])
    write_json(out, results)
    say(f"Wrote {out}")
    return results


if __name__ == "__main__":
    main()
