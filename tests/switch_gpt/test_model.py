"""switch_gpt against independent references: the load-balancing loss and capacity by hand, E = 1 against the
GPT's MLP, the float32 router under bf16 autocast, parameter counts by hand, and a run's expert statistics."""
import json
import math

import pytest
import torch

from languini import transformer
from languini.experiment import main
from projects.switch_gpt import configs
from projects.switch_gpt.model import Model, SwitchMLP, within_capacity

LN3 = math.log(3)


def layer(**overrides) -> SwitchMLP:
    torch.manual_seed(0)
    cfg = configs.get("cpu", **overrides)
    mlp = SwitchMLP(cfg)
    mlp.init_weights()
    return mlp


def test_load_balancing_loss_by_hand():
    mlp = layer(d_model=2, n_experts=2)
    with torch.no_grad():
        mlp.router.weight.copy_(torch.eye(2))
    # Router probabilities (3/4, 1/4) for three tokens and (1/4, 3/4) for the fourth: f = (3/4, 1/4),
    # P = (5/8, 3/8), sum f_i P_i = 15/32 + 3/32 = 9/16, loss = 0.01 x 2 x 9/16.
    x = torch.tensor([[LN3, 0.0], [LN3, 0.0], [LN3, 0.0], [0.0, LN3]])
    _, aux = mlp(x)
    assert aux["load_balancing"].item() == pytest.approx(0.01 * 2 * 9 / 16, rel=1e-6)
    assert "router_z" not in aux


def test_router_z_loss_by_hand():
    mlp = layer(d_model=2, n_experts=2, router_z_coef=1e-3)
    with torch.no_grad():
        mlp.router.weight.copy_(torch.eye(2))
    _, aux = mlp(torch.tensor([[LN3, 0.0], [0.0, LN3]]))
    assert aux["router_z"].item() == pytest.approx(1e-3 * math.log(4) ** 2, rel=1e-6)  # logsumexp = log(3 + 1)


def test_top2_capacity_by_hand():
    # E = 2, 4 tokens, top-2, capacity 2 per expert. First choices (0, 0, 1, 0) go first in token order: expert 0
    # takes tokens 0 and 1, drops token 3's; expert 1 takes token 2. Second choices (1, 1, 0, 1): expert 1's last
    # slot goes to token 0, token 1's and 3's are dropped; expert 0 is full, so token 2's is dropped.
    choice = torch.tensor([[0, 1], [0, 1], [1, 0], [0, 1]])
    expected = torch.tensor([[True, True], [True, False], [True, False], [False, False]])
    assert torch.equal(within_capacity(choice, 2, 2), expected)


