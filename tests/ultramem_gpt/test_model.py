"""ultramem_gpt's own tests; the model contract (shapes, state, causality, optimiser groups) is
tests/core/test_contract.py's, which finds every project by itself. Add here what is specific to the model: its
paper's parameter counts and FLOPs, a hand-computed piece of its forward."""
import math

import torch
import torch.nn.functional as F

from projects.ultramem_gpt import configs
from projects.ultramem_gpt.model import Model
from tests.core import test_contract, test_throughput


def test_the_core_tests_find_the_project():
    assert "ultramem_gpt" in test_contract.PROJECTS and "ultramem_gpt" in test_throughput.LANGUAGE_MODELS


def test_an_untrained_model_predicts_about_uniformly():
    # Weights initialised small give logits near zero: the loss of a uniform guess, ln(vocab), within a tenth
    # of it (a model whose outputs were scaled wrongly, or that saw the targets, would be far off).
    torch.manual_seed(0)
    cfg = configs.get("cpu")
    model = Model(cfg)
    x = torch.randint(cfg.vocab_size, (2, cfg.seq_len + 1))
    with torch.no_grad():
        logits = model(x[:, :-1])[0]
    loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1 * math.log(cfg.vocab_size)
