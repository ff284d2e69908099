"""The plan of a compute class: throughput rows, steps, tokens, FLOPs and wall time against the paper's tables
and hand computations."""
import dataclasses
import json

import pytest
import torch

from languini import plan as planning
from languini import throughput as tp
from languini.throughput import ThroughputNotFoundError
from languini.trainer import TrainConfig


def test_plan_reproduces_table_6_and_10():
    # GPT 6h: small, batch 128; 109.6 GFLOPs per forward (Table 4) -> 1.2B tokens, 0.769 exaFLOPs.
    plan = planning.plan_compute_class(tp.model_spec("gpt", "small"), "6h", 128, 512, flops_per_forward=109.6e9)
    assert (plan.tokens_per_second, plan.throughput_source, plan.steps) == (55416, "published", 18265)
    assert plan.tokens == pytest.approx(1.2e9, rel=0.01)
    assert plan.total_flops / 1e18 == pytest.approx(0.769, abs=0.0005)
    assert plan.accelerator_hours == pytest.approx(6, rel=1e-4)
    # GPT 48h: medium, batch 256; 352.4 GFLOPs -> 5.930 exaFLOPs (within the rounding of Table 4's GFLOPs).
    plan = planning.plan_compute_class(tp.model_spec("gpt", "medium"), "48h", 256, 512, flops_per_forward=352.4e9)
    assert plan.total_flops / 1e18 == pytest.approx(5.930, abs=0.001)
    # qLSTM 24h: small, batch 84; 107.3 GFLOPs (Table 8) -> 0.96B tokens, 0.605 exaFLOPs.
    plan = planning.plan_compute_class(tp.model_spec("qlstm", "small"), "24h", 84, 512, flops_per_forward=107.3e9)
    assert plan.tokens / 1e9 == pytest.approx(0.96, abs=0.005)
    assert plan.total_flops / 1e18 == pytest.approx(0.605, abs=0.0005)


def test_plan_other_reference_hardware_and_local_wall_time():
    # Section 3.1: T tokens of GPT small take 6h on an RTX 3090 and about 2.5h on an A100 (Table 6: 2.46h).
    plan = planning.plan_compute_class(tp.model_spec("gpt", "small"), "6h", 128, 512,
                                       local_hardware="NVIDIA A100-SXM4-80GB")
    assert plan.expected_wall_seconds / 3600 == pytest.approx(2.46, abs=0.005)
    assert plan.local_row.tokens_per_second == 135107
    plan = planning.plan_compute_class(tp.model_spec("gpt", "small"), "6h", 128, 512, reference_hardware="A100-80GB")
    assert plan.tokens_per_second == 135107


def test_plan_without_registry_row_names_the_command_and_the_escape_hatch():
    with pytest.raises(ThroughputNotFoundError, match=r"measure_throughput\.py gpt XL --sweep(.|\n)*--tokens_per_second"):
        planning.plan_compute_class(tp.model_spec("gpt", "XL"), "6h", 128, 512)
    plan = planning.plan_compute_class(tp.model_spec("gpt", "XL"), "6h", 128, 512, tokens_per_second=10000)
    assert (plan.throughput_source, plan.steps) == ("--tokens_per_second", 3296)  # 216e6 / 65536 = 3295.9


def test_format_plan_is_aligned_and_complete():
    plan = planning.plan_compute_class(tp.model_spec("gpt", "small"), "24h", 256, 512, flops_per_forward=109.6e9,
                                       local_hardware="cpu")
    text = planning.format_plan(plan)
    lines = text.splitlines()
    value_column = {len(line) - len(line[len(line.split("  ")[0]):].lstrip()) for line in lines}
    assert len(value_column) == 1, text
    for expected in ("RTX 3090", "55,416 tokens/s", "36,529", "4,787,929,088", "24.000", "3.075e+18 (3.07 exaFLOPs",
                     "measure_throughput.py gpt small --sweep"):
        assert expected in text, text


def test_plan_of_a_modified_config_never_takes_the_unmodified_configs_throughput():
    from projects.gpt import configs

    larger = tp.model_spec("gpt", "cpu", configs.get("cpu", d_model=512, n_layers=8))
    with pytest.raises(ThroughputNotFoundError, match="gpt cpu --d_model 512 --n_layers 8 --sweep"):
        planning.plan_compute_class(larger, "3m", 16, 128, reference_hardware="cpu")
    plan = planning.plan_compute_class(larger, "3m", 16, 128, reference_hardware="cpu", tokens_per_second=4000)
    assert (plan.throughput_source, plan.throughput_row, plan.steps) == ("--tokens_per_second", None, 352)  # 720000/2048


