import pytest

from languini import compute_class as cc
from languini import throughput as tp
from languini.throughput import ThroughputNotFoundError


@pytest.mark.parametrize(
    "name, seconds",
    [("6h", 21600), ("12h", 43200), ("24h", 86400), ("48h", 172800), ("96h", 345600),
     ("90s", 90), ("15m", 900), ("2h", 7200), ("1.5h", 5400), ("0.1h", 360), (" 6H ", 21600)],
)
def test_durations(name, seconds):
    assert cc.compute_class_seconds(name) == seconds


@pytest.mark.parametrize("name", ["6", "6d", "h", "-6h", "6 h", "1e3s", "6hours", "", "0h", "0.0m", "1.5.h"])
def test_bad_durations_name_the_accepted_forms(name):
    with pytest.raises(ValueError, match=r"90s, 15m, 2h.*6h, 12h, 24h, 48h, 96h"):
        cc.compute_class_seconds(name)


# Step counts the Languini authors published with their GPT configs (official code, languini/projects/gpt/
# README.md; RTX 3090 throughputs of Table 5, seq_len 512): all are round(3600 h v / (batch * 512)).
@pytest.mark.parametrize(
    "hours, tokens_per_second, batch, steps",
    [(6, 55416, 128, 18265), (12, 55416, 128, 36529), (24, 55416, 256, 36529),
     (48, 16618, 256, 21908), (96, 16618, 256, 43817)],
)
def test_steps_match_published_gpt_runs(hours, tokens_per_second, batch, steps):
    assert cc.training_steps(3600 * hours, tokens_per_second, batch, 512) == steps


def test_steps_round_to_nearest_and_half_up():
    assert cc.training_steps(10, 10, 4, 10) == 3  # 2.5 batches
    assert cc.training_steps(10, 9.9, 4, 10) == 2  # 2.475
    assert cc.training_steps(10, 10.1, 4, 10) == 3  # 2.525
    assert cc.training_steps(0.1 * 3600, 1, 1, 360) == 1  # exact decimal durations


def test_budget_below_half_a_batch_is_an_error():
    with pytest.raises(ValueError, match="longer compute class or a smaller batch"):
        cc.training_steps(90, 100, 64, 512)


def test_plan_reproduces_table_6_and_10():
    # GPT 6h: small, batch 128; 109.6 GFLOPs per forward (Table 4) -> 1.2B tokens, 0.769 exaFLOPs.
    plan = cc.plan_training(tp.model_spec("gpt", "small"), "6h", 128, 512, flops_per_forward=109.6e9)
    assert (plan.tokens_per_second, plan.throughput_source, plan.steps) == (55416, "published", 18265)
    assert plan.tokens == pytest.approx(1.2e9, rel=0.01)
    assert plan.total_flops / 1e18 == pytest.approx(0.769, abs=0.0005)
    assert plan.accelerator_hours == pytest.approx(6, rel=1e-4)
    # GPT 48h: medium, batch 256; 352.4 GFLOPs -> 5.930 exaFLOPs (within the rounding of Table 4's GFLOPs).
    plan = cc.plan_training(tp.model_spec("gpt", "medium"), "48h", 256, 512, flops_per_forward=352.4e9)
    assert plan.total_flops / 1e18 == pytest.approx(5.930, abs=0.001)
    # qLSTM 24h: small, batch 84; 107.3 GFLOPs (Table 8) -> 0.96B tokens, 0.605 exaFLOPs.
    plan = cc.plan_training(tp.model_spec("qlstm", "small"), "24h", 84, 512, flops_per_forward=107.3e9)
    assert plan.tokens / 1e9 == pytest.approx(0.96, abs=0.005)
    assert plan.total_flops / 1e18 == pytest.approx(0.605, abs=0.0005)


def test_plan_other_reference_hardware_and_local_wall_time():
    # Section 3.1: T tokens of GPT small take 6h on an RTX 3090 and about 2.5h on an A100 (Table 6: 2.46h).
    plan = cc.plan_training(tp.model_spec("gpt", "small"), "6h", 128, 512, local_hardware="NVIDIA A100-SXM4-80GB")
    assert plan.expected_wall_seconds / 3600 == pytest.approx(2.46, abs=0.005)
    assert plan.local_row.tokens_per_second == 135107
    plan = cc.plan_training(tp.model_spec("gpt", "small"), "6h", 128, 512, reference_hardware="A100-80GB")
    assert plan.tokens_per_second == 135107


