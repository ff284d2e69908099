"""Switch for attention (--expert_attention): the Switch layers of q and k/v against a per-token loop in float64
(routing, capacity, gates, outputs, every gradient and the load-balancing loss), one expert against the dense
attention, the parameter count by hand, causality, the bf16 warning and a training run's records."""
import json
import math

import pytest
import torch

from languini.experiment import main
from projects.switch_gpt import configs
from projects.switch_gpt.model import Attention, Model, SwitchLinear


def reference(x, router, weight, bias, k, capacity, coef):
    """Per token, in float64: the router's softmax, the top-k choices (GShard's renormalised gates for two), the
    slots given in token order to first choices, then to second ones, and the gated sum of the chosen linear maps;
    and Switch's load-balancing loss coef x E x sum_i f_i P_i."""
    E = weight.shape[0]
    probs = [torch.softmax(x[n] @ router.t(), -1) for n in range(x.shape[0])]
    choices = [sorted(range(E), key=lambda e: -float(p[e].detach()))[:k] for p in probs]
    used, kept = [0] * E, set()
    for j in range(k):
        for n, choice in enumerate(choices):
            if used[choice[j]] < capacity:
                used[choice[j]] += 1
                kept.add((n, j))
    rows = []
    for n, (p, choice) in enumerate(zip(probs, choices)):
        total = sum(p[e] for e in choice)
        row = torch.zeros(weight.shape[2], dtype=x.dtype)
        for j, e in enumerate(choice):
            if (n, j) in kept:
                row = row + (p[e] if k == 1 else p[e] / total) * (x[n] @ weight[e] + bias[e])
        rows.append(row)
    first = [sum(1 for c in choices if c[0] == e) / len(choices) for e in range(E)]
    mean_p = torch.stack(probs).mean(0)
    return torch.stack(rows), coef * E * sum(first[e] * mean_p[e] for e in range(E))


@pytest.mark.parametrize("routing,capacity_factor", [
    pytest.param("top1", 0.75, id="top1-capacity-binding"),
    pytest.param("top2", 0.6, id="top2-capacity-binding"),
    pytest.param("top1", 100.0, id="top1-no-drops"),
])
def test_switch_linear_matches_a_per_token_loop(routing, capacity_factor):
    torch.manual_seed(0)
    cfg = configs.get("cpu", n_experts=3, routing=routing, capacity_factor=capacity_factor)
    layer = SwitchLinear(cfg, 12, 10)
    layer.init_weights()
    with torch.no_grad():  # a bias and a router that spread the tokens
        layer.bias.normal_()
        layer.router.weight.normal_()
    x = torch.randn(2, 9, 12, requires_grad=True)
    out, aux = layer(x)
    upstream = torch.randn_like(out)
    params = [layer.router.weight, layer.weight, layer.bias]
    grads = torch.autograd.grad((out * upstream).sum() + aux["load_balancing"], [x, *params])

    leaves = [t.detach().double().requires_grad_() for t in (x, *params)]
    ref_out, ref_aux = reference(leaves[0].view(18, 12), *leaves[1:], layer.k, layer.capacity(18),
                                 cfg.load_balance_coef)
    ref_grads = torch.autograd.grad((ref_out.view_as(out) * upstream.double()).sum() + ref_aux, leaves)
    if capacity_factor < 1:
        assert layer.train_dropped.item() > 0  # the capacity did bind
    torch.testing.assert_close(out.double(), ref_out.view_as(out), rtol=1e-5, atol=1e-6)
    assert aux["load_balancing"].item() == pytest.approx(ref_aux.item(), rel=1e-5)
    for got, want, name in zip(grads, ref_grads, ("x", "router", "weight", "bias")):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("training", [pytest.param(True, id="train"), pytest.param(False, id="eval")])
