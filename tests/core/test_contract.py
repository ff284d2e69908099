"""Every project under projects/ against the model contract (languini/model_contract.py), on its `cpu` config.

Projects are discovered, so a new one is checked without editing this file; one that is not a language model
declares `LANGUAGE_MODEL = False` in its __init__.py and is left out (projects/neural_bloom). What is specific to a project
(its paper's parameter counts, its kernels) is tested in tests/<project>/.
"""
import dataclasses
import importlib
import json
import math

import pytest
import torch
from torch.utils._pytree import tree_flatten

from languini import checkpoint, memory_layers, model_contract, model_parallel, parallelize
from languini.experiment import REPO_ROOT
from languini.plan import CPU_CONFIG


def is_language_model(project: str) -> bool:
    """False for a project whose package declares `LANGUAGE_MODEL = False` (neural_bloom: a set-membership filter)."""
    return getattr(importlib.import_module(f"projects.{project}"), "LANGUAGE_MODEL", True) is not False


FOLDERS = sorted(path.parent.name for path in (REPO_ROOT / "projects").glob("*/model.py"))
PROJECTS = [name for name in FOLDERS if is_language_model(name)]
BATCH, LENGTH = 2, 12


def project_params():
    return [pytest.param(name, id=name) for name in PROJECTS]


def load(project):
    configs = importlib.import_module(f"projects.{project}.configs")
    return configs, importlib.import_module(f"projects.{project}.model").Model


def cpu_model(project, seed=0):
    configs, model_cls = load(project)
    torch.manual_seed(seed)
    return model_cls(configs.get(CPU_CONFIG)).eval()


def tokens(model, seed=0, length=LENGTH):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(model.cfg.vocab_size, (BATCH, min(length, model.cfg.seq_len)), generator=generator)


def forward(model, x, state=None):
    """(logits, state, aux) of a forward that returns (logits, state) or (logits, state, aux)."""
    output = model(x, state)
    assert isinstance(output, tuple) and len(output) in (2, 3), "forward returns (logits, state[, aux])"
    return output if len(output) == 3 else (*output, {})


def test_every_project_is_found():
    assert {"gpt", "qlstm", "lram_gpt", "pkm_gpt"} <= set(PROJECTS)


def test_only_projects_declared_not_language_models_are_left_out():
    left_out = set(FOLDERS) - set(PROJECTS)
    assert "neural_bloom" in left_out
    assert all(importlib.import_module(f"projects.{name}").LANGUAGE_MODEL is False for name in left_out)


@pytest.mark.parametrize("project", project_params())
def test_project_has_a_cpu_config_and_declares_stateful(project):
    configs, model_cls = load(project)
    assert CPU_CONFIG in configs.SIZES and configs.get(CPU_CONFIG) == configs.SIZES[CPU_CONFIG]
    model_contract.stateful(model_cls)  # raises unless a bool is declared
    assert isinstance(cpu_model(project), model_contract.LanguageModel)
    assert (REPO_ROOT / "projects" / project / "train.py").exists()


def test_a_model_without_stateful_gets_one_error_naming_the_contract():
    class Undeclared(torch.nn.Module):
        pass

    with pytest.raises(model_contract.ContractError, match="stateful = True.*stateful = False.*model_contract.py"):
        model_contract.stateful(Undeclared)


@pytest.mark.parametrize("project", project_params())
def test_output_shapes_and_aux_losses(project):
    model = cpu_model(project)
    x = tokens(model)
    with torch.no_grad():
        logits, state, aux = forward(model, x)
    assert logits.shape == (*x.shape, model.cfg.vocab_size) and torch.isfinite(logits).all()
    assert (state is None) != model.stateful  # a stateless model returns None, a stateful one its state
    assert isinstance(aux, dict) and all(torch.is_tensor(v) and v.ndim == 0 for v in aux.values())


