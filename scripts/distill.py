"""Distil a finished run (the teacher, any project) into a model of any project (the student), trained for a
compute class on the teacher's data, stream for stream (Switch Transformer, section 4; languini/distill.py):

    python scripts/distill.py --teacher runs/<switch_gpt run> --project gpt --compute_class 2m \\
        --baseline runs/<plain gpt run of the same class>

The student's loss is  hard_weight x cross-entropy + soft_weight x KL(teacher || student)  per target token
(default 0.75 and 0.25, the slides' mixture); the log's `loss` stays the plain cross-entropy, `aux_distill_kl`
is the weighted KL. With --init_from_teacher true (the default) the student starts from the teacher's weights
wherever a name and a shape agree: for switch_gpt -> gpt every weight but the experts and their routers (the
slides' "non-expert weights"); the names left at their own initialisation are printed and recorded.

Budget. The teacher's forward costs accelerator time, and by default (--charge_teacher true) the compute class
pays for it: the student's training throughput S (its throughput row, found as for any run) and the teacher's
forward throughput F on the same reference hardware (3 x the throughput the teacher's run was charged at, the
plan's forward-to-step ratio, or --teacher_tokens_per_second) make the run spend 1/S + 1/F seconds of the class
per token, so it trains fewer steps than a plain run of the class; the plan (--dry_run) prints the teacher's
share. With --charge_teacher false it trains a plain run's steps and says that the teacher is not charged. Either
way config.json and results.json record it under "distillation" (teacher_charged, the throughputs, the share).

The data (--data_root, --tokenizer) defaults to the teacher run's; the student must find the same dataset
(fingerprint) and vocabulary. --baseline names a finished run of the student without distillation: at the end the
share of the teacher's gain the student kept, (log P_baseline - log P_student) / (log P_baseline - log P_teacher)
per split and mode, is printed (the same command on the finished run prints it again without training).

Every other flag is the student's train.py's (python projects/<project>/train.py --help): --config,
--compute_class or --max_steps, --batch_size, --run_name, --resume, ... The run folder's default name is the plain
run's with _distilled<hard>-<soft>[-noinit][-uncharged]_from-<teacher run> appended.
"""
import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from languini import distill, experiment
from languini.flags import Parser, parse_bool
from languini.run_folder import RESULTS


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="scripts/distill.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="python scripts/distill.py --teacher RUN_DIR --project PROJECT (--compute_class CLASS | --max_steps N) "
              "[--hard_weight W --soft_weight W --init_from_teacher true|false --charge_teacher true|false] "
              "[train.py flags]")
    parser.add_argument("--teacher", required=True, metavar="RUN_DIR",
                        help="a finished run of any project's train.py (results.json and checkpoint.pt)")
    parser.add_argument("--project", required=True, help="the student's project (projects/<project>)")
    parser.add_argument("--hard_weight", type=float, default=distill.HARD_WEIGHT,
                        help="weight of the cross-entropy to the next token (default: %(default)s)")
    parser.add_argument("--soft_weight", type=float, default=distill.SOFT_WEIGHT,
                        help="weight of KL(teacher || student) (default: %(default)s)")
    parser.add_argument("--init_from_teacher", type=parse_bool, default=True, metavar="true|false",
                        help="start from the teacher's weights where name and shape agree (default: true)")
    parser.add_argument("--charge_teacher", type=parse_bool, default=True, metavar="true|false",
                        help="charge the teacher's forward to the compute class (default: true); false trains a "
                             "plain run's steps and records that the teacher was not charged")
    parser.add_argument("--teacher_tokens_per_second", type=float, default=None, metavar="N",
                        help="the teacher's forward throughput on the reference hardware (default: 3 x the "
                             "throughput its run was charged at)")
    parser.add_argument("--baseline", default=None, metavar="RUN_DIR",
                        help="a finished run of the student without distillation: report the share of the "
                             "teacher's gain kept")
    return parser


def with_teacher_data(argv: list[str], teacher: distill.TeacherRun) -> list[str]:
    """The student's flags, with the teacher run's --data_root and --tokenizer where not given."""
    given = {a.split("=")[0] for a in argv}
    extra = []
    for flag in ("data_root", "tokenizer"):
        if f"--{flag}" not in given and teacher.train_config.get(flag) is not None:
            extra += [f"--{flag}", str(teacher.train_config[flag])]
    return argv + extra


def report_gain(teacher: distill.TeacherRun, baseline_dir: Path, results: dict) -> dict:
    """Print the share of the teacher's gain the student kept (distill.gain_kept); return it."""
    baseline = json.loads((baseline_dir / RESULTS).read_text())
    for what, value in (("project", results["project"]), ("compute_class", results["compute_class"])):
        if baseline.get(what) != value:
            print(f"Warning: the baseline's {what} is {baseline.get(what)!r}, the student's {value!r}.")
    kept = distill.gain_kept(teacher.eval, baseline.get("eval", {}), results.get("eval", {}))
    print(f"Share of the teacher's gain kept (normalised perplexity per byte; teacher {teacher.project}/"
          f"{teacher.config}, baseline {baseline_dir.name}):")
    print(f"  {'mode':<5} {'split':>12} {'teacher':>8} {'baseline':>8} {'student':>8} {'kept':>7}")
    for mode, splits in kept.items():
        for split, row in splits.items():
            share = "-" if row["fraction_kept"] is None else f"{row['fraction_kept']:.0%}"
            print(f"  {mode:<5} {split:>12} {row['teacher']:>8.4f} {row['baseline']:>8.4f} {row['student']:>8.4f} "
                  f"{share:>7}")
    if not kept:
        print("  none: the three runs share no split evaluated alike (the same tokens scored).")
    return kept


def main(argv: list[str] | None = None) -> dict | None:
    args, student_argv = build_parser().parse_known_args(argv)
    try:
        teacher = distill.TeacherRun.load(args.teacher)
        baseline = Path(args.baseline) if args.baseline else None
        if baseline is not None and not (baseline / RESULTS).exists():
            raise FileNotFoundError(f"--baseline {baseline} holds no {RESULTS}: not a finished run.")
        teacher_configs = importlib.import_module(f"projects.{teacher.project}.configs")
        teacher_cls = importlib.import_module(f"projects.{teacher.project}.model").Model
        configs = importlib.import_module(f"projects.{args.project}.configs")
        model_cls = importlib.import_module(f"projects.{args.project}.model").Model
        distillation = distill.Distillation(teacher, teacher_cls, teacher_configs, args.hard_weight,
                                            args.soft_weight, args.init_from_teacher, args.charge_teacher,
                                            args.teacher_tokens_per_second)
    except ModuleNotFoundError as e:
        sys.exit(f"error: no such project ({e}); projects are the folders of projects/.")
    except (ValueError, FileNotFoundError, KeyError) as e:
        sys.exit(f"error: {e}")
    results = experiment.main(args.project, configs, model_cls, with_teacher_data(student_argv, teacher),
                              trainer_cls=distillation.trainer, extension=distillation,
                              script=("scripts/distill.py", sys.argv[1:] if argv is None else argv))
    if results is not None and baseline is not None and int(os.environ.get("RANK", "0")) == 0:
        report_gain(teacher, baseline, results)
    return results


if __name__ == "__main__":
    main()
