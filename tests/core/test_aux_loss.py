"""The auxiliary-loss hook: an aux loss that reaches only its own parameters leaves every other gradient that of
the language-model loss alone, is logged as aux_<name> with its hand-computed value, and stays out of the loss."""
import copy

import pytest
import torch
import torch.nn.functional as F

from languini import aux_loss
from languini.books import BooksDataset
from languini.trainer import TrainConfig, Trainer
from projects.gpt import configs
from projects.gpt.model import Model

COEFFICIENT = 0.5
PENALISED = [1.0, -2.0, 3.0]


class PenalisedGPT(Model):
    """A GPT with a parameter reached only by its auxiliary loss COEFFICIENT * sum(w^2)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.penalised = torch.nn.Parameter(torch.tensor(PENALISED))

    def forward(self, x, state=None):
        logits, state = super().forward(x, state)
        return logits, state, {"penalty": COEFFICIENT * (self.penalised ** 2).sum()}


class RowLog:
    rows = 0

    def __init__(self):
        self.written = []

    def write(self, row):
        self.written.append(row)

    def sync(self):
        pass


def test_unpack_accepts_two_or_three_items_and_explains_others():
    logits = torch.zeros(1)
    assert aux_loss.unpack((logits, None)) == (logits, None, {})
    assert aux_loss.unpack((logits, None, {"a": logits}))[2] == {"a": logits}
    with pytest.raises(ValueError, match=r"\(logits, state, aux\)"):
        aux_loss.unpack((logits,))


def test_aux_loss_reaches_only_its_parameters_and_is_logged_apart(default_corpus_root, tmp_path):
    cfg = configs.get("cpu", d_model=16, n_layers=1, n_heads=2, d_head=8, seq_len=8)
    tcfg = TrainConfig(batch_size=4, micro_batches=2, log_every=1)
    trainer = Trainer(project="gpt", config_name="cpu", model_cfg=cfg, model_cls=PenalisedGPT, tcfg=tcfg,
                      dataset=BooksDataset(default_corpus_root, 2048), bytes_per_token=torch.ones(2048),
                      run_dir=tmp_path, total_steps=1, tokens_per_second=1.0)
    reference = copy.deepcopy(trainer.model)  # the weights before the step
    x, y = trainer.batches(0)
    log = RowLog()
    trainer.train(log)

    # The language-model loss alone, by hand, on the same micro-batches.
    lm_loss = 0.0
    for m in range(2):
        logits, _, _ = reference(x[m])
        loss = F.cross_entropy(logits.flatten(0, 1), y[m].flatten()) / 2
        loss.backward()
        lm_loss += loss.item()
    row = next(r for r in log.written if r["event"] == "train")
    assert row["loss"] == pytest.approx(lm_loss, rel=1e-5)  # the aux loss is not in the reported loss
    assert row["aux_penalty"] == pytest.approx(COEFFICIENT * (1 + 4 + 9), rel=1e-6)  # 7, by hand
    trained = dict(trainer.model.named_parameters())
    for name, p in reference.named_parameters():
        if name == "penalised":  # d/dw 0.5 sum(w^2) = w, the mean over two micro-batches of the same value
            torch.testing.assert_close(trained[name].grad, torch.tensor(PENALISED))
        else:
            torch.testing.assert_close(trained[name].grad, p.grad, rtol=1e-5, atol=1e-7)
