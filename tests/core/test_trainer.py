"""The trainer end to end on CPU: exact resume, non-finite loss, bad input, data discovery, run records,
data parallel = accumulation."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from languini.books import BooksDataset
from languini import experiment
from languini.experiment import REPO_ROOT, main
from languini.trainer import TrainConfig, Trainer, lr_factor
from projects.gpt import configs
from projects.gpt.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--batch_size", "4", "--eval_batch_size", "4", "--eval_max_batches", "2",
        "--slow_eval_max_windows", "2"]


def train_losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]


def test_lr_schedule_by_hand():
    assert lr_factor(0, 100, 10, 0.01) == pytest.approx(0.1)
    assert lr_factor(9, 100, 10, 0.01) == pytest.approx(1.0)
    assert lr_factor(55, 100, 10, 0.01) == pytest.approx(0.01 + 0.99 * 0.5)  # half-way through the cosine
    assert lr_factor(100, 100, 10, 0.01) == pytest.approx(0.01)  # decayed by 100x


class SparseEmbeddingGPT(Model):
    """The token embedding with row-sparse gradients in a group marked sparse, as memory layers do."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.tok_emb.sparse = True

    def optimizer_groups(self, lr):
        rest = [p for n, p in self.named_parameters() if not n.startswith("tok_emb")]
        return [{"params": rest, "lr": lr}, {"params": [self.tok_emb.weight], "lr": 10 * lr, "sparse": True}]


@pytest.mark.parametrize("model_cls", [Model, SparseEmbeddingGPT])
def test_killed_and_resumed_run_has_the_losses_of_an_uninterrupted_one(default_corpus_root, tmp_path, model_cls):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "8", "--log_every", "1",
                   "--eval_every", "4", "--micro_batches", "2", "--run_name", "r"]
    whole = main("gpt", configs, model_cls, args + ["--out_dir", str(tmp_path / "a")])
    assert main("gpt", configs, model_cls, args + ["--out_dir", str(tmp_path / "b"), "--stop_at_step", "5"]) is None
    run_b = tmp_path / "b" / "r"
    first_job = torch.load(run_b / "checkpoint.pt", weights_only=False)["wall_seconds"]
    with (run_b / "log.jsonl").open("a") as f:  # a row the killed run wrote after its last checkpoint
        f.write(json.dumps({"event": "train", "step": 7, "loss": 0.0}) + "\n")
    resumed = main("gpt", configs, model_cls, args + ["--out_dir", str(tmp_path / "b"), "--resume", "true"])
    assert train_losses(run_b) == train_losses(tmp_path / "a" / "r")
    assert [s for s, _ in train_losses(run_b)] == list(range(1, 9))
    assert resumed["eval"] == whole["eval"]
    eval_rows = [json.loads(line) for line in (run_b / "log.jsonl").read_text().splitlines()]
    eval_rows = [r for r in eval_rows if r["event"] == "eval"]
    assert all(r["tokens"] == r["step"] * 4 * 32 for r in eval_rows)  # training tokens, not tokens scored
    results = json.loads((run_b / "results.json").read_text())
    assert results["steps"] == 8 and results["tokens_seen"] == 8 * 4 * 32
    assert set(results["eval"]["slow"]) == {"valid", "test", "ood_series"}
    wall = results["wall_seconds"]  # both jobs of the run, evaluations apart
    assert wall["training"] > first_job["training"] > 0 and wall["evaluation_during_training"] > 0
    assert wall["final_evaluation"] > 0
    assert wall["total"] == pytest.approx(wall["training"] + wall["evaluation_during_training"]
                                          + wall["final_evaluation"])


def test_sparse_group_updates_only_rows_read(default_corpus_root, tmp_path):
    torch.manual_seed(0)
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    trainer = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=SparseEmbeddingGPT,
                      tcfg=TrainConfig(batch_size=2), dataset=BooksDataset(default_corpus_root, 2048),
                      bytes_per_token=torch.ones(2048), run_dir=tmp_path, total_steps=1, tokens_per_second=1.0,
                      reference_hardware="cpu")
    assert isinstance(trainer.optimizers[1], torch.optim.SparseAdam)
    before = trainer.model.tok_emb.weight.detach().clone()
    x, y = trainer.batches(0)
    trainer.train_step(x, y)
    changed = (trainer.model.tok_emb.weight.detach() != before).any(dim=1)
    assert set(changed.nonzero().flatten().tolist()) == set(x.unique().tolist())


