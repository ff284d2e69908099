"""--tie_embeddings of gpt and qlstm: one tensor for the input embedding and the output layer, so the Hebbian
Softmax's rows are written into the input embedding; untied (the default) the rule leaves the input embedding to
the optimiser, bit for bit. Expectations: the first sighting of a class sets its row to the mean of the head's
inputs at its targets (lambda = 1, Algorithm 1), recorded here by a hook of the test's own."""
import contextlib
import copy

import pytest
import torch

from languini import hebbian, throughput
from languini.trainer import TrainConfig, TrainStep, build_optimizers, build_schedulers
from projects.gpt import configs as gpt_configs
from projects.gpt.model import Model as GPT
from projects.qlstm import configs as qlstm_configs
from projects.qlstm.model import Model as QLSTM

VOCAB, WIDTH, SEQ = 11, 8, 8
PROJECTS = {"gpt": (gpt_configs, GPT), "qlstm": (qlstm_configs, QLSTM)}


def tiny(project: str, tie: bool):
    configs, model_cls = PROJECTS[project]
    torch.manual_seed(0)
    return model_cls(configs.get("cpu", vocab_size=VOCAB, d_model=WIDTH, n_layers=1, n_heads=2, d_head=4,
                                 seq_len=SEQ, tie_embeddings=tie))


def step_of(model, rule):
    optimizers, dense = build_optimizers(model, 0.05, torch.device("cpu"))
    schedulers = build_schedulers(optimizers, TrainConfig(warmup_steps=0), 10)
    return TrainStep(model, model, optimizers, dense, schedulers, contextlib.nullcontext, None, None, 1,
                     torch.device("cpu"), hebbian=rule)


@pytest.mark.parametrize("project", list(PROJECTS))
def test_tied_is_one_tensor_and_the_untied_default_two(project):
    untied, tied = tiny(project, False), tiny(project, True)
    assert PROJECTS[project][0].get("cpu").tie_embeddings is False
    assert untied.head.weight is not untied.tok_emb.weight and tied.head.weight is tied.tok_emb.weight
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(tied) == VOCAB * WIDTH  # the output layer's own matrix, vocab x width
    # a tied model is another model: its own throughput row, named by the flag
    spec = throughput.model_spec(project, "cpu", PROJECTS[project][0].get("cpu", tie_embeddings=True))
    assert spec.flags == "--tie_embeddings true" and spec.fingerprint != throughput.model_spec(project, "cpu").fingerprint


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("project", list(PROJECTS))
def test_the_rule_writes_the_input_embedding_only_when_tied(project, tie):
    model = tiny(project, tie)
    twin = copy.deepcopy(model)  # the same step without the rule: theta_hat
    rule = hebbian.HebbianSoftmax(model.head.weight, limit=10, min_mix=0.1)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(VOCAB, (2, 2, SEQ), generator=gen)
    seen = torch.bincount(y.flatten(), minlength=VOCAB) > 0
    assert seen.any() and not seen.all()
    recorded = []
    model.ln_f.register_forward_hook(lambda module, inputs, output: recorded.append(output.detach()))
    step_of(model, rule)(x[None], y[None], [None])
    step_of(twin, None)(x[None], y[None], [None])
    h = recorded[0].reshape(-1, WIDTH)
    embedding, head = model.tok_emb.weight.detach(), model.head.weight.detach()
    for c in range(VOCAB):
        if seen[c]:  # first sighting: the row is the mean of h at its targets
            torch.testing.assert_close(head[c], h[y.flatten() == c].mean(0), rtol=1e-6, atol=1e-7)
            assert not torch.equal(head[c], twin.head.weight.detach()[c])
        else:
            assert torch.equal(head[c], twin.head.weight.detach()[c])
    if tie:  # the same rows, read by the input embedding
        assert torch.equal(embedding, head)
    else:  # the input embedding as the optimiser left it
        assert torch.equal(embedding, twin.tok_emb.weight.detach())
