"""The trainer end to end on CPU: exact resume, non-finite loss, bad input, data discovery, run records,
data parallel = accumulation."""
import dataclasses
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from languini import datasets, measure, throughput
from languini.books import BooksDataset
from languini.experiment import REPO_ROOT, child_python_path, main
from languini.measure import Measurement
from languini.stop import EXIT_UNFINISHED
from languini.trainer import TrainConfig, Trainer, ramp_times_cosine, warmup_steps, warmup_then_cosine
from projects.gpt import configs
from projects.gpt.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--batch_size", "4", "--eval_batch_size", "4", "--eval_max_batches", "2",
        "--slow_eval_max_windows", "2"]


def train_losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]


def test_warmup_then_cosine_by_hand():
    assert warmup_then_cosine(0, 100, 10, 0.01) == pytest.approx(0.1)
    assert warmup_then_cosine(9, 100, 10, 0.01) == pytest.approx(1.0)
    assert warmup_then_cosine(55, 100, 10, 0.01) == pytest.approx(0.01 + 0.99 * 0.5)  # half-way through the cosine
    assert warmup_then_cosine(100, 100, 10, 0.01) == pytest.approx(0.01)  # decayed by 100x


def test_ramp_times_cosine_by_hand():
    # The official schedule, 1,000 steps, warm-up 200: optimiser step s uses the factor of count c = s + 1,
    # min(c, 200) / 200 * (0.01 + 0.99 * (1 + cos(pi * c / 1000)) / 2).
    cos_pi_10, cos_pi_5 = math.sqrt(10 + 2 * math.sqrt(5)) / 4, (1 + math.sqrt(5)) / 4  # cos(pi/10), cos(pi/5)
    first = 1 / 200 * (0.01 + 0.99 * (1 + math.cos(math.pi / 1000)) / 2)
    assert ramp_times_cosine(0, 1000, 200, 0.01) == pytest.approx(first)
    assert ramp_times_cosine(99, 1000, 200, 0.01) == pytest.approx(0.5 * (0.01 + 0.99 * (1 + cos_pi_10) / 2))
    assert ramp_times_cosine(199, 1000, 200, 0.01) == pytest.approx(0.01 + 0.99 * (1 + cos_pi_5) / 2)
    assert ramp_times_cosine(499, 1000, 200, 0.01) == pytest.approx(0.505)  # cos(pi/2) = 0
    assert ramp_times_cosine(999, 1000, 200, 0.01) == pytest.approx(0.01)  # the last step: decayed by 100x
    # A run shorter than the warm-up never reaches the peak: its last step is half-ramped and fully decayed.
    assert ramp_times_cosine(99, 100, 200, 0.01) == pytest.approx(0.5 * 0.01)
    # At step 100 of 1,000 the official rate is 0.4925 of the peak, warmup_then_cosine's (warm-up 100) the peak.
    assert ramp_times_cosine(100, 1000, 200, 0.01) == pytest.approx(0.4925, abs=5e-5)
    assert warmup_then_cosine(100, 1000, 100, 0.01) == 1.0


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
@pytest.mark.parametrize("schedule,step,factor", [
    ("ramp_times_cosine", 0, 1 / 200 * (0.01 + 0.99 * (1 + math.cos(math.pi / 1000)) / 2)),
    ("ramp_times_cosine", 499, 0.505),
    ("warmup_then_cosine", 0, 1 / 100),  # warm-up cut to a tenth of the run
    ("warmup_then_cosine", 99, 1.0),
])
def test_trainer_follows_the_schedule_it_is_given(default_corpus_root, tmp_path, schedule, step, factor):
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    assert TrainConfig().lr_schedule == "ramp_times_cosine" and warmup_steps(TrainConfig(), 18_265) == 200  # the official
    tcfg = TrainConfig(batch_size=2, lr_schedule=schedule, warmup_steps=200)
    trainer = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=Model, tcfg=tcfg,
                      dataset=BooksDataset(default_corpus_root, 2048), bytes_per_token=torch.ones(2048),
                      run_dir=tmp_path, total_steps=1000, tokens_per_second=1.0)
    for _ in range(step):
        trainer.schedulers[0].step()
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(6e-4 * factor)


