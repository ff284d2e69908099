"""The Hebbian Softmax (languini/hebbian.py) against a hand computation of Algorithm 1 through the trainer's own
step with Adam; counters in the checkpoint and an exact resume; two data-parallel processes (gloo) against one
process with the whole batch; the cost of the rule in the throughput row."""
import contextlib
import copy
import json
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from languini import hebbian, measure, throughput
from languini.books import BooksDataset
from languini.experiment import main
from languini.stop import EXIT_UNFINISHED
from languini.trainer import Dist, TrainConfig, Trainer, TrainStep, build_optimizers, build_schedulers
from projects.gpt import configs
from projects.gpt.model import Model

VOCAB, WIDTH = 6, 3
LIMIT, MIN_MIX = 5, 0.4
TINY = ["--config", "cpu", "--d_model", "16", "--n_layers", "1", "--n_heads", "2", "--d_head", "8", "--seq_len", "16",
        "--batch_size", "4", "--eval_batch_size", "4", "--eval_max_batches", "1", "--slow_eval_max_windows", "2"]


class TinyModel(torch.nn.Module):
    """logits = head(tanh(embedding)): the output layer's inputs are known by hand."""
    stateful = False

    def __init__(self, tied: bool):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, x, state=None):
        return self.head(torch.tanh(self.emb(x))), None


def tiny_step(model, hebbian_softmax):
    optimizers, dense = build_optimizers(model, 0.05, torch.device("cpu"))
    schedulers = build_schedulers(optimizers, TrainConfig(warmup_steps=0), 10)
    return TrainStep(model, model, optimizers, dense, schedulers, contextlib.nullcontext, None, None, 1,
                     torch.device("cpu"), hebbian=hebbian_softmax), optimizers


# Two steps of 2 x 7 targets. Step 1, counters all 0: classes 0-3 are first seen, so lambda = 1 (the mean
# activation replaces the row); class 5 is never seen. Step 2: class 0 (c = 5 = T) has crossed the limit,
# lambda 0; class 1 (c = 3) and class 3 (c = 4, crossing T within the step) have 1/c < gamma: gamma binds;
# class 2 (c = 2) mixes at 1/2; class 4 is first seen, lambda 1.
TARGETS = [torch.tensor([[0, 0, 1, 2, 0, 3, 3], [1, 0, 3, 2, 0, 1, 3]]),
           torch.tensor([[0, 1, 2, 3, 4, 3, 1], [3, 3, 4, 1, 1, 2, 0]])]