class NanAfter3(Model):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls = 0

    def forward(self, x, state=None):
        logits, state = super().forward(x, state)
        if self.training:
            self.calls += 1
            if self.calls > 3:
                logits = logits * float("nan")
        return logits, state


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "10", "--checkpoint_every", "1",
                   "--out_dir", str(tmp_path), "--run_name", "r"]
    with pytest.raises(SystemExit, match="Loss is nan at step 4.*last good checkpoint"):
        main("gpt", configs, NanAfter3, args)
    ckpt = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 3
    assert all(torch.isfinite(p).all() for p in ckpt["model"].values())


@pytest.mark.parametrize("extra,message", [
    (["--config", "huge"], "Unknown GPT config 'huge'"),
    (["--data_root", "/nonexistent"], "prepare_books.py"),
    (["--vocab_size", "4096"], "books_2048: pass the matching --vocab_size"),
    ([], "--compute_class .* or --max_steps"),
    (["--compute_class", "1h", "--reference_hardware", "RTX 3090"], "measure_throughput.py gpt cpu --sweep"),
    (["--compute_class", "6 hours"], "not understood"),
    (["--max_steps", "1", "--batch_size", "5", "--micro_batches", "2"], "not divisible into 2 micro-batches"),
    (["--max_steps", "1", "--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--max_steps", "1", "--seq_len", "0"], "--seq_len must be at least 1, got 0"),
    (["--max_steps", "1", "--eval_max_batches", "0"], "--eval_max_batches must be at least 1"),
    (["--max_steps", "1", "--lr", "-1"], "--lr must be positive"),
    (["--max_steps", "1", "--batch_size", "81"], "Only 80 books for 81 streams"),  # the default corpus has 80
    (["--max_steps", "5", "--compute_class", "1m"], "two budgets; give one.*--stop_at_step"),
])
def test_bad_input_gives_one_clear_error(default_corpus_root, tmp_path, extra, message):
    args = TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path)] + extra
    with pytest.raises(SystemExit, match=message):
        main("gpt", configs, Model, args)
    assert list(tmp_path.iterdir()) == []  # no empty run folder left behind


def test_bare_boolean_flag_means_true_and_bad_values_say_how(default_corpus_root, tmp_path, capsys):
    args = TINY + ["--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--compute_class", "1m",
                   "--tokens_per_second", "1e4"]
    assert main("gpt", configs, Model, args + ["--dry_run"]) is None  # a bare --dry_run plans and trains nothing
    assert "steps" in capsys.readouterr().out and list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        main("gpt", configs, Model, args + ["--dry_run", "maybe"])
    err = capsys.readouterr().err
    assert "expected true or false, got 'maybe'" in err
    assert len(err.splitlines()) <= 3  # not a usage dump of every flag


def test_existing_run_is_not_overwritten(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "1", "--out_dir", str(tmp_path),
                   "--run_name", "r"]
    main("gpt", configs, Model, args)
    with pytest.raises(SystemExit, match="--resume true"):
        main("gpt", configs, Model, args)


def test_dry_run_prints_the_paper_plan(default_corpus_root, capsys):
    assert main("gpt", configs, Model, ["--config", "small", "--compute_class", "6h", "--dry_run", "true",
                                         "--data_root", str(default_corpus_root), "--vocab_size", "2048"]) is None
    out = capsys.readouterr().out
    assert "18,265" in out and "55,416 tokens/s" in out  # Table 5/6: GPT small, 6h, batch 128


def integrity_fingerprint(dataset_dir):
    """The fingerprint by hand: sha256 over the file-list hashes prepare_books wrote to integrity.json."""
    lists = json.loads((dataset_dir / "integrity.json").read_text())["file_lists"]
    return hashlib.sha256("".join(f"{n} {h}\n" for n, h in sorted(lists.items())).encode()).hexdigest()[:12]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty data/ standing in for the repository's; the working directory is its parent."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setattr(experiment, "DEFAULT_DATA", data)
    monkeypatch.chdir(tmp_path)
    return data