def test_plan_evaluation_time_by_hand(tmp_path):
    # 9 evaluations of 2,048 positions during training and 30,720 at the end, on a CPU training at 1,000 tokens/s
    # (forward passes planned at 1.5x there: 1,500/s): 18,432 / 1,500 = 12.288 s and 30,720 / 1,500 = 20.48 s.
    model = tp.model_spec("gpt", "cpu")
    registry = tmp_path / "throughput.csv"
    row = tp.ThroughputRow("gpt", "cpu", model.fingerprint, "", "cpu", 16, 128, 1000.0, None, "fp32", False,
                           "2.13.0", "2026-01-01", "measured")
    tp.append_row(registry, row)
    work = planning.EvalWork(each_during_training=2048, evaluations_during_training=9, final=30720)
    plan = planning.plan_compute_class(model, "2m", 16, 128, registry, reference_hardware="cpu", local_hardware="cpu",
                                       evaluation=work)
    assert plan.throughput_row == plan.local_row == row and plan.steps == 59  # 120 000 / 2048 = 58.6
    assert plan.expected_wall_seconds == pytest.approx(59 * 2048 / 1000)
    assert plan.expected_eval_seconds(work.during_training) == pytest.approx(12.288)
    assert plan.expected_eval_seconds(work.final) == pytest.approx(20.48)
    text = planning.format_plan(plan)
    assert "training 2.0 min on cpu" in text and "evaluation 33 s: 9 x 2,048 positions during training (12 s), " \
        "30,720 at the end (20 s); forward passes at 1.5x" in text and "total 2.6 min" in text, text  # 120.8 + 32.8 s


def test_plan_says_when_its_row_is_derived(tmp_path):
    model = tp.model_spec("lram_gpt", "small")
    registry = tmp_path / "throughput.csv"
    note = ("derived: 55,416 tokens/s of gpt small (published, RTX 3090) x 0.5302 = 238,234 / 449,295 tokens/s of "
            "this model / gpt small, both measured in this run on NVIDIA H100 80GB HBM3; best of 8 batch sizes")
    tp.append_row(registry, tp.ThroughputRow("lram_gpt", "small", model.fingerprint, "", "RTX 3090", 128, 512, 29383.0,
                                             None, "bf16", False, "2.11.0", "2026-11-24", "derived", note))
    plan = planning.plan_compute_class(model, "6h", 128, 512, registry)
    assert plan.throughput_source == "derived" and plan.steps == 9684  # 21600 x 29383 / 65536 = 9684.3
    text = planning.format_plan(plan)
    assert "29,383 tokens/s (derived on RTX 3090, 2026-11-24)" in text
    assert note.split("; ")[0] in text


def tiny_gpt_with_stage_rows(tmp_path, monkeypatch, rates: dict[int, float]):
    """A one-layer GPT at seq_len 32 and a registry (standing in for the project's) with a row per length."""
    from projects.gpt import configs

    cfg = configs.get("cpu", seq_len=32, d_model=32, n_layers=1, n_heads=2, d_head=16)
    registry = tmp_path / "throughput.csv"
    for length, rate in rates.items():
        spec = tp.model_spec("gpt", "cpu", dataclasses.replace(cfg, seq_len=length))
        tp.append_row(registry, tp.ThroughputRow("gpt", "cpu", spec.fingerprint, spec.flags, "cpu", 4, length, rate,
                                                 None, "fp32", False, "2.13.0", "2026-01-02", "measured", "by hand"))
    monkeypatch.setattr(tp, "registry_path", lambda project: registry)
    return tp.model_spec("gpt", "cpu", cfg), cfg, registry


def plan_of(model, cfg, tcfg, tmp_path):
    return planning.plan_run(model, None, cfg, tcfg, torch.device("cpu"), 1, None, None, False, False, str(tmp_path),
                             print)


def test_max_steps_plan_charges_each_stage_at_its_own_row(tmp_path, monkeypatch):
    # 14 steps of batch 4, a quarter of the tokens at 8: steps in proportion to 0.25/8 : 0.75/32 = 4 : 3, so 8 and
    # 6; 8 x 4 x 8 tokens at 640 tokens/s (0.4 s) and 6 x 4 x 32 at 1,280 (0.6 s).
    model, cfg, _ = tiny_gpt_with_stage_rows(tmp_path, monkeypatch, {8: 640.0, 32: 1280.0})
    tcfg = TrainConfig(max_steps=14, batch_size=4, stages="8:0.25,32", stage_batch="sequences",
                       reference_hardware="cpu")
    plan = plan_of(model, cfg, tcfg, tmp_path)
    assert [(s.seq_len, s.steps, s.tokens_per_second) for s in plan.stages] == [(8, 8, 640.0), (32, 6, 1280.0)]
    assert (plan.steps, plan.tokens, plan.tokens_per_second) == (14, 1024, 1280.0)
    assert plan.accelerator_seconds == pytest.approx(1.0)
    assert planning.format_plan(plan) == ("Training gpt/cpu for --max_steps 14 (no compute class) in stages: 8 steps "
                                          "at 8, then 6 steps at 32.")