LAMBDA = [{0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, {0: 0.0, 1: 0.4, 2: 0.5, 3: 0.4, 4: 1.0}]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_update_by_hand_through_a_trainer_step_with_adam(tied):
    torch.manual_seed(0)
    model = TinyModel(tied)
    rule = hebbian.HebbianSoftmax(model.head.weight, LIMIT, MIN_MIX)
    step, optimizers = tiny_step(model, rule)
    inputs = torch.randint(VOCAB, (2, 2, 7), generator=torch.Generator().manual_seed(1))
    counts = [0] * VOCAB
    for x, y, lambdas in zip(inputs, TARGETS, LAMBDA):
        # theta_hat: the same step with the same Adam state and learning rate, without the rule (theta_{t+0.5})
        twin = copy.deepcopy(model)
        twin_step, twin_optimizers = tiny_step(twin, None)
        for mine, theirs in zip(twin_optimizers, optimizers, strict=True):
            mine.load_state_dict(copy.deepcopy(theirs.state_dict()))  # load_state_dict shares tensors
        twin_step(x[None], y[None], [None])
        theta_hat = twin.head.weight.detach()
        hidden = torch.tanh(model.emb.weight.detach()[x]).reshape(-1, WIDTH)  # the inputs of the head, by hand
        step(x[None], y[None], [None])
        weight = model.head.weight.detach()
        for i in range(VOCAB):
            seen = y.flatten() == i
            lam = lambdas.get(i, 0.0)
            assert (lam > 0) == (bool(seen.any()) and counts[i] < LIMIT)
            if lam > 0:
                expected = lam * hidden[seen].mean(dim=0) + (1 - lam) * theta_hat[i]
                torch.testing.assert_close(weight[i], expected, rtol=1e-6, atol=1e-7)  # a few fp32 operations
                assert not torch.equal(weight[i], theta_hat[i])
            else:  # not seen, or past the limit: Adam's row, bit for bit
                assert torch.equal(weight[i], theta_hat[i])
            counts[i] += int(seen.sum())
        assert rule.counts.tolist() == counts
    if tied:  # one tensor: the input embedding moved with the output layer
        assert model.emb.weight is model.head.weight


def test_rows_scale_by_hand():
    # --hebbian_scale rows: the class's mean activation takes the mean norm of the rows, (3 + 0 + 5 + 0) / 4 = 2
    weight = torch.nn.Parameter(torch.tensor([[3.0, 0, 0], [0, 0, 0], [0, 3, 4], [0, 0, 0]]))
    rule = hebbian.HebbianSoftmax(weight, limit=10, min_mix=0.5, scale="rows")
    rule.counts[2] = 3  # lambda = max(1/3, 0.5) = 0.5; classes 0 and 1 are first seen, lambda 1
    hidden = torch.tensor([[2.0, 0, 0], [0, 2, 0], [1, 0, 0], [-1, 0, 0], [0, 0, -7], [5, 5, 5]])
    rule.update(hidden, torch.tensor([0, 0, 1, 1, 2, 3]))
    root2 = 2 ** 0.5
    expected = torch.tensor([[root2, root2, 0],  # mean (1, 1, 0) of norm sqrt(2), scaled to 2
                             [0, 0, 0],  # a zero mean stays zero
                             [0, 1.5, 1],  # 0.5 * (0, 0, -2) + 0.5 * (0, 3, 4)
                             [2 / 3 ** 0.5] * 3])
    torch.testing.assert_close(weight.detach(), expected)
    assert rule.counts.tolist() == [2, 2, 4, 1]
    with pytest.raises(ValueError, match="--hebbian_scale must be one of activation, rows"):
        hebbian.HebbianSoftmax(weight, scale="norm")


def test_mixing_weights_follow_equation_4_3():
    counts = torch.tensor([0, 1, 2, 3, 9, 10, 11, 500])
    lam = hebbian.mixing_weights(counts, limit=10, min_mix=0.25)
    assert lam.tolist() == pytest.approx([1.0, 1.0, 0.5, 1 / 3, 0.25, 0.0, 0.0, 0.0])


def test_checkpointed_counters_give_an_exact_resume(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "6", "--log_every", "1", "--run_name", "r",
                   "--hebbian_softmax", "true", "--hebbian_limit", "40", "--hebbian_min_mix", "0.2"]
    whole = main("gpt", configs, Model, args + ["--out_dir", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=str(EXIT_UNFINISHED)):  # stopped as asked, its checkpoint saved
        main("gpt", configs, Model, args + ["--out_dir", str(tmp_path / "b"), "--stop_at_step", "3"])
    with pytest.raises(SystemExit, match="--hebbian_softmax true"):  # it does not continue without the rule
        main("gpt", configs, Model, args[:-6] + ["--out_dir", str(tmp_path / "b"), "--resume", "true"])
    resumed = main("gpt", configs, Model, args + ["--out_dir", str(tmp_path / "b"), "--resume", "true"])
    a, b = (torch.load(tmp_path / run / "r" / "checkpoint.pt", weights_only=False) for run in ("a", "b"))
    assert torch.equal(a["model"]["head.weight"], b["model"]["head.weight"])
    assert torch.equal(a["hebbian"]["counts"], b["hebbian"]["counts"])
    # the counters count every target of the six steps
    batches = Trainer(project="gpt", config_name="cpu", model_cfg=configs.get("cpu", d_model=16, n_layers=1,
                      n_heads=2, d_head=8, seq_len=16), model_cls=Model, tcfg=TrainConfig(batch_size=4),
                      dataset=BooksDataset(default_corpus_root, 2048), bytes_per_token=torch.ones(2048),
                      run_dir=tmp_path, total_steps=6, tokens_per_second=1.0).batches
    targets = torch.cat([batches(s)[1].flatten() for s in range(6)])
    assert torch.equal(a["hebbian"]["counts"], torch.bincount(targets, minlength=2048))
    assert resumed["eval"] == whole["eval"]
    summary = resumed["hebbian_softmax"]
    assert (summary["limit"], summary["min_mix"], summary["classes_seen"]) == (40, 0.2, len(targets.unique()))
    assert resumed["train_config"]["hebbian_softmax"] is True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_data_parallel(rank, world_size, port, corpus, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        trainer = _trainer(corpus, out / f"rank{rank}", micro_batches=1, ddp=Dist(rank, world_size, rank))
        for step in range(3):
            trainer.train_step(*trainer.batches(step))
        torch.save({"head": trainer.model.head.weight.detach(), "counts": trainer.hebbian.counts},
                   out / f"rank{rank}.pt")
        dist.barrier()  # no process leaves while another still talks to it
    finally:
        dist.destroy_process_group()


def _trainer(corpus, run_dir, micro_batches, ddp=None):
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=16)
    tcfg = TrainConfig(batch_size=4, micro_batches=micro_batches, hebbian_softmax=True, hebbian_limit=30)
    return Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=Model, tcfg=tcfg,
                   dataset=BooksDataset(corpus, 2048), bytes_per_token=torch.ones(2048), run_dir=run_dir,
                   total_steps=3, tokens_per_second=1.0, ddp=ddp)


def test_two_processes_apply_the_update_of_one_process_with_the_whole_batch(default_corpus_root, tmp_path):
    """2 gloo processes x 2 sequences against 1 process x 2 micro-batches of 2: the same counters and weights,
    and the two processes' weights equal bit for bit (replicas never drift)."""
    context = mp.spawn(_train_data_parallel, args=(2, _free_port(), default_corpus_root, tmp_path), nprocs=2,
                       join=False)
    deadline = time.monotonic() + 120
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the data-parallel processes hung")
    one = _trainer(default_corpus_root, tmp_path / "one", micro_batches=2)
    for step in range(3):
        one.train_step(*one.batches(step))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert torch.equal(ranks[0]["head"], ranks[1]["head"])
    assert torch.equal(ranks[0]["counts"], one.hebbian.counts) and one.hebbian.counts.sum() == 3 * 4 * 16
    # the same Adam steps and rule, gradients and activation sums added in another order: fp32 rounding only
    torch.testing.assert_close(ranks[0]["head"], one.model.head.weight.detach(), rtol=1e-4, atol=1e-5)


def test_a_hebbian_run_is_charged_at_its_own_throughput_row(monkeypatch, single_thread):
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    plain, with_rule = (throughput.model_spec("gpt", "cpu", cfg, hebbian.settings(TrainConfig(hebbian_softmax=on)))
                        for on in (False, True))
    assert plain == throughput.model_spec("gpt", "cpu", cfg)  # the rule off changes no existing row
    assert with_rule.fingerprint != plain.fingerprint
    assert with_rule.flags.endswith("--hebbian_softmax true --hebbian_limit 500 --hebbian_min_mix 0.1")
    # the measurement times the step with the rule: its counters see every timed step's targets
    model = Model(cfg).train()
    calls = []
    update = hebbian.HebbianSoftmax.update
    monkeypatch.setattr(hebbian.HebbianSoftmax, "update", lambda self, h, y: calls.append(y.numel()) or update(self, h, y))
    measure.measure_batch_size(model, cfg, 4, torch.device("cpu"), TrainConfig(hebbian_softmax=True), 2, 1)
    assert calls == [4 * 8] * 3 and not model.head._forward_hooks


def test_results_and_log_rows_record_the_rule_and_frequency_buckets(default_corpus_root, tmp_path):
    args = TINY + ["--data_root", str(default_corpus_root), "--max_steps", "2", "--run_name", "r",
                   "--out_dir", str(tmp_path)]
    results = main("gpt", configs, Model, args)
    assert "hebbian_softmax" not in results and results["train_config"]["hebbian_softmax"] is False
    rows = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["event"] == "eval"]
    assert evals and all(sum(b["scored_tokens"] for b in r["by_frequency"]["buckets"]) == r["scored_tokens"]
                         for r in evals)