def test_top1_overflow_passes_through_and_eval_drops_nothing():
    # E = 2, 6 tokens, capacity factor 1: 3 slots per expert. Five tokens choose expert 0: tokens 0, 1, 2 get its
    # slots, tokens 3 and 5 overflow (output 0, so the block's residual passes them through), token 4 gets expert 1.
    mlp = layer(d_model=2, n_experts=2, capacity_factor=1.0)
    with torch.no_grad():
        mlp.router.weight.copy_(torch.eye(2))
    x = torch.tensor([[2.0, 0.0], [1.0, 0.0], [3.0, 0.0], [1.5, 0.0], [0.0, 1.0], [2.5, 0.0]])
    assert mlp.capacity(6) == 3
    out, _ = mlp(x)
    assert torch.equal(out[[3, 5]], torch.zeros(2, 2))
    assert (out[[0, 1, 2, 4]].abs().sum(-1) > 0).all()
    assert mlp.train_dropped.item() == 2 and mlp.train_counts.tolist() == [5, 1]  # the drop rate logged: 2 / 6
    full, _ = mlp.eval()(x)  # evaluation: no capacity, every token through its expert
    torch.testing.assert_close(full[[0, 1, 2, 4]], out[[0, 1, 2, 4]])
    assert (full[[3, 5]].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("training", [pytest.param(True, id="train"), pytest.param(False, id="eval")])
def test_one_expert_is_the_gpt_mlp(training):
    torch.manual_seed(1)
    dense = transformer.MLP(128, 4)  # the GPT's MLP at the cpu config's width
    for p in dense.parameters():
        torch.nn.init.normal_(p, std=0.05)
    mlp = layer(n_experts=1).train(training)
    with torch.no_grad():  # the same weights; nn.Linear stores (out, in), the experts (in, out)
        mlp.fc_weight[0].copy_(dense.fc.weight.t())
        mlp.fc_bias[0].copy_(dense.fc.bias)
        mlp.proj_weight[0].copy_(dense.proj.weight.t())
        mlp.proj_bias[0].copy_(dense.proj.bias)
    x = torch.randn(2, 37, 128)
    out, _ = mlp(x)  # one expert: the gate is softmax of one logit, 1; capacity 1.25 x tokens does not bind
    torch.testing.assert_close(out, dense(x))


def test_router_is_float32_under_bf16_autocast():
    mlp = layer()
    x = torch.randn(64, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, probs, _, gates = mlp.route(x.to(torch.bfloat16))
        out, aux = mlp(x)
    assert logits.dtype == probs.dtype == gates.dtype == aux["load_balancing"].dtype == torch.float32
    reference = x.to(torch.bfloat16).double() @ mlp.router.weight.double().t()  # bf16 input, exact products
    # A bf16 product would be off by ~1e-2 relative; float32 is within ~1e-6.
    torch.testing.assert_close(logits.double(), reference, rtol=1e-5, atol=1e-6)


def hand_count(cfg) -> int:
    """Parameters counted from the architecture, independently of the model code."""
    d, h, E = cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.n_experts
    attn = d * 3 * cfg.n_heads * cfg.d_head + 3 * cfg.n_heads * cfg.d_head + cfg.n_heads * cfg.d_head * d + d
    mlp = d * h + h + h * d + d
    n_moe = {"every_other": cfg.n_layers // 2, "every": cfg.n_layers}.get(cfg.moe_layers, 1)
    blocks = cfg.n_layers * (4 * d + attn) + (cfg.n_layers - n_moe) * mlp + n_moe * (E * mlp + E * d)
    return cfg.vocab_size * d + cfg.seq_len * d + blocks + 2 * d + d * cfg.vocab_size


@pytest.mark.parametrize("name", list(configs.SIZES))
def test_parameter_count_by_hand(name):
    cfg = configs.get(name)
    with torch.device("meta"):
        model = Model(cfg)
    assert sum(p.numel() for p in model.parameters()) == hand_count(cfg)


def test_cpu_config_count_in_numbers():
    # 2048 x 128 embeddings, 128 x 128 positions, two blocks of attention and norms, one dense MLP, one layer of
    # 4 experts and a 4 x 128 router, the final norm, and the 128 x 2048 head.
    blocks = 2 * (4 * 128 + 128 * 384 + 384 + 128 * 128 + 128) + 131_712 + 4 * 131_712 + 512
    assert hand_count(configs.get("cpu")) == 262_144 + 16_384 + blocks + 256 + 262_144 == 1_333_120


def test_bad_config_values_say_what_is_allowed():
    with pytest.raises(ValueError, match="every_other"):
        configs.get("cpu", moe_layers="odd")
    with pytest.raises(ValueError, match="top1"):
        configs.get("cpu", routing="top3")


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_run_logs_aux_loss_and_drop_rate_and_reports_expert_load(default_corpus_root, tmp_path):
    results = main("switch_gpt", configs, Model, [
        "--config", "cpu", "--d_model", "32", "--n_heads", "2", "--d_head", "16", "--seq_len", "32",
        "--batch_size", "4", "--max_steps", "2", "--log_every", "1", "--eval_batch_size", "4",
        "--eval_max_batches", "2", "--slow_eval_max_windows", "2", "--data_root", str(default_corpus_root),
        "--out_dir", str(tmp_path), "--run_name", "smoke"])
    rows = [json.loads(line) for line in (tmp_path / "smoke" / "log.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["event"] == "train"]
    assert len(train) == 2 and all({"aux_load_balancing", "moe_drop_rate", "moe_load_cv"} <= set(r) for r in train)
    for split, stats in results["memory_stats"].items():
        (load,) = stats["expert_load"].values()  # the cpu config has one MoE block, of 4 experts
        assert len(load["share"]) == 4 and sum(load["share"]) == pytest.approx(1.0) and load["tokens"] > 0