def test_plan_without_registry_row_names_the_command_and_the_escape_hatch():
    with pytest.raises(ThroughputNotFoundError, match=r"measure_throughput\.py gpt XL --sweep(.|\n)*--tokens_per_second"):
        cc.plan_training(tp.model_spec("gpt", "XL"), "6h", 128, 512)
    plan = cc.plan_training(tp.model_spec("gpt", "XL"), "6h", 128, 512, tokens_per_second=10000)
    assert (plan.throughput_source, plan.steps) == ("--tokens_per_second", 3296)  # 216e6 / 65536 = 3295.9


def test_format_plan_is_aligned_and_complete():
    plan = cc.plan_training(tp.model_spec("gpt", "small"), "24h", 256, 512, flops_per_forward=109.6e9, local_hardware="cpu")
    text = cc.format_plan(plan)
    lines = text.splitlines()
    value_column = {len(line) - len(line[len(line.split("  ")[0]):].lstrip()) for line in lines}
    assert len(value_column) == 1, text
    for expected in ("RTX 3090", "55,416 tokens/s", "36,529", "4,787,929,088", "24.000", "3.075 exaFLOPs",
                     "measure_throughput.py gpt small --sweep"):
        assert expected in text, text


def test_plan_of_a_modified_config_never_takes_the_unmodified_configs_throughput():
    from projects.gpt import configs

    larger = tp.model_spec("gpt", "cpu", configs.get("cpu", d_model=512, n_layers=8))
    with pytest.raises(ThroughputNotFoundError, match="gpt cpu --d_model 512 --n_layers 8 --sweep"):
        cc.plan_training(larger, "3m", 16, 128, reference_hardware="cpu")
    plan = cc.plan_training(larger, "3m", 16, 128, reference_hardware="cpu", tokens_per_second=4000)
    assert (plan.throughput_source, plan.throughput_row, plan.steps) == ("--tokens_per_second", None, 352)  # 720000/2048


def test_plan_evaluation_time_by_hand(tmp_path):
    # 9 evaluations of 2,048 positions during training and 30,720 at the end, on a device training at
    # 1,000 tokens/s (forward passes at 3,000/s): 18,432 / 3,000 = 6.144 s and 30,720 / 3,000 = 10.24 s.
    model = tp.model_spec("gpt", "cpu")
    registry = tmp_path / "throughput.csv"
    row = tp.ThroughputRow("gpt", "cpu", model.fingerprint, "", "cpu", 16, 128, 1000.0, None, "fp32", False,
                           "2.13.0", "2026-01-01", "measured")
    tp.append_row(registry, row)
    work = cc.EvalWork(each_during_training=2048, evaluations_during_training=9, final=30720)
    plan = cc.plan_training(model, "2m", 16, 128, registry, reference_hardware="cpu", local_hardware="cpu",
                            evaluation=work)
    assert plan.throughput_row == plan.local_row == row and plan.steps == 59  # 120 000 / 2048 = 58.6
    assert plan.expected_wall_seconds == pytest.approx(59 * 2048 / 1000)
    assert plan.expected_eval_seconds(work.during_training) == pytest.approx(6.144)
    assert plan.expected_eval_seconds(work.final) == pytest.approx(10.24)
    text = cc.format_plan(plan)
    assert "training 2.0 min on cpu" in text and "evaluation 16 s: 9 x 2,048 positions during training (6 s), " \
        "30,720 at the end (10 s)" in text and "total 2.3 min" in text, text  # 120.8 + 16.4 s


def test_plan_says_when_its_row_is_derived(tmp_path):
    model = tp.model_spec("lram_gpt", "small")
    registry = tmp_path / "throughput.csv"
    note = ("derived: 55,416 tokens/s of gpt small (published, RTX 3090) x 0.5302 = 238,234 / 449,295 tokens/s of "
            "this model / gpt small, both measured in this run on NVIDIA H100 80GB HBM3; best of 8 batch sizes")
    tp.append_row(registry, tp.ThroughputRow("lram_gpt", "small", model.fingerprint, "", "RTX 3090", 128, 512, 29383.0,
                                             None, "bf16", False, "2.11.0", "2026-11-24", "derived", note))
    plan = cc.plan_training(model, "6h", 128, 512, registry)
    assert plan.throughput_source == "derived" and plan.steps == 9684  # 21600 x 29383 / 65536 = 9684.3
    text = cc.format_plan(plan)
    assert "29,383 tokens/s (derived on RTX 3090, 2026-11-24)" in text
    assert note.split("; ")[0] in text