class SparseEmbeddingGPT(Model):
    """The token embedding with row-sparse gradients in a group marked sparse, as memory layers do."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.tok_emb.sparse = True

    def optimizer_groups(self, lr):
        rest = [p for n, p in self.named_parameters() if not n.startswith("tok_emb")]
        return [{"params": rest, "lr": lr}, {"params": [self.tok_emb.weight], "lr": 10 * lr, "sparse": True}]


@pytest.mark.parametrize("model_cls", [Model, SparseEmbeddingGPT])
def test_killed_and_resumed_run_has_the_losses_of_an_uninterrupted_one(default_corpus_root, tmp_path, model_cls,
                                                                      capsys):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "8", "--log_every", "1",
                   "--eval_every", "4", "--micro_batches", "2", "--run_name", "r"]
    whole = main("gpt", configs, model_cls, args + ["--out_dir", str(tmp_path / "a")])
    with pytest.raises(SystemExit) as stopped:  # unfinished: the exit code a requeue script runs again on
        main("gpt", configs, model_cls, args + ["--out_dir", str(tmp_path / "b"), "--stop_at_step", "5"])
    assert stopped.value.code == EXIT_UNFINISHED
    run_b = tmp_path / "b" / "r"
    first_job = torch.load(run_b / "checkpoint.pt", weights_only=False)["wall_seconds"]
    with (run_b / "log.jsonl").open("a") as f:  # a row the killed run wrote after its last checkpoint
        f.write(json.dumps({"event": "train", "step": 7, "loss": 0.0}) + "\n")
    capsys.readouterr()
    resumed = main("gpt", configs, model_cls, args + ["--out_dir", str(tmp_path / "b"), "--resume", "true"])
    assert f"Resuming from {run_b / 'checkpoint.pt'} at step 5 of 8." in capsys.readouterr().out
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
    slow = results["eval"]["slow"]["test"]
    assert (slow["protocol"], slow["window"], slow["last_n"]) == ("last_n", 32, 32 // 4)  # the official default
    for row in (results["eval"]["fast"]["test"], slow):
        assert row["scored_chars"] <= row["scored_bytes"]  # so per character is the higher perplexity
        assert row["normalised_perplexity_chars"] >= row["normalised_perplexity"] > 1
        assert 0 <= row["top1_accuracy"] <= row["top10_accuracy"] <= 1


def test_sparse_group_updates_only_rows_read(default_corpus_root, tmp_path):
    torch.manual_seed(0)
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    trainer = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=SparseEmbeddingGPT,
                      tcfg=TrainConfig(batch_size=2), dataset=BooksDataset(default_corpus_root, 2048),
                      bytes_per_token=torch.ones(2048), run_dir=tmp_path, total_steps=1, tokens_per_second=1.0)
    assert isinstance(trainer.optimizers[1], torch.optim.SparseAdam)
    before = trainer.model.tok_emb.weight.detach().clone()
    x, y = trainer.batches(0)
    trainer.train_step(x, y)
    changed = (trainer.model.tok_emb.weight.detach() != before).any(dim=1)
    assert set(changed.nonzero().flatten().tolist()) == set(x.unique().tolist())


class HebbianRecorder(Model):
    """Records what its after-step hook receives, and the parameters it sees then."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls = []

    def after_step(self, hidden, targets):
        self.calls.append({"hidden": hidden, "targets": targets, "head": self.head.weight.detach().clone(),
                           "grad_enabled": torch.is_grad_enabled()})


