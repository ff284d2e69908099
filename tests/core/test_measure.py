"""The throughput measurement times the trainer's own step: clipping, micro-batches, schedules, after-step hook."""
import torch

from languini import measure, trainer
from languini.books import BooksDataset
from languini.trainer import TrainConfig, Trainer
from projects.gpt import configs
from projects.gpt.model import Model

CFG = dict(d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)


class StepRecorder(Model):
    """Records the batch of every forward and every call of its after-step hook."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.forward_batches, self.after_steps = [], 0

    def forward(self, x, state=None):
        self.forward_batches.append(x.shape[0])
        return super().forward(x, state)

    def after_step(self, hidden, targets):
        self.after_steps += 1


def test_measurement_clips_accumulates_and_runs_the_after_step_hook(monkeypatch, single_thread):
    clip_norms = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: clip_norms.append(max_norm)
                        or clip(params, max_norm))
    torch.manual_seed(0)
    cfg = configs.get("cpu", **CFG)
    model = StepRecorder(cfg).train()
    timed = measure.measure_batch_size(model, cfg, 4, torch.device("cpu"), TrainConfig(grad_clip=0.5, micro_batches=2),
                                       2, 1)
    assert timed.batch_size == 4 and timed.tokens_per_second > 0
    # 3 steps (1 untimed), each of 2 micro-batches of 2 sequences, one clip and one after-step hook per step
    assert model.forward_batches == [2] * 6 and clip_norms == [0.5] * 3 and model.after_steps == 3
    assert not model.head._forward_hooks  # the measurement leaves no recording hook behind


def test_training_and_measurement_run_one_step_implementation(default_corpus_root, tmp_path, monkeypatch,
                                                              single_thread):
    calls = []
    step = trainer.TrainStep.__call__
    monkeypatch.setattr(trainer.TrainStep, "__call__", lambda self, x, y, states, *rest: calls.append(
        (self.micro_batches, self.grad_clip, tuple(x.shape))) or step(self, x, y, states, *rest))
    tcfg = TrainConfig(batch_size=4, micro_batches=2, grad_clip=1.0)
    cfg = configs.get("cpu", **CFG)
    run = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=Model, tcfg=tcfg,
                  dataset=BooksDataset(default_corpus_root, 2048), bytes_per_token=torch.ones(2048), run_dir=tmp_path,
                  total_steps=1, tokens_per_second=1.0)
    run.train_step(*run.batches(0))
    measure.measure_batch_size(Model(cfg).train(), cfg, 4, torch.device("cpu"), tcfg, 1, 1)
    assert calls == [(2, 1.0, (2, 2, 8))] * 3  # one training step, then a warm-up and a timed one