def test_a_resumed_run_keeps_the_plan_it_started_with(tmp_path, monkeypatch):
    # 1 s: N/4/640 + 3N/4/1280 = 1 gives N = 1,024 tokens, 8 + 6 steps; with rows twice as fast, 2,048: 16 + 12.
    model, cfg, registry = tiny_gpt_with_stage_rows(tmp_path, monkeypatch, {8: 640.0, 32: 1280.0})
    tcfg = TrainConfig(compute_class="1s", batch_size=4, stages="8:0.25,32", stage_batch="sequences",
                       reference_hardware="cpu")
    started = plan_of(model, cfg, tcfg, tmp_path)
    assert [s.steps for s in started.stages] == [8, 6] and started.tokens == 1024
    (tmp_path / "config.json").write_text(json.dumps(started.record()))
    for length, rate in {8: 1280.0, 32: 2560.0}.items():  # newer rows of the same models
        row = next(r for r in tp.read_registry(registry) if r.seq_len == length)
        tp.append_row(registry, dataclasses.replace(row, tokens_per_second=rate, date="2026-02-03"))
    now = plan_of(model, cfg, tcfg, tmp_path)
    assert [s.steps for s in now.stages] == [16, 12] and now.tokens == 2048
    kept = planning.resumed(now, tmp_path, print)
    assert (kept.steps, kept.tokens, kept.schedule()) == (14, 1024, started.schedule())
    assert kept.throughput_row == started.throughput_row and kept.accelerator_seconds == pytest.approx(1.0)
    # in tokens (the default) the same second buys the same 1,024 tokens in 2 steps of 16 x 8 and 6 of 4 x 32, and
    # a resumed run keeps its rows per stream too
    tokens = dataclasses.replace(tcfg, stage_batch="tokens")
    (tmp_path / "rows").mkdir()
    first = plan_of(model, cfg, tokens, tmp_path / "rows")
    (tmp_path / "rows" / "config.json").write_text(json.dumps(first.record()))
    assert planning.resumed(plan_of(model, cfg, tokens, tmp_path / "rows"), tmp_path / "rows", print).schedule() \
        == first.schedule()


def test_plan_units_show_the_number():
    """Issue 26: a 2-minute class printed '0.000B' tokens and '0.000 exaFLOPs'."""
    assert planning._scaled(79_872, planning.TOKEN_UNITS) == "79.9K"
    assert planning._scaled(1_197_015_040, planning.TOKEN_UNITS) == "1.2B"
    assert planning._scaled(3.467e11, planning.FLOP_UNITS) == "347 GFLOPs"
    assert planning._scaled(7.689e17, planning.FLOP_UNITS) == "769 petaFLOPs"
    assert planning._scaled(512, planning.TOKEN_UNITS) == "512"


def sized_plan(default_corpus_root, tmp_path, monkeypatch, rate, cpu_path=True, stateful=False, **over):
    from languini.books import BooksDataset
    model, cfg, _ = tiny_gpt_with_stage_rows(tmp_path, monkeypatch, {32: rate})
    dataset = BooksDataset(default_corpus_root, 2048)
    tcfg = TrainConfig(compute_class="20s", batch_size=4, reference_hardware="cpu", eval_batch_size=4)
    return planning.plan_run(model, None, cfg, dataclasses.replace(tcfg, **over), torch.device("cpu"), 1, None,
                             dataset, stateful, cpu_path, str(tmp_path), print), tcfg


def test_evaluation_is_sized_to_a_fraction_of_the_training_time(default_corpus_root, tmp_path, monkeypatch):
    """On the CPU path a short class cannot spend longer evaluating than training: a model at the reference speed
    evaluates within a quarter of its training time (by the plan's own estimate)."""
    reference = planning.CPU_EVAL_REFERENCE_TOKENS_PER_SECOND
    full, tcfg = sized_plan(default_corpus_root, tmp_path, monkeypatch, reference / 8, cpu_path=False)
    assert full.eval_caps is None  # a GPU-style run: the protocol's evaluation, whatever it costs
    full_seconds = full.expected_eval_seconds(full.evaluation.during_training) + full.expected_final_eval_seconds()
    assert full_seconds > 0.25 * full.expected_wall_seconds  # the default corpus at 1,250 tokens/s: too much
    sized, _ = sized_plan(default_corpus_root, tmp_path, monkeypatch, reference)
    work = sized.evaluation
    assert sized.expected_eval_seconds(work.during_training) + sized.expected_final_eval_seconds() \
        <= 0.25 * sized.expected_wall_seconds
    caps = sized.eval_caps
    assert caps.fraction == 0.25 and caps.eval_max_batches < 500 and caps.slow_eval_max_windows is not None
    assert sized.training_config(tcfg).slow_eval_max_windows == caps.slow_eval_max_windows
    assert sized.training_config(tcfg).slow_eval_sample == "first"
    text = planning.format_plan(sized)
    assert "evaluation sized" in text and "--eval_budget" in text and "same sample for every project" in text
    assert sized_plan(default_corpus_root, tmp_path, monkeypatch, reference, eval_budget=0.0)[0].eval_caps is None
    asked, _ = sized_plan(default_corpus_root, tmp_path, monkeypatch, reference / 8, cpu_path=False, eval_budget=0.25)
    assert asked.eval_caps is not None and asked.eval_caps.slow_eval_sample == "spread"  # asked for on a GPU too