def test_after_step_hook_gets_the_steps_hidden_states_and_targets_after_the_update(default_corpus_root, tmp_path):
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    trainer = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=HebbianRecorder,
                      tcfg=TrainConfig(batch_size=4, micro_batches=2), dataset=BooksDataset(default_corpus_root, 2048),
                      bytes_per_token=torch.ones(2048), run_dir=tmp_path, total_steps=3, tokens_per_second=1.0)
    model = trainer.model
    for step in range(3):
        x, y = trainer.batches(step)
        head_before = model.head.weight.detach().clone()
        # by hand, with the parameters before the step: the input of the output layer for both micro-batches
        with torch.no_grad():
            h = torch.cat([model.tok_emb(xm) * 4 + model.pos_emb(torch.arange(8)) for xm in x])  # sqrt(16) = 4
            for block in model.blocks:
                h = block(h)
            hidden = model.ln_f(h)
        trainer.train_step(x, y)
        assert len(model.calls) == step + 1  # once per optimiser step, whatever the micro-batches
        call = model.calls[-1]
        torch.testing.assert_close(call["hidden"], hidden, rtol=1e-5, atol=1e-5)  # fp32, sums over 16 terms
        assert torch.equal(call["targets"], torch.cat(list(y)))  # the targets of the same tokens, in order
        assert not torch.equal(call["head"], head_before)  # the step had updated the parameters
        assert torch.equal(call["head"], model.head.weight) and not call["grad_enabled"]
    assert x.shape == (2, 2, 8) and call["hidden"].shape == (4, 8, 16)


def test_a_model_without_after_step_records_nothing(default_corpus_root, tmp_path):
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    trainer = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=Model, tcfg=TrainConfig(batch_size=2),
                      dataset=BooksDataset(default_corpus_root, 2048), bytes_per_token=torch.ones(2048),
                      run_dir=tmp_path, total_steps=1, tokens_per_second=1.0)
    assert trainer.step_hidden is None and not trainer.model.head._forward_hooks


class CountingTrainer(Trainer):
    """A project's own training step: here it records the batches it is given, then trains as usual."""

    instances = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []
        CountingTrainer.instances.append(self)

    def train_step(self, x, y):
        self.seen.append(tuple(x.shape))
        return super().train_step(x, y)


def test_a_project_trains_with_its_own_trainer_subclass(default_corpus_root, tmp_path, monkeypatch):
    monkeypatch.setattr(CountingTrainer, "instances", [])
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "3", "--micro_batches", "2",
                   "--out_dir", str(tmp_path), "--run_name", "r"]
    assert main("gpt", configs, Model, args, trainer_cls=CountingTrainer)["steps"] == 3
    [trainer] = CountingTrainer.instances
    assert trainer.seen == [(2, 2, 32)] * 3  # micro-batches x sequences x tokens, once per step


class Undeclared(torch.nn.Module):
    """A model that does not say whether it carries a state."""

    def __init__(self, cfg):
        super().__init__()
        self.emb = torch.nn.Embedding(cfg.vocab_size, cfg.vocab_size)

    def forward(self, x, state=None):
        return self.emb(x), None


def test_a_model_without_stateful_fails_naming_the_contract(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "1", "--out_dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="Undeclared must declare the class attribute `stateful = True`.*"
                                         "languini/model_contract.py"):
        main("gpt", configs, Undeclared, args)
    assert list(tmp_path.iterdir()) == []


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
    # The model flags of TINY change the cpu config: the command measures TINY. (On a CPU the cpu config is timed
    # here when the reference is this CPU; another reference is refused as on a GPU.)
    (["--compute_class", "1h", "--reference_hardware", "RTX 3090"],
     "measure_throughput.py gpt cpu --seq_len 32 --d_model 32 --n_layers 1 --n_heads 2 --d_head 16 --sweep"),
    (["--compute_class", "6 hours"], "not understood"),
    (["--max_steps", "1", "--batch_size", "5", "--micro_batches", "2"], "not divisible into 2 micro-batches"),
    (["--max_steps", "1", "--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--max_steps", "1", "--seq_len", "0"], "--seq_len must be at least 1, got 0"),
    (["--max_steps", "1", "--eval_max_batches", "0"], "--eval_max_batches must be at least 1"),
    (["--max_steps", "1", "--lr", "-1"], "--lr must be positive"),
    (["--max_steps", "1", "--batch_size", "81"], "Only 80 books for 81 streams"),  # the default corpus has 80
    (["--max_steps", "5", "--compute_class", "1m"], "two budgets; give one.*--stop_at_step"),
    (["--max_steps", "1", "--slow_eval_last_n", "64"], "slow_eval_last_n must be in 1..seq_len"),
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