def test_prepared_dataset_is_found_without_flags_and_its_vocab_used(default_corpus_root, data_dir, tmp_path, capsys):
    (data_dir / "books_2048").symlink_to(default_corpus_root / "books_2048")
    # the small config's vocab is 16384: it follows the one dataset in data/
    args = ["--config", "small"] + TINY[2:] + ["--max_steps", "2", "--out_dir", str(tmp_path / "runs")]
    results = main("gpt", configs, Model, args)
    out = capsys.readouterr().out
    fingerprint = integrity_fingerprint(default_corpus_root / "books_2048")
    assert f"Dataset books_2048: {(default_corpus_root / 'books_2048').resolve()} (fingerprint {fingerprint}); " \
           "the model's vocab set to its 2048" in out
    assert "default corpus" not in out
    assert results["model_config"]["vocab_size"] == 2048
    assert results["dataset"] == str((default_corpus_root / "books_2048").resolve())
    assert (results["dataset_name"], results["dataset_fingerprint"]) == ("books_2048", fingerprint)
    [run] = (tmp_path / "runs").iterdir()
    assert run.name == f"gpt_small_books_2048-{fingerprint[:8]}_2steps_bs4_seed0"
    tokenizer = default_corpus_root / "books_2048" / "tokenizer.model"
    assert results["tokenizer"] == str(tokenizer.resolve())
    assert results["tokenizer_fingerprint"] == hashlib.sha256(tokenizer.read_bytes()).hexdigest()[:12]
    if shutil.which("git") and (REPO_ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert results["git"]["commit"] == head.stdout.strip() and results["git"]["dirty"] in (True, False)
    assert json.loads((run / "results.json").read_text()) == results


def test_several_prepared_datasets_need_a_vocab(default_corpus_root, data_dir):
    (data_dir / "books_2048").symlink_to(default_corpus_root / "books_2048")
    (data_dir / "books_4096").mkdir()
    args = ["--config", "small"] + TINY[2:] + ["--compute_class", "1m", "--tokens_per_second", "1e4", "--dry_run"]
    with pytest.raises(SystemExit, match="several datasets .*books_2048, books_4096.* --vocab_size"):
        main("gpt", configs, Model, args)
    assert main("gpt", configs, Model, args + ["--vocab_size", "2048"]) is None


def test_default_corpus_only_without_a_prepared_dataset(default_corpus_root, data_dir, capsys):
    (data_dir / "default_corpus").symlink_to(default_corpus_root)  # built already: ensure() only opens it
    args = TINY + ["--compute_class", "1m", "--tokens_per_second", "1e4", "--dry_run"]
    assert main("gpt", configs, Model, args) is None
    out = capsys.readouterr().out
    assert "No dataset given (--data_root) or prepared in" in out and "embedded default corpus" in out
    assert f"(fingerprint {integrity_fingerprint(default_corpus_root / 'books_2048')})" in out


def run_script(project, args, processes=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    script = str(REPO_ROOT / "projects" / project / "train.py")
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)] if processes > 1 else []
    subprocess.run([sys.executable, *launcher, script, *args], check=True, env=env, capture_output=True)


def test_data_parallel_processes_equal_gradient_accumulation(default_corpus_root, tmp_path):
    """2 processes x 1 micro-batch (torchrun, DDP over gloo) train like 1 process x 2 micro-batches."""
    common = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "4", "--log_every", "1",
                     "--run_name", "r", "--eval_max_batches", "1"]
    run_script("gpt", common + ["--micro_batches", "2", "--out_dir", str(tmp_path / "one")])
    run_script("gpt", common + ["--out_dir", str(tmp_path / "two")], processes=2)
    one, two = train_losses(tmp_path / "one" / "r"), train_losses(tmp_path / "two" / "r")
    assert [s for s, _ in one] == [s for s, _ in two] == [1, 2, 3, 4]
    for (_, a), (_, b) in zip(one, two):
        assert a == pytest.approx(b, rel=1e-5)


def test_data_parallel_resume_restores_every_process_recurrent_state(default_corpus_root, tmp_path):
    """A stateful model (qLSTM) under DDP: each process's streams keep their own state across a resume."""
    common = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "4", "--log_every", "1",
                     "--run_name", "r", "--eval_max_batches", "1", "--slow_eval_max_windows", "1"]
    run_script("qlstm", common + ["--out_dir", str(tmp_path / "whole")], processes=2)
    run_script("qlstm", common + ["--out_dir", str(tmp_path / "split"), "--stop_at_step", "2"], processes=2)
    run_script("qlstm", common + ["--out_dir", str(tmp_path / "split"), "--resume", "true"], processes=2)
    assert train_losses(tmp_path / "split" / "r") == train_losses(tmp_path / "whole" / "r")


def test_wandb_logging_runs_without_prompts(default_corpus_root, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "2", "--out_dir", str(tmp_path),
                   "--wandb", "true"]
    assert main("gpt", configs, Model, args)["steps"] == 2


def test_tensorboard_without_its_package_is_explained(default_corpus_root, tmp_path):
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed")
    except ImportError:
        pass
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "1", "--out_dir", str(tmp_path),
                   "--tensorboard", "true"]
    with pytest.raises(SystemExit, match=r"pip install -e '.\[tensorboard\]'"):
        main("gpt", configs, Model, args)
