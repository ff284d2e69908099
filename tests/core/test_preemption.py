"""Runs that survive a cluster: a stop signal, --resume auto, checkpoint fallback, restarts of the run folder.

The signalled runs are real processes (tests/core/signalling_train.py signals itself at a chosen forward call),
so their exit codes are the ones a requeue script reads.
"""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from languini import checkpoint, run_folder
from languini.experiment import REPO_ROOT, child_python_path, main
from languini.stop import EXIT_UNFINISHED, STOP_SIGNALS, StopRequested, StopSignals
from projects.gpt import configs
from projects.gpt.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--batch_size", "4", "--eval_batch_size", "4", "--eval_max_batches", "2",
        "--slow_eval_max_windows", "2", "--log_every", "1", "--run_name", "r"]
STEPS = ["--max_steps", "8", "--eval_every", "4"]
# results.json fields that record when and how a run was launched, not what it computed
LAUNCH_FIELDS = {"finished", "train_config"}


def train(project, args, processes=1, **signal_env):
    """Run a project's training in fresh processes; SIGNAL/SIGNAL_AT/SIGNAL_RANK make one signal itself."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path(), **signal_env}
    launcher = (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
                if processes > 1 else [])
    script = str(REPO_ROOT / "tests" / "core" / "signalling_train.py")
    return subprocess.run([sys.executable, *launcher, script, project, *args], env=env, capture_output=True,
                          text=True)


# fields of log.jsonl and results.json measured by the wall clock, which differ from run to run
# (assert_wall_times_add_up checks them)
WALL_CLOCK_FIELDS = {"tokens_per_second_local", "train_wall_seconds", "wall_seconds"}


def log_rows(run_dir):
    """Every row of log.jsonl but the fields measured by the wall clock."""
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in rows]


def results(run_dir):
    data = json.loads((run_dir / "results.json").read_text())
    return {k: v for k, v in data.items() if k not in LAUNCH_FIELDS | WALL_CLOCK_FIELDS}


def assert_wall_times_add_up(run_dir):
    """The training steps' wall time grows from row to row across restarts (each continues from its checkpoint's)
    up to the total in results.json; every evaluation row has its own wall time."""
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    seconds = [r["train_wall_seconds"] for r in rows if r["event"] == "train"]
    assert 0 < seconds[0] and seconds == sorted(seconds), seconds
    assert json.loads((run_dir / "results.json").read_text())["train_wall_seconds"] == seconds[-1]
    assert all(r["wall_seconds"] > 0 for r in rows if r["event"] == "eval")


def checkpoint_step(path):
    return torch.load(path, weights_only=False)["step"]


@pytest.fixture(scope="module")
def whole_run(default_corpus_root, tmp_path_factory):
    """An uninterrupted 8-step run, started by --resume auto in an empty folder (what a requeue script's first
    job does): what every stopped and continued run must reproduce exactly."""
    out = tmp_path_factory.mktemp("whole")
    done = train("gpt", TINY + STEPS + ["--data_root", str(default_corpus_root), "--out_dir", str(out),
                                        "--resume", "auto"])
    assert done.returncode == 0, done.stderr
    return out / "r"


def test_resume_auto_in_an_empty_folder_starts_the_run(whole_run):
    assert [r["step"] for r in log_rows(whole_run) if r["event"] == "train"] == list(range(1, 9))
    assert results(whole_run)["steps"] == 8


def test_run_stopped_in_training_and_in_the_final_evaluation_reproduces_the_whole_run(default_corpus_root,
                                                                                      tmp_path, whole_run):
    """Preempted twice, continued each time with --resume auto: the log rows and results of an uninterrupted run."""
    args = TINY + STEPS + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--resume", "auto"]
    run = tmp_path / "r"
    stopped = train("gpt", args, SIGNAL="SIGTERM", SIGNAL_AT="train:5")  # during step 5
    assert stopped.returncode == EXIT_UNFINISHED, stopped.stderr
    assert "Stopped by SIGTERM after step 5 of 8" in stopped.stdout
    assert "--resume auto" in stopped.stdout.splitlines()[-1]  # the command to continue with
    assert checkpoint_step(run / "checkpoint.pt") == 5 and checkpoint_step(run / "checkpoint_previous.pt") == 4
    assert not (run / "results.json").exists()

    # evaluation forwards of this job: 2 for the last step's evaluation during training (valid), then the final
    # evaluation's: 3 for ood_series (fast 2, slow 1; then its rows are written), then test
    stopped = train("gpt", args, SIGNAL="SIGUSR1", SIGNAL_AT="eval:6")
    assert stopped.returncode == EXIT_UNFINISHED, stopped.stderr
    assert "SIGUSR1 before the final evaluation was done" in stopped.stdout
    assert checkpoint_step(run / "checkpoint.pt") == 8
    assert [r["split"] for r in log_rows(run) if r["event"] == "eval"] == ["valid", "valid", "ood_series",
                                                                           "ood_series"]

    continued = train("gpt", args)
    assert continued.returncode == 0, continued.stderr
    assert log_rows(run) == log_rows(whole_run)  # every row once (training and final evaluation), same numbers
    assert results(run) == results(whole_run)
    assert_wall_times_add_up(run)


def test_unreadable_latest_checkpoint_falls_back_to_the_previous_one(default_corpus_root, tmp_path, whole_run):
    args = TINY + STEPS + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path),
                           "--checkpoint_every", "2"]
    assert train("gpt", args + ["--stop_at_step", "6"]).returncode == EXIT_UNFINISHED
    run = tmp_path / "r"
    latest = run / "checkpoint.pt"
    latest.write_bytes(latest.read_bytes()[:latest.stat().st_size // 2])  # a disk that filled up

    continued = train("gpt", args + ["--resume", "auto"])
    assert continued.returncode == 0, continued.stderr
    assert "checkpoint.pt does not match its checksum" in continued.stdout
    assert "previous checkpoint" in continued.stdout and "(step 4)" in continued.stdout
    assert log_rows(run) == log_rows(whole_run)
    assert results(run) == results(whole_run)
    assert_wall_times_add_up(run)


def test_stop_signals_are_recorded_then_end_the_final_evaluation_and_ctrl_c_after_one_quits():
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with StopSignals(announce=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == "SIGTERM" and stop.agreed(1, torch.device("cpu"))
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    with StopSignals(announce=False) as stop:
        stop.stop_at_once()
        with pytest.raises(StopRequested, match="SIGUSR1 before the final evaluation"):
            os.kill(os.getpid(), signal.SIGUSR1)
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == handlers


def test_checkpoint_is_flushed_before_its_rename_and_the_previous_one_kept(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", stat.S_ISDIR(os.fstat(fd).st_mode))),
                                                 fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(a).name, Path(b).name)),
                                                     replace(a, b)))
    checkpoint.save(tmp_path, {"step": 1})
    events.clear()
    checkpoint.save(tmp_path, {"step": 2})
    temporary = ".checkpoint.sha256.json."  # write_atomically's own temporary file, a random name after this
    events = [tuple("<temporary>" if str(e).startswith(temporary) else e for e in event) for event in events]
    # the checksums of both files are on disk before the renames; True: the folder
    assert events == [("fsync", False), ("fsync", False), ("replace", "<temporary>", "checkpoint.sha256.json"),
                      ("fsync", True), ("replace", "checkpoint.pt", "checkpoint_previous.pt"),
                      ("replace", "checkpoint.pt.tmp", "checkpoint.pt"), ("fsync", True)]
    checkpoint.save(tmp_path, {"step": 3}, keep_previous=False)  # after a fallback to the previous one
    assert [checkpoint_step(tmp_path / n) for n in ("checkpoint.pt", "checkpoint_previous.pt")] == [3, 1]


def test_process_states_are_those_of_the_checkpoint_step(tmp_path):
    """After a fallback to the previous checkpoint, each process takes its previous states too."""
    for step in (4, 6):
        checkpoint.save_rank_states(tmp_path, 1, step, [f"state at {step}"])
    assert checkpoint.load_rank_states(tmp_path, 1, 4, torch.device("cpu")) == ["state at 4"]
    assert checkpoint.load_rank_states(tmp_path, 1, 6, torch.device("cpu")) == ["state at 6"]
    with pytest.raises(checkpoint.CheckpointError, match="No recurrent states of process 1 for step 5"):
        checkpoint.load_rank_states(tmp_path, 1, 5, torch.device("cpu"))


def test_continue_command_is_the_same_one_with_resume_auto():
    argv = ["--max_steps", "8", "--resume", "false", "--overwrite=true", "--run_name", "my run"]
    assert run_folder.continue_command("gpt", argv) == \
        "python projects/gpt/train.py --max_steps 8 --run_name 'my run' --resume auto"


def test_no_readable_checkpoint_is_one_error_and_changes_nothing(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--max_steps", "4",
                   "--checkpoint_every", "1", "--stop_at_step", "2"]
    with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):
        main("gpt", configs, Model, args)
    run = tmp_path / "r"
    for name in ("checkpoint.pt", "checkpoint_previous.pt"):
        (run / name).write_bytes((run / name).read_bytes()[:100])
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(SystemExit, match=r"Cannot resume .*checkpoint.pt cannot be read.*checkpoint_previous.pt "
                                         r"cannot be read.*Nothing in the folder was changed"):
        main("gpt", configs, Model, args + ["--resume", "auto"])
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_resume_true_without_a_checkpoint_says_to_use_auto(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--max_steps", "2"]
    with pytest.raises(SystemExit, match="no checkpoint to continue from.*--resume auto"):
        main("gpt", configs, Model, args + ["--resume", "true"])


def test_fresh_start_replaces_a_log_written_before_the_first_checkpoint(default_corpus_root, tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    killed = [{"event": "train", "step": s, "loss": 9.0} for s in (1, 2, 3)]  # a run killed before it saved
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in killed))
    args = TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--max_steps", "4"]
    main("gpt", configs, Model, args)
    assert "stopped before its first checkpoint: starting it again" in capsys.readouterr().out
    train_rows = [r for r in log_rows(run) if r["event"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4] and 9.0 not in [r["loss"] for r in train_rows]


def test_finished_run_is_reported_not_repeated_and_replaced_only_when_asked(default_corpus_root, tmp_path, capsys):
    args = TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--max_steps", "2"]
    first = main("gpt", configs, Model, args)
    log = (tmp_path / "r" / "log.jsonl").read_text()
    capsys.readouterr()
    for resume in ("true", "auto"):
        assert main("gpt", configs, Model, args + ["--resume", resume]) == first  # exit code 0
        assert "is finished" in capsys.readouterr().out
        assert (tmp_path / "r" / "log.jsonl").read_text() == log  # no evaluation repeated
    with pytest.raises(SystemExit, match="another model config or budget"):
        main("gpt", configs, Model, TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path),
                                            "--max_steps", "3", "--resume", "auto"])
    with pytest.raises(SystemExit, match="already holds a run.*--overwrite true"):
        main("gpt", configs, Model, args)
    with pytest.raises(SystemExit, match="cannot be combined with --resume auto"):
        main("gpt", configs, Model, args + ["--overwrite", "true", "--resume", "auto"])
    main("gpt", configs, Model, args + ["--overwrite", "true"])
    assert "Replacing the run" in capsys.readouterr().out
    assert [r["step"] for r in log_rows(tmp_path / "r") if r["event"] == "train"] == [1, 2]


@pytest.mark.parametrize("value", ["sometimes", "yes", "1"])
def test_resume_flag_is_checked_before_anything_else(default_corpus_root, tmp_path, capsys, value):
    with pytest.raises(SystemExit, match="2"):  # argparse's exit code, before the data, the plan or a dry run
        main("gpt", configs, Model, TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path),
                                            "--max_steps", "2", "--dry_run", "--resume", value])
    assert f"argument --resume: expected one of true, false, auto, got '{value}'" in capsys.readouterr().err


def test_truncated_evaluation_file_fails_before_any_training_step(default_corpus_root, tmp_path):
    shutil.copytree(default_corpus_root / "books_2048", tmp_path / "data" / "books_2048")
    book = tmp_path / "data" / "books_2048" / "files" / "ood_series_00.npy"
    book.write_bytes(book.read_bytes()[:-100])
    failed = train("gpt", TINY + ["--data_root", str(tmp_path / "data"), "--out_dir", str(tmp_path / "runs"),
                                  "--max_steps", "2"])
    assert failed.returncode == 1
    assert f"{book} (split ood_series) is truncated" in failed.stderr and "prepare_books.py" in failed.stderr
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing logged, no empty run folder


@pytest.mark.slow
def test_data_parallel_processes_stop_after_the_same_step(default_corpus_root, tmp_path):
    """Only process 1 gets SIGTERM; both stop after the same step (exactness of a data-parallel resume is
    test_trainer's test_data_parallel_resume_restores_every_process_recurrent_state)."""
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "4", "--eval_max_batches", "1",
                   "--slow_eval_max_windows", "1", "--resume", "auto", "--out_dir", str(tmp_path)]
    stopped = train("qlstm", args, processes=2, SIGNAL="SIGTERM", SIGNAL_AT="train:2", SIGNAL_RANK="1")
    assert f"exitcode  : {EXIT_UNFINISHED}" in stopped.stderr  # torchrun reports its workers' exit codes
    assert "Stopped by a stop signal on another process after step 2 of 4" in stopped.stdout
    run = tmp_path / "r"
    assert [checkpoint_step(run / f) for f in ("checkpoint.pt", "states_rank0.pt", "states_rank1.pt")] == [2, 2, 2]
    assert train("qlstm", args, processes=2).returncode == 0
    assert [r["step"] for r in log_rows(run) if r["event"] == "train"] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_stateful_run_saved_on_two_processes_asks_for_two_to_continue(default_corpus_root, tmp_path):
    """Each process carries the states of its own streams: one process cannot continue them (before: a shape
    error deep in the model)."""
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "2", "--eval_max_batches", "1",
                   "--slow_eval_max_windows", "1", "--out_dir", str(tmp_path)]
    assert train("qlstm", args + ["--stop_at_step", "1"], processes=2).returncode == 1  # torchrun: unfinished
    continued = train("qlstm", args + ["--resume", "true"])
    assert continued.returncode == 1
    assert "states of the streams of 2 process(es), not 1: resume with as many processes" in continued.stderr, \
        continued.stderr[-3000:]