class ByteTokenizer:
    """Stands for a vocabulary the default corpus was not tokenised with, in dry runs: every token one byte."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def get_piece_size(self):
        return self.vocab_size

    def is_control(self, i):
        return False

    is_unknown = is_control

    def is_byte(self, i):
        return True


def test_dry_run_prints_the_paper_plan(default_corpus_root, tmp_path, monkeypatch, capsys):
    # The paper's rows are of its models, vocabulary 16384 included: give the default corpus's books under that name.
    (tmp_path / "books_16384").symlink_to(default_corpus_root / "books_2048", target_is_directory=True)
    monkeypatch.setattr(datasets, "load_tokenizer", lambda ds, given, vocab_size: ByteTokenizer(vocab_size))
    assert main("gpt", configs, Model, ["--config", "small", "--compute_class", "6h", "--dry_run", "true",
                                         "--data_root", str(tmp_path), "--vocab_size", "16384"]) is None
    out = capsys.readouterr().out
    assert "18,265" in out and "55,416 tokens/s (published on RTX 3090)" in out  # Table 5/6: GPT small, 6h, batch 128


def test_paper_class_on_a_cpu_says_what_it_means(default_corpus_root, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    given = ["--dry_run", "true", "--data_root", str(default_corpus_root), "--tokens_per_second", "24000"]
    main("gpt", configs, Model, ["--compute_class", "24h", *given])
    out = capsys.readouterr().out
    assert "--compute_class 24h means 24h of this CPU training the toy config 'cpu'" in out
    assert "use --compute_class 2m" in out and "--config small" in out
    main("gpt", configs, Model, ["--compute_class", "2m", *given])
    assert "toy config" not in capsys.readouterr().out


def test_cpu_path_times_a_model_with_another_vocabulary_instead_of_reusing_a_row(default_corpus_root, tmp_path,
                                                                                   monkeypatch, capsys):
    """Issue 13: the cpu config on book data (vocab 16384) is another model than on the default corpus (2048)."""
    (tmp_path / "books_16384").symlink_to(default_corpus_root / "books_2048", target_is_directory=True)
    monkeypatch.setattr(datasets, "load_tokenizer", lambda ds, given, vocab_size: ByteTokenizer(vocab_size))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    timed = []
    monkeypatch.setattr(measure, "measure_batch_size", lambda model, cfg, batch, *rest: timed.append(
        cfg.vocab_size) or Measurement(batch, 4096.0, 0.5, None))
    argv = ["--compute_class", "10s", "--dry_run", "true", "--keep_timing", "true", "--data_root", str(tmp_path),
            "--vocab_size", "16384", "--out_dir", str(tmp_path / "runs")]
    main("gpt", configs, Model, argv)
    out = capsys.readouterr().out
    assert timed == [16384] and "kept in" in out
    [row] = throughput.read_registry(tmp_path / "runs" / "throughput.csv")
    assert row.model_fingerprint == throughput.model_spec("gpt", "cpu", configs.get("cpu", vocab_size=16384)).fingerprint
    assert "4,096 tokens/s (measured on cpu, " in out and "steps                    20\n" in out  # 40960 / 2048
    main("gpt", configs, Model, argv)  # the next run here (or a resumed one) plans with the row kept
    assert timed == [16384] and "steps                    20\n" in capsys.readouterr().out
    # On the default corpus the committed rows of the cpu config are used (its default math attention, and with
    # SDPA attention another model with a row of its own), and nothing is timed.
    default_corpus = ["--compute_class", "10s", "--dry_run", "true", "--data_root", str(default_corpus_root),
                      "--out_dir", str(tmp_path / "runs")]
    committed = {row.model_flags: row for row in throughput.read_registry(throughput.registry_path("gpt"))
                 if row.config == "cpu" and row.hardware == "cpu"}
    for flags in ([], ["--attention", "sdpa"]):
        main("gpt", configs, Model, default_corpus + flags)
        row = committed[" ".join(flags)]
        assert timed == [16384] and (f"{row.tokens_per_second:,.0f} tokens/s (measured on cpu, {row.date})"
                                     in capsys.readouterr().out)


def test_a_config_named_cpu_is_timed_on_this_cpu_and_a_paper_config_is_not(default_corpus_root, tmp_path,
                                                                           monkeypatch, capsys):
    """Without a GPU, a CPU-sized config given with --config ('cpu' or '<name>_cpu', here the Compressive project's
    Transformer-XL txl_cpu, with a memory length no committed row has) takes the CPU path as the default does:
    reference 'cpu', none of the compute class's GPU settings, timed once and its row kept in
    <out_dir>/throughput.csv. A paper config plans against the
    registry and is refused without a row, as before."""
    from projects.compressive import configs as compressive_configs
    from projects.compressive.model import Model as Compressive
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    timed = []

    def timed_measurement(model, cfg, batch, device, tcfg, *rest):
        timed.append((cfg.mem_len, batch, tcfg.grad_clip))
        return Measurement(batch, 4096.0, 0.5, None)

    monkeypatch.setattr(measure, "measure_batch_size", timed_measurement)
    out_dir = tmp_path / "runs"
    argv = ["--compute_class", "6h", "--dry_run", "true", "--keep_timing", "true", "--data_root",
            str(default_corpus_root), "--out_dir", str(out_dir)]
    no_row = ["--config", "txl_cpu", "--mem_len", "200"]
    main("compressive", compressive_configs, Compressive, argv + no_row)
    out = capsys.readouterr().out
    # 6h's settings (config small, batch 128, grad_clip 0.1) are for a GPU: the trainer's defaults (batch 16)
    assert timed == [(200, 16, None)] and "kept in" in out
    [row] = throughput.read_registry(out_dir / "throughput.csv")
    spec = throughput.model_spec("compressive", "txl_cpu", compressive_configs.get("txl_cpu", mem_len=200))
    assert (row.config, row.model_fingerprint, row.hardware, row.batch_size) == ("txl_cpu", spec.fingerprint, "cpu", 16)
    assert "4,096 tokens/s (measured on cpu, " in out
    assert "steps                    43,200\n" in out  # 6 x 3,600 s x 4,096 tokens/s / (16 x 128 tokens)
    assert "means 6h of this CPU training the toy config 'txl_cpu'" in out
    main("compressive", compressive_configs, Compressive, argv + no_row)  # the row is kept
    assert len(timed) == 1 and "steps                    43,200\n" in capsys.readouterr().out

    with pytest.raises(SystemExit, match=r"(?s)no throughput for compressive small.*'small' is planned against the "
                                         r"registry") as refused:
        main("compressive", compressive_configs, Compressive, argv + ["--config", "small"])
    assert "only a CPU-sized config ('cpu' or a name ending in '_cpu')" in str(refused.value)
    assert len(timed) == 1 and len(throughput.read_registry(out_dir / "throughput.csv")) == 1


def test_run_records_its_throughput_row_and_evaluation_time(default_corpus_root, tmp_path, monkeypatch):
    """results.json names the row that set the budget; the log keeps evaluation time apart from training."""
    registry = tmp_path / "throughput.csv"
    spec = throughput.model_spec("gpt", "cpu", configs.get("cpu", seq_len=32, d_model=32, n_layers=1, n_heads=2,
                                                           d_head=16))
    row = throughput.ThroughputRow("gpt", "cpu", spec.fingerprint, spec.flags, "cpu", 4, 32, 1280.0, None, "fp32",
                                   False, "2.13.0", "2026-01-02", "measured", "by hand")
    throughput.append_row(registry, row)
    monkeypatch.setattr(throughput, "registry_path", lambda project: registry)
    args = TINY + ["--data_root", str(default_corpus_root), "--compute_class", "1s", "--reference_hardware", "cpu",
                   "--eval_every", "5", "--eval_every_max_batches", "1", "--eval_budget", "0", "--out_dir", str(tmp_path),
                   "--run_name", "r"]
    results = main("gpt", configs, Model, args)
    assert results["steps"] == 10  # 1 s x 1,280 tokens/s / (4 x 32)
    assert results["throughput_row"] == dataclasses.asdict(row)
    assert (results["model_fingerprint"], results["model_flags"]) == (spec.fingerprint, spec.flags)
    log = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    evals = [r for r in log if r["event"] == "eval"]
    during, final_valid = evals[0], next(r for r in evals[1:] if r["split"] == "valid" and r["mode"] == "fast"
                                         and not r.get("progress"))
    assert during["step"] == 5 and during["scored_tokens"] <= 4 * 32 < final_valid["scored_tokens"]  # capped: 1 batch
    assert all(r["wall_seconds"] > 0 for r in evals)
    train = [r["train_wall_seconds"] for r in log if r["event"] == "train"]
    assert train == sorted(train) and train[-1] > 0 and results["train_wall_seconds"] == train[-1]
    # A newer row for the same model would give 20 steps; the run, continued, keeps the budget it started with.
    throughput.append_row(registry, dataclasses.replace(row, tokens_per_second=2560.0, date="2026-02-03"))
    (tmp_path / "r" / "results.json").unlink()
    continued = main("gpt", configs, Model, args + ["--resume", "true"])
    assert continued["steps"] == 10 and continued["throughput_row"] == dataclasses.asdict(row)


def integrity_fingerprint(dataset_dir):
    """The fingerprint by hand: sha256 over the file-list hashes prepare_books wrote to integrity.json."""
    lists = json.loads((dataset_dir / "integrity.json").read_text())["file_lists"]
    return hashlib.sha256("".join(f"{n} {h}\n" for n, h in sorted(lists.items())).encode()).hexdigest()[:12]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty data/ standing in for the repository's; the working directory is its parent."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setattr(datasets, "DEFAULT_DATA", data)
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


def run_script(project, args, processes=1, check=True) -> int:
    """Runs train.py (under torchrun with processes > 1); its exit code, which must be 0 if `check`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()}
    script = str(REPO_ROOT / "projects" / project / "train.py")
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)] if processes > 1 else []
    return subprocess.run([sys.executable, *launcher, script, *args], check=check, env=env,
                          capture_output=True).returncode


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
    # unfinished: torchrun exits with 1 when its workers exit with EXIT_UNFINISHED
    assert run_script("qlstm", common + ["--out_dir", str(tmp_path / "split"), "--stop_at_step", "2"], processes=2,
                      check=False) != 0
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


