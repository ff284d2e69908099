"""Memory+ (Berges et al. 2024) as pkm_gpt's "<size>_memory_plus" configs: Meta's defaults written out by hand from its
code (facebookresearch/memory, lingua/product_key/memory.py and apps/main/configs/pkplus_373m_1024k.yaml), the
initialisation measured on built models against the formulas, the fixed value learning rate in the optimiser groups
and under a schedule, and the sigmoid gate against a hand computation."""
import math

import pytest
import torch

from languini.plan import cpu_sized
from languini.trainer import build_optimizers
from projects.pkm_gpt import configs
from projects.pkm_gpt.model import Model
from projects.pkm_gpt.pkm import ProductKeyMemory

SMALL = dict(vocab_size=50, seq_len=16, n_layers=3, n_heads=2, d_head=8, mlp_ratio=2)


def built(seed=0, **overrides):
    torch.manual_seed(seed)
    return Model(configs.ModelConfig(**{**SMALL, **overrides}))


@pytest.mark.parametrize("size, n_layers, layers", [("mini", 4, "1,3"), ("small", 12, "2,6,10"),
                                                    ("medium", 24, "4,12,20"), ("XL", 24, "4,12,20")])
def test_memory_plus_configs_carry_metas_defaults(size, n_layers, layers):
    cfg = configs.get(f"{size}_memory_plus")
    gpt = configs.get(size)
    # Meta's ProductKeyArgs: mem_heads 4, mem_k_dim 512, mem_knn 32, mem_n_keys 1024, mem_share_values, swilu
    # projection, value_fixed_lr 0.001; HashingMemory: no query batch norm (and no other normalisation)
    assert (cfg.pkm_heads, cfg.pkm_k_dim, cfg.pkm_knn, cfg.pkm_n_keys) == (4, 512, 32, 1024)
    assert cfg.share_memory and cfg.memory_gate == "silu" and cfg.memory_query_norm == "none"
    assert cfg.value_lr == 1e-3 and cfg.memory_init == "meta" and not cfg.memory_sigmoid_gate
    assert cfg.n_layers == n_layers and cfg.memory_layers == layers  # 24 blocks: the 373M config's "4,12,20"
    assert (cfg.d_model, cfg.n_heads, cfg.d_head) == (gpt.d_model, gpt.n_heads, gpt.d_head)


def test_every_other_config_keeps_its_numerics():
    # the new fields' defaults are the model as it was: XLM's sub-keys, the GPT's maps, value_lr_multiplier, no gate
    for name, cfg in configs.SIZES.items():
        if "memory_plus" not in name:
            assert (cfg.memory_init, cfg.value_lr, cfg.memory_sigmoid_gate) == ("xlm", None, False), name
    cpu = configs.get("memory_plus_cpu")
    assert (cpu.pkm_heads, cpu.pkm_k_dim, cpu.pkm_n_keys, cpu.pkm_knn) == (4, 32, 32, 8)  # the cpu config's memory
    assert cpu.memory_layers == "0,1" and cpu.share_memory and cpu.memory_init == "meta"
    assert cpu_sized("memory_plus_cpu")  # without a GPU, its own CPU path (a throughput row timed on this CPU)


def test_meta_init_measured_against_its_formulas():
    d, heads, k_dim = 256, 4, 64
    model = built(d_model=d, pkm_heads=heads, pkm_k_dim=k_dim, pkm_n_keys=16, pkm_knn=4, memory_gate="silu",
                  memory_sigmoid_gate=True, memory_init="meta", memory_query_norm="none")
    memory = model.memory
    # W_g (d -> v_dim) and W_o (v_dim -> d): N(0, 1/output_dim) = N(0, 1/256), 65,536 weights each
    for weight in (memory.gate.weight, memory.out.weight):
        assert weight.std().item() == pytest.approx(1 / 16, rel=0.02)
    assert memory.sigmoid_gate.weight.std().item() == pytest.approx(1 / 16, rel=0.25)  # 256 weights
    sub_bound = 1 / math.sqrt(64)  # 1/sqrt(k_dim), not the half's 1/sqrt(32)
    assert memory.sub_keys.abs().max().item() <= sub_bound
    assert memory.sub_keys.abs().max().item() > 1 / math.sqrt(72)  # 4,096 draws reach near the bound
    assert memory.sub_keys.std().item() == pytest.approx(sub_bound / math.sqrt(3), rel=0.05)
    xavier = math.sqrt(6 / (256 + heads * k_dim))  # Xavier-uniform: sqrt(6 / (fan_in + fan_out))
    assert memory.query_proj.weight.abs().max().item() <= xavier
    assert memory.query_proj.weight.std().item() == pytest.approx(xavier / math.sqrt(3), rel=0.02)
    assert memory.values.std().item() == pytest.approx(256 ** -0.5, rel=0.02)