@pytest.mark.parametrize("project", project_params())
def test_an_untrained_model_predicts_about_uniformly(project):
    # Weights initialised small give logits near zero: the loss of a uniform guess, ln(vocab), within a tenth
    # of it (a model whose outputs were scaled wrongly, or that saw its targets, would be far off).
    model = cpu_model(project)
    x = tokens(model, length=LENGTH + 1)
    with torch.no_grad():
        logits, _, _ = forward(model, x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    assert abs(loss.item() - math.log(model.cfg.vocab_size)) < 0.1 * math.log(model.cfg.vocab_size)


@pytest.mark.parametrize("project", project_params())
def test_a_saved_config_passes_the_checks_of_resume_and_evaluate(project):
    # what trainer.load_state_dict and scripts/evaluate.py do with a checkpoint's model_config (saved as JSON)
    configs, _ = load(project)
    cfg = configs.get(CPU_CONFIG)
    saved = json.loads(json.dumps(dataclasses.asdict(cfg)))
    memory_layers.check_renamed(saved, configs.ModelConfig)
    assert model_parallel.same_model(saved, cfg) and configs.ModelConfig(**saved) == cfg


@pytest.mark.parametrize("project", project_params())
def test_state_is_carried(project):
    model = cpu_model(project)
    first, second = tokens(model, seed=1), tokens(model, seed=2)
    with torch.no_grad():
        _, state, _ = forward(model, first)
        fresh, _, _ = forward(model, second)
        carried, _, _ = forward(model, second, state)
    if model.stateful:  # the previous batch of the streams reaches the next one through the state
        assert (carried - fresh).abs().max() > 1e-3
    else:
        assert state is None
        # fp32 logits of order 1; a state that leaked into the output would move them by far more (see above)
        torch.testing.assert_close(carried, fresh, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("project", project_params())
def test_causal(project):
    model = cpu_model(project)
    x = tokens(model)
    cut = x.shape[1] // 2
    changed = x.clone()
    changed[:, cut:] = (x[:, cut:] + 1) % model.cfg.vocab_size  # every token from `cut` on differs
    with torch.no_grad():
        before, _, _ = forward(model, x)
        after, _, _ = forward(model, changed)
    # The earlier positions see the same tokens: the same numbers up to the reduction order of the kernels
    # (fp32, sums over at most a few hundred terms of logits of order 1: 1e-5 is far above that, far below
    # what one token changes, as the later positions show).
    torch.testing.assert_close(after[:, :cut], before[:, :cut], rtol=0, atol=1e-5)
    assert (after[:, cut:] - before[:, cut:]).abs().amax(dim=-1).gt(1e-4).all()


@pytest.mark.parametrize("project", project_params())
def test_optimizer_groups_partition_the_parameters(project):
    model = cpu_model(project)
    if not isinstance(model, model_contract.WithOptimizerGroups):
        pytest.skip(f"{project} trains all its parameters in one group")
    groups = model.optimizer_groups(1e-3)
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    assert all(g["lr"] > 0 for g in groups)


@pytest.mark.parametrize("project", project_params())
def test_extra_flops_are_a_count(project):
    model = cpu_model(project)
    if not isinstance(model, model_contract.WithExtraFlops):
        pytest.skip(f"{project}: the profiler sees all its FLOPs")
    short, long = model.extra_flops(8), model.extra_flops(16)
    assert isinstance(short, int) and 0 <= short <= long


@pytest.mark.parametrize("project", project_params())
def test_memory_statistics_after_an_eval_forward(project):
    model = cpu_model(project)
    if not isinstance(model, model_contract.WithMemoryStats):
        pytest.skip(f"{project} has no memory statistics")
    model.reset_memory_stats()
    with torch.no_grad():
        forward(model, tokens(model))
    stats = model.memory_stats()
    json.dumps(stats)  # goes into results.json as it is

    def leaves(value):
        if isinstance(value, dict):
            return [leaf for v in value.values() for leaf in leaves(v)]
        if isinstance(value, list):
            return [leaf for v in value for leaf in leaves(v)]
        return [value]
    numbers = leaves(stats)
    assert numbers and all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)


@pytest.mark.parametrize("project", project_params())
def test_output_layer_head_makes_the_logits(project):
    """The after-step hook, --hebbian_softmax and the neural cache read the inputs of `head` and move its rows."""
    model = cpu_model(project)
    head = model_contract.output_head(model)
    assert head.out_features == model.cfg.vocab_size
    inputs = []
    head.register_forward_hook(lambda module, args, output: inputs.append(args[0]))
    with torch.no_grad():
        logits = model(tokens(model), None)[0]
    assert len(inputs) == 1  # one call per forward: its inputs are the hidden states of every position
    torch.testing.assert_close(logits, torch.nn.functional.linear(inputs[0], head.weight, head.bias))


@pytest.mark.parametrize("project", project_params())
def test_states_stored_in_a_smaller_dtype_come_back_rounded(project):
    model = cpu_model(project)
    dtype = model_contract.checkpoint_state_dtype(model)  # raises unless None or a floating dtype
    if dtype is None:
        pytest.skip(f"{project} stores its states in checkpoints as they are")
    assert model.stateful, "only a carried state is stored in checkpoints"
    with torch.no_grad():
        _, state, _ = forward(model, tokens(model))
    leaves = tree_flatten(state)[0]
    # the trainer casts the tensors it finds in nested lists, tuples and dicts: a tensor inside another object
    # would be stored as it is
    assert all(leaf is None or torch.is_tensor(leaf) for leaf in leaves)
    packed, dtypes = checkpoint.pack_states(state, dtype)
    restored = tree_flatten(checkpoint.unpack_states(packed, dtypes))[0]
    for got, original in zip(restored, leaves, strict=True):
        if torch.is_tensor(original) and original.is_floating_point():
            assert got.dtype == original.dtype and torch.equal(got, original.to(dtype).to(original.dtype))
    with torch.no_grad():  # the model continues from the restored state
        logits, _, _ = forward(model, tokens(model, seed=1), checkpoint.unpack_states(packed, dtypes))
    assert torch.isfinite(logits).all()


def _loss_and_gradients(model, x):
    logits, _, aux = forward(model, x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()) + sum(aux.values())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("project", project_params())
def test_activation_checkpointing_gives_the_same_loss_and_gradients(project):
    plain, checkpointed = cpu_model(project).train(), cpu_model(project).train()
    if not hasattr(checkpointed, "blocks"):
        with pytest.raises(ValueError, match="no `blocks`"):
            parallelize.checkpoint_activations(checkpointed)
        return
    if type(checkpointed.blocks[0]).forward is torch.nn.Module.forward:  # blocks computed by the model itself
        with pytest.raises(ValueError, match="--activation_checkpointing"):
            parallelize.checkpoint_activations(checkpointed)
        return
    parallelize.checkpoint_activations(checkpointed)
    assert list(checkpointed.state_dict()) == list(plain.state_dict())  # checkpoints do not see it
    x = tokens(plain, length=33)
    loss, grads = _loss_and_gradients(plain, x)
    loss_c, grads_c = _loss_and_gradients(checkpointed, x)
    assert loss_c.item() == pytest.approx(loss.item(), rel=1e-6)
    assert grads_c.keys() == grads.keys()
    for name, grad in grads.items():
        # the recomputed forward runs the same fp32 operations; sums may run in another order
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-4, atol=1e-6 * grad.abs().max().item(), msg=name)