def test_a_paper_config_without_prepared_data_is_planned_as_published_and_never_trained_on_the_smoke_corpus(
        data_dir, capsys, monkeypatch):
    """Issue 26: the paper's own dry run in a fresh clone (no data) prints the paper's 18,265 steps; a run stops
    naming the command that prepares the books."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    paper = ["--config", "small", "--compute_class", "6h", "--batch_size", "128"]
    assert main("gpt", configs, Model, paper + ["--dry_run"]) is None
    out = capsys.readouterr().out
    assert "planning the config as published (vocab 16,384)" in out and "steps                    18,265\n" in out
    assert "scripts/prepare_books.py" in out and not (data_dir / "default_corpus").exists()
    with pytest.raises(SystemExit, match="never trains on the embedded smoke-test corpus.*scripts/prepare_books.py"):
        main("gpt", configs, Model, paper)


def test_a_gpu_reference_on_a_cpu_plans_the_classs_gpu_config_and_names_the_missing_row(default_corpus_root,
                                                                                       monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from projects.lram_gpt import configs as lram_configs
    from projects.lram_gpt.model import Model as LRAM
    with pytest.raises(SystemExit) as refused:
        main("lram_gpt", lram_configs, LRAM, ["--compute_class", "24h", "--reference_hardware", "RTX 3090",
                                              "--data_root", str(default_corpus_root), "--dry_run"])
    message = str(refused.value)
    assert "no throughput for lram_gpt small" in message and "on the RTX 3090" in message
    assert "--derive 'RTX 3090' --baseline gpt:small" in message  # or from any GPU, by ratio to GPT small
    assert "reference hardware 'cpu'" not in capsys.readouterr().out


@pytest.mark.parametrize("root,message", [("missing", "does not exist. Prepare a dataset there"),
                                          ("empty", "holds no prepared dataset")])
def test_a_data_root_without_data_says_so(tmp_path, root, message):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=f"--data_root .*{root} {message}.*prepare_books.py"):
        main("gpt", configs, Model, TINY + ["--max_steps", "1", "--data_root", str(tmp_path / root)])


def test_a_run_whose_speed_is_off_its_row_says_so_in_the_log_and_results(default_corpus_root, tmp_path, capsys,
                                                                          monkeypatch):
    """Issue 26: a CPU class bought at a row far too slow for this machine trained far too short; say it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = TINY + ["--data_root", str(default_corpus_root), "--compute_class", "2s", "--out_dir", str(tmp_path),
                   "--run_name", "r"]
    kept = tmp_path / "throughput.csv"  # this CPU's row, as an earlier timing here would have kept it
    spec = throughput.model_spec("gpt", "cpu", configs.get("cpu", seq_len=32, d_model=32, n_layers=1, n_heads=2,
                                                           d_head=16))
    throughput.append_row(kept, throughput.ThroughputRow("gpt", "cpu", spec.fingerprint, spec.flags, "cpu", 4, 32, 100.0,
                                                         None, "fp32", False, "2.13.0", "2026-01-02", "measured", "x"))
    results = main("gpt", configs, Model, args)
    check = results["throughput_check"]
    assert check["expected_tokens_per_second"] == 100.0 and check["measured_tokens_per_second"] > 125
    assert not check["within_margin"] and check["margin"] == 0.25
    assert "Warning: training ran at" in capsys.readouterr().out
    log = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert [r["ratio"] for r in log if r["event"] == "throughput_check"] == [check["ratio"]]


