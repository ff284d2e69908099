import dataclasses

import pytest
import torch

from languini import experiment, flops
from projects.qlstm import configs
from projects.qlstm.model import Model

# Table 8 of the paper: millions of parameters, forward giga-FLOPs at batch 1 x 512, block length
TABLE_8 = {
    "mini": (27.8, 19.9, 16),
    "tiny": (55.9, 44.3, 8),
    "small": (117.3, 107.3, 16),
    "medium": (361.1, 352.7, 16),
    "large": (787.0, 780.4, 16),
    "XL": (1628.2, 1633.6, 16),
}
RUNS = [("qlstm", "loop"), ("qlstm", "block"), ("qlstm", "triton"), ("lstm", None)]


def tiny_config(cell="qlstm", impl=None, **overrides):
    fields = dict(vocab_size=50, seq_len=32, d_model=16, n_layers=2, n_heads=2, d_head=4, block_len=4)
    return configs.ModelConfig(cell=cell, impl=impl, **{**fields, **overrides})


def random_model(cfg, seed=0):
    # weights far larger than the init so that the carried state visibly changes the outputs
    torch.manual_seed(seed)
    model = Model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("size", TABLE_8)
def test_parameter_counts_and_block_lengths_match_table_8(size):
    millions, _, block_len = TABLE_8[size]
    with torch.device("meta"):
        model = Model(configs.SIZES[size])
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == millions  # to the printed digit
    assert configs.SIZES[size].block_len == block_len
    assert configs.SIZES[size].vocab_size == 16384 and configs.SIZES[size].seq_len == 512


@pytest.mark.parametrize("size", TABLE_8)
def test_forward_flops_match_table_8(size):
    _, gigaflops, _ = TABLE_8[size]
    cfg = configs.SIZES[size]
    with torch.device("meta"):
        model = Model(cfg)
    assert flops.forward_flops(model, 512, cfg.vocab_size, "meta") / 1e9 == pytest.approx(gigaflops, rel=0.002)


@pytest.mark.parametrize("cell, impl", RUNS)
def test_forward_flops_equal_a_hand_count(cell, impl, device):
    # per token and layer: gates d -> 4HD, output HD -> d, MLP d -> 4d -> d (2 FLOPs per multiply-add),
    # two LayerNorms (DeepSpeed: 5 per element), GELU (1 per element), the recurrence (multiply and add
    # per cell element); the LSTM adds U h (HD -> 4D per head); then the final LayerNorm and the head.
    cfg = tiny_config(cell, impl, seq_len=11)
    d, hd, v = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.vocab_size
    layer = 2 * d * 4 * hd + 2 * hd * d + 2 * 2 * d * 4 * d + 2 * 5 * d + 4 * d + 2 * hd
    if cell == "lstm":
        layer += 2 * hd * 4 * cfg.d_head
    per_token = cfg.n_layers * layer + 5 * d + 2 * d * v
    # numpy's einsum_path, which DeepSpeed asks for the LSTM's einsum, adds a FLOP or so per call
    tolerance = 0 if cell == "qlstm" else 1e-3
    assert flops.forward_flops(Model(cfg).to(device), 11, v, device) == pytest.approx(11 * per_token, rel=tolerance)


@pytest.mark.parametrize("cell, impl", RUNS)
def test_two_halves_with_carried_state_equal_the_whole(cell, impl, device):
    model = random_model(tiny_config(cell, impl)).to(device)
    x = torch.randint(50, (3, 23)).to(device)
    logits, state = model(x)
    first, carried = model(x[:, :10])
    second, state_after_halves = model(x[:, 10:], carried)
    torch.testing.assert_close(torch.cat([first, second], dim=1), logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state_after_halves, state, rtol=1e-5, atol=1e-5)
    restarted, _ = model(x[:, 10:])
    assert not torch.allclose(restarted, logits[:, 10:], atol=1e-3)  # the carried state matters


@pytest.mark.parametrize("cell, impl", RUNS)
def test_no_state_means_zeros(cell, impl, device):
    model = random_model(tiny_config(cell, impl)).to(device)
    x = torch.randint(50, (2, 9)).to(device)
    zeros = torch.zeros(2, 2, 4, device=device)
    layer_zeros = zeros if cell == "qlstm" else (zeros, zeros)
    torch.testing.assert_close(model(x)[0], model(x, [layer_zeros] * 2)[0])


@pytest.mark.parametrize("cell, impl", RUNS)
def test_causal(cell, impl, device):
    model = random_model(tiny_config(cell, impl)).to(device)
    x = torch.randint(50, (2, 19)).to(device)
    changed = x.clone()
    changed[:, 6] = (x[:, 6] + 1) % 50  # inside the second block of 4 steps
    before, after = model(x)[0], model(changed)[0]
    # exact: the same kernels on the same numbers; step 6 reaches no earlier step (loop, Triton scan) or only
    # through terms multiplied by an exact 0 (the block scan's masked weights), which add nothing
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=0)
    assert (after[:, 6:] - before[:, 6:]).abs().amax(dim=-1).gt(1e-4).all()


def test_implementations_agree_on_the_whole_model(device):
    x = torch.randint(50, (2, 21)).to(device)
    want = random_model(tiny_config(impl="loop")).to(device)(x)[0]
    for impl in ["block", "triton"]:
        got = random_model(tiny_config(impl=impl)).to(device)(x)[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("field, value, message", [("cell", "gru", "cell must be"), ("impl", "scan", "impl must be"),
                                                    ("block_len", 0, "block_len must be")])
def test_bad_configs_raise_clear_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        Model(dataclasses.replace(tiny_config(), **{field: value}))
    with pytest.raises(ValueError, match="one entry per layer"):
        Model(tiny_config())(torch.zeros(1, 3, dtype=torch.long), [None])


def test_training_run_carries_the_state(default_corpus_root, tmp_path):
    seq_len, windows = 32, 2
    states_seen = []

    class RecordingModel(Model):
        def forward(self, x, state=None):
            if self.training and x.shape[0] > 1:  # training batches; the FLOP count runs one sequence
                states_seen.append(state is not None)
            return super().forward(x, state)

    argv = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
            "--seq_len", str(seq_len), "--batch_size", "4", "--eval_batch_size", "4", "--max_steps", "3",
            "--eval_max_batches", "1", "--slow_eval_max_windows", str(windows), "--log_every", "1",
            "--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--run_name", "smoke"]
    results = experiment.main("qlstm", configs, RecordingModel, argv=argv)
    assert results["steps"] == 3
    assert states_seen == [False, True, True]  # zeros at the start, then the detached state of the last step
    for split, slow in results["eval"]["slow"].items():
        # a stateful model reads each stream once (all predictions of every window scored) instead of
        # sliding windows that score only the last quarter after the first one
        assert slow["scored_tokens"] == windows * seq_len, split
    assert results["flops_per_forward"] > 0