def test_every_model_at_a_cpu_class_gets_the_same_evaluation_sample(default_corpus_root, tmp_path, monkeypatch):
    """The final evaluation's caps at a CPU class do not depend on the model's speed nor on its being stateful;
    the plan says how long the slow model's evaluation takes against its training."""
    reference = planning.CPU_EVAL_REFERENCE_TOKENS_PER_SECOND
    plans = [sized_plan(default_corpus_root, tmp_path, monkeypatch, rate, stateful=stateful)[0]
             for rate, stateful in ((reference / 5, False), (reference * 3, False), (reference / 2, True))]
    caps = {(p.eval_caps.eval_max_batches, p.eval_caps.slow_eval_max_windows, p.eval_caps.slow_eval_sample)
            for p in plans}
    assert len(caps) == 1 and caps.pop()[2] == "first"
    assert "at this model's speed the evaluation takes" in planning.format_plan(plans[0])


def test_a_max_steps_run_on_a_cpu_bounds_its_evaluation(default_corpus_root, tmp_path, monkeypatch):
    """A --max_steps run evaluates within the budget of its expected training time here (its CPU row, else the
    reference speed), or a minute if that is more; the plan says so. The issue: 20 steps trained 10 s then evaluated for over 11 minutes."""
    monkeypatch.setattr(planning, "MAX_STEPS_MIN_EVAL_SECONDS", 0.05)  # the default corpus evaluates in seconds
    reference = planning.CPU_EVAL_REFERENCE_TOKENS_PER_SECOND
    plan, tcfg = sized_plan(default_corpus_root, tmp_path, monkeypatch, reference, compute_class=None, max_steps=20)
    caps = plan.eval_caps
    # 20 steps x 4 x 32 tokens at 10,000 tokens/s: 0.256 s of training, 0.064 s of evaluation allowed: the least
    # evaluation there is, the subset of the evaluations during training and one window, once
    assert caps is not None and caps.sized and caps.slow_eval_sample == "spread"
    assert (caps.eval_max_batches, caps.slow_eval_max_windows) == (planning.CPU_PROGRESS_BATCHES, 1)
    assert plan.evaluation.evaluations_during_training == 1
    monkeypatch.setattr(planning, "MAX_STEPS_MIN_EVAL_SECONDS", 60)
    minute, _ = sized_plan(default_corpus_root, tmp_path, monkeypatch, reference, compute_class=None, max_steps=20)
    assert minute.eval_caps is None or not minute.eval_caps.sized  # its whole evaluation fits in a minute
    assert "Evaluation bounded" in planning.format_plan(plan)
    unbounded, _ = sized_plan(default_corpus_root, tmp_path, monkeypatch, reference, compute_class=None,
                              max_steps=20, cpu_path=False)
    assert unbounded.eval_caps is None and "Evaluation bounded" not in planning.format_plan(unbounded)


@pytest.mark.parametrize("keep, spread, kept", [(True, 0.1, True), (False, 0.1, False), (True, 1.07, False)])
def test_a_cpu_timing_is_kept_only_by_a_real_run_on_a_quiet_machine(tmp_path, monkeypatch, keep, spread, kept):
    """The issue: a dry run's 15-step timing, spread 107%, fixed the steps of later runs. A dry run writes
    nothing, and a timing whose spread says the machine was busy is not kept (the run still uses it)."""
    from languini import measure
    from projects.gpt import configs

    cfg = configs.get("cpu", seq_len=32, d_model=32, n_layers=1, n_heads=2, d_head=16)
    timed = measure.Measurement(4, 1234.0, 0.1, None, spread)
    monkeypatch.setattr(measure, "measure_batch_size", lambda *args: timed)
    said = []
    row = planning.cpu_row(tp.model_spec("gpt", "cpu", cfg), lambda c: torch.nn.Linear(1, 1), cfg,
                           TrainConfig(batch_size=4), str(tmp_path), torch.device("cpu"), said.append, keep)
    assert row.tokens_per_second == 1234.0
    assert (tmp_path / "throughput.csv").exists() == kept
    assert ("not kept" in said[-2 if spread > planning.BUSY_SPREAD else -1]) == (not kept)