def test_this_cpus_kept_row_comes_first_and_retime_times_it_again(default_corpus_root, tmp_path, monkeypatch, capsys):
    """A timing is kept for the next runs here, but not one whose spread says the machine was busy (issue 52: a
    spread of 107% fixed the steps of later runs), nor a plain dry run's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    timed = []
    monkeypatch.setattr(measure, "measure_batch_size", lambda model, cfg, batch, *rest: timed.append(batch) or
                        Measurement(batch, 2048.0 * len(timed), 0.5, None, 0.8 if len(timed) == 1 else 0.1))
    argv = ["--compute_class", "10s", "--dry_run", "--data_root", str(default_corpus_root), "--out_dir", str(tmp_path),
            "--d_model", "96", "--keep_timing", "true"]  # a model no committed row has
    main("gpt", configs, Model, argv)
    out = capsys.readouterr().out
    assert timed == [16] and "spread over 80%" in out and "looks busy" in out and "not kept" in out
    main("gpt", configs, Model, argv)  # timed again, on a quiet machine: kept
    assert timed == [16, 16] and "4,096 tokens/s (measured on cpu" in capsys.readouterr().out
    main("gpt", configs, Model, argv)
    assert timed == [16, 16] and "4,096 tokens/s (measured on cpu" in capsys.readouterr().out
    main("gpt", configs, Model, argv + ["--retime"])
    assert timed == [16, 16, 16] and "6,144 tokens/s (measured on cpu" in capsys.readouterr().out
    main("gpt", configs, Model, argv)  # the newest timing of this machine is used from then on
    assert timed == [16, 16, 16] and "6,144 tokens/s (measured on cpu" in capsys.readouterr().out
    main("gpt", configs, Model, argv[:-2] + ["--retime"])  # a plain dry run times but keeps nothing
    assert timed == [16] * 4 and "a dry run writes nothing" in capsys.readouterr().out
    main("gpt", configs, Model, argv)
    assert timed == [16] * 4 and "6,144 tokens/s (measured on cpu" in capsys.readouterr().out


def test_short_runs_warm_up_for_a_tenth_of_their_steps():
    assert [warmup_steps(TrainConfig(), n) for n in (6, 72, 1999, 2000, 18_265)] == [1, 7, 199, 200, 200]
    assert warmup_steps(TrainConfig(warmup_steps=50), 72) == 50  # as given
    assert warmup_steps(TrainConfig(warmup_steps=50, lr_schedule="warmup_then_cosine"), 72) == 7
    # a 72-step run reaches the peak learning rate at step 7, then decays
    assert ramp_times_cosine(6, 72, warmup_steps(TrainConfig(), 72), 0.01) == pytest.approx(
        0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 7 / 72)))


def test_child_processes_keep_the_callers_python_path(monkeypatch):
    """Packages installed beside the environment (PYTHONPATH, as on machines without a package index) stay
    importable in the training processes the tests and benchmarks start."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/opt/more"]))
    assert child_python_path().split(os.pathsep) == [str(REPO_ROOT), "/opt/site", "/opt/more"]
    monkeypatch.delenv("PYTHONPATH")
    assert child_python_path() == str(REPO_ROOT)