def test_one_expert_is_the_dense_attention(training):
    """E = 1: the gate is softmax of one logit, 1, and capacity 1.25 x tokens never binds."""
    cfg = configs.get("cpu", n_experts=1)
    torch.manual_seed(0)
    dense, switch = Attention(cfg), Attention(cfg, experts=True).train(training)
    for p in dense.parameters():
        torch.nn.init.normal_(p, std=0.05)
    inner = cfg.n_heads * cfg.d_head
    with torch.no_grad():  # q from the first third of the dense projection, k and v from the rest
        switch.q.weight[0].copy_(dense.qkv.weight[:inner].t())
        switch.q.bias[0].copy_(dense.qkv.bias[:inner])
        switch.kv.weight[0].copy_(dense.qkv.weight[inner:].t())
        switch.kv.bias[0].copy_(dense.qkv.bias[inner:])
        switch.proj.load_state_dict(dense.proj.state_dict())
    x = torch.randn(2, 19, cfg.d_model)
    (want, none), (got, aux) = dense(x), switch(x)
    torch.testing.assert_close(got, want)
    assert none == {} and set(aux) == {"load_balancing"}


def hand_count(cfg) -> int:
    """Parameters of a model whose MoE blocks have Switch attention, counted from the architecture."""
    d, h, E, i = cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.n_experts, cfg.n_heads * cfg.d_head
    dense_attn, mlp = d * 3 * i + 3 * i + i * d + d, d * h + h + h * d + d
    switch_attn = (d * E + E * (d * i + i)) + (d * E + E * (d * 2 * i + 2 * i)) + i * d + d  # q, k/v, proj
    n_moe = cfg.n_layers // 2  # every other block
    blocks = (cfg.n_layers * 4 * d + (cfg.n_layers - n_moe) * (dense_attn + mlp)
              + n_moe * (switch_attn + E * mlp + E * d))
    return cfg.vocab_size * d + cfg.seq_len * d + blocks + 2 * d + d * cfg.vocab_size


@pytest.mark.parametrize("name", ["cpu", "small"])
def test_parameter_counts_by_hand(name):
    cfg = configs.get(name, expert_attention=True)
    with torch.device("meta"):
        model = Model(cfg)
    assert sum(p.numel() for p in model.parameters()) == hand_count(cfg)
    d, E, i = cfg.d_model, cfg.n_experts, cfg.n_heads * cfg.d_head
    unused = (E - 1) * (d * i + i + d * 2 * i + 2 * i + 2 * d * 4 * d + 4 * d + d)  # top-1: q, k/v and MLP
    assert model.active_parameters() == hand_count(cfg) - (cfg.n_layers // 2) * unused


def test_expert_attention_is_causal_and_warns_under_bf16():
    torch.manual_seed(0)
    model = Model(configs.get("cpu", vocab_size=64, seq_len=16, d_model=32, n_heads=2, d_head=16,
                              expert_attention=True)).eval()
    x = torch.randint(64, (2, 16))
    changed = x.clone()
    changed[:, 9:] = (x[:, 9:] + 1) % 64
    torch.testing.assert_close(model(changed)[0][:, :9], model(x)[0][:, :9])
    assert set(model.switch_layers()) == {"block_1_q", "block_1_kv", "block_1"}
    with pytest.warns(UserWarning, match="diverged in bfloat16"), torch.autocast("cpu", dtype=torch.bfloat16):
        model.train()(x)


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_a_run_with_expert_attention_records_three_routers(default_corpus_root, tmp_path):
    results = main("switch_gpt", configs, Model, [
        "--config", "cpu", "--d_model", "32", "--n_heads", "2", "--d_head", "16", "--seq_len", "32",
        "--expert_attention", "true", "--batch_size", "4", "--max_steps", "2", "--log_every", "1",
        "--eval_batch_size", "4", "--eval_max_batches", "2", "--slow_eval_max_windows", "2",
        "--data_root", str(default_corpus_root), "--out_dir", str(tmp_path), "--run_name", "r"])
    rows = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["event"] == "train"]
    assert len(train) == 2 and all(r["aux_load_balancing"] > 0 and 0 <= r["moe_drop_rate"] < 1 for r in train)
    assert set(results["memory_stats"]["test"]["expert_load"]) == {"block_1_q", "block_1_kv", "block_1"}
    assert results["model_config"]["expert_attention"] is True
    assert math.isfinite(results["eval"]["slow"]["test"]["normalised_perplexity"])