def test_xlm_init_is_the_gpts_maps_and_xlms_sub_keys():
    model = built(d_model=256, pkm_heads=4, pkm_k_dim=64, pkm_n_keys=16, pkm_knn=4, memory_gate="silu")
    memory = model.memory
    assert memory.gate.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert memory.out.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * 3), rel=0.02)  # residual write
    assert memory.query_proj.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert memory.sub_keys.std().item() == pytest.approx(1 / math.sqrt(32) / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("lr", [2e-4, 6e-4])
def test_fixed_value_learning_rate_in_the_groups_and_under_the_schedule(lr):
    model = built(d_model=24, pkm_heads=2, pkm_k_dim=6, pkm_n_keys=4, pkm_knn=3, value_lr=1e-3)
    optimizers, _ = build_optimizers(model, lr, torch.device("cpu"))
    (adam,) = optimizers
    rates = {id(p): g["lr"] for g in adam.param_groups for p in g["params"]}
    assert rates[id(model.memory.values)] == 1e-3
    assert all(rate == lr for key, rate in rates.items() if key != id(model.memory.values))
    scheduler = torch.optim.lr_scheduler.LambdaLR(adam, lambda step: 0.5 ** step)  # as the trainer's: one factor
    adam.step()  # no gradients: moves nothing, keeps the scheduler's order
    scheduler.step()
    assert sorted(g["lr"] for g in adam.param_groups) == pytest.approx(sorted([lr / 2, 1e-3 / 2]))
    multiplied = built(d_model=24, pkm_heads=2, pkm_k_dim=6, pkm_n_keys=4, pkm_knn=3, value_lr_multiplier=3.0)
    groups = multiplied.optimizer_groups(lr)
    assert [g["lr"] for g in groups] == pytest.approx([lr, 3 * lr])


def test_sigmoid_gate_against_a_hand_computation():
    torch.manual_seed(1)
    d, heads, k_dim, n_keys, knn = 6, 2, 4, 3, 2
    layer = ProductKeyMemory(d, heads=heads, k_dim=k_dim, n_keys=n_keys, knn=knn, query_norm="none",
                             use_triton=False, sigmoid_gate=True).double()
    torch.nn.init.normal_(layer.sigmoid_gate.weight)
    torch.nn.init.normal_(layer.sigmoid_gate.bias)
    x = torch.randn(2, 5, d, dtype=torch.float64)
    expected = torch.zeros(2, 5, d, dtype=torch.float64)
    w, b = layer.sigmoid_gate.weight[0].detach(), layer.sigmoid_gate.bias[0].item()
    with torch.no_grad():
        for i in range(2):
            for t in range(5):
                token = x[i, t]
                query = (layer.query_proj.weight @ token + layer.query_proj.bias).view(heads, k_dim)
                read = torch.zeros(d, dtype=torch.float64)
                for h in range(heads):  # every product key (a, b) scored by brute force, its knn best softmaxed
                    keys = layer.sub_keys[h]
                    scores = torch.tensor([[query[h, :2] @ keys[0, a] + query[h, 2:] @ keys[1, c] for c in range(n_keys)]
                                           for a in range(n_keys)]).flatten()
                    best, rows = scores.topk(knn)
                    read += (torch.softmax(best, 0)[:, None] * layer.values[rows]).sum(0)
                expected[i, t] = read / (1 + math.exp(-(w @ token).item() - b))
        out = layer(x)
    # the layer's softmax runs in fp32 (pkm.py): its weights carry fp32's rounding, the rest is float64
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_sigmoid_gate_flops_and_parameters():
    plain = built(d_model=24, pkm_heads=2, pkm_k_dim=6, pkm_n_keys=4, pkm_knn=3, memory_layers="0,2")
    gated = built(d_model=24, pkm_heads=2, pkm_k_dim=6, pkm_n_keys=4, pkm_knn=3, memory_layers="0,2",
                  memory_sigmoid_gate=True)
    assert sum(p.numel() for p in gated.parameters()) - sum(p.numel() for p in plain.parameters()) == 2 * (24 + 1)
    assert gated.extra_flops(16) - plain.extra_flops(16) == 2 * 16 * 24  # the output times its scalar


def test_memory_plus_cpu_trains():
    model = Model(configs.get("memory_plus_cpu", vocab_size=50, seq_len=16))
    optimizers, _ = build_optimizers(model, 3e-3, torch.device("cpu"))
    x = torch.randint(50, (4, 16))
    losses = []
    for _ in range(10):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1])[0].flatten(0, 1), x[:, 1:].flatten())
        optimizers[0].zero_grad()
        loss.backward()
        optimizers[0].step()
        losses.append(loss.item())
    assert losses[-1] < 0.85 * losses[0]
