"""Sequence-length stages (--stages) against hand computations: parsing, the steps and reference time of each
stage, the batches' running offsets, and a two-stage run's accounting in its log and results.json."""
import json
from fractions import Fraction

import numpy as np
import pytest

from languini import compute_class, stages, throughput
from languini import plan as planning
from languini.books import BooksDataset, TrainBatches
from languini.experiment import main
from projects.gpt import configs
from projects.gpt.model import Model

TINY = ["--config", "cpu", "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16",
        "--seq_len", "32", "--batch_size", "4", "--eval_batch_size", "4", "--eval_max_batches", "2",
        "--slow_eval_max_windows", "2"]


def test_parse_reads_lengths_and_fractions_and_gives_the_rest_to_the_last_stage():
    assert stages.parse("128:0.25,512", 512) == (stages.Stage(128, Fraction(1, 4)), stages.Stage(512, Fraction(3, 4)))
    assert stages.parse("32:0.1, 64:0.2 ,128", 128)[2] == stages.Stage(128, Fraction(7, 10))
    assert stages.parse(None, 512) == (stages.Stage(512, Fraction(1)),)


@pytest.mark.parametrize("text, message", [
    pytest.param("128:0.25,1024", r"length 1024 is not in 1\.\.512", id="longer-than-the-model"),
    pytest.param("0:0.5,512", r"length 0 is not in", id="empty-length"),
    pytest.param("128:1.0,512", r"fraction 1.0 is not in \(0, 1\)", id="fraction-one"),
    pytest.param("128:0,512", r"fraction 0 is not in", id="fraction-zero"),
    pytest.param("128:0.6,256:0.5,512", r"sum to 1.1.*below 1", id="fractions-sum-above-one"),
    pytest.param("128:0.5,256:0.5,512", r"sum to 1;", id="fractions-sum-to-one"),
    pytest.param("128:0.25,512:0.75", r"last stage takes the remaining tokens; write 512", id="last-with-fraction"),
    pytest.param("128,512", r"stage 128 needs its fraction", id="missing-fraction"),
    pytest.param("short:0.25,512", r"'short:0.25' not understood", id="not-a-number"),
])
def test_bad_stages_are_explained(text, message):
    with pytest.raises(ValueError, match=message):
        stages.parse(text, 512)


def test_budget_split_by_hand():
    # 100 s; a quarter of the tokens at 128 (4096 tokens/s), the rest at 512 (1024 tokens/s); batch 4.
    # N / 4 / 4096 + 3 N / 4 / 1024 = 100 gives N = 126,030.77 tokens: stage 1 has 31,507.7 tokens = 61.54
    # batches of 4 x 128 -> 62 steps; stage 2 has 94,523.1 = 46.15 batches of 4 x 512 -> 46 steps.
    parsed = stages.parse("128:0.25,512", 512)
    assert stages.steps_for_budget(parsed, 100, [4096, 1024], 4) == [62, 46]
    # one stage: the compute class's usual round(seconds * v / (batch * seq_len))
    one = stages.parse(None, 512)
    assert stages.steps_for_budget(one, 100, [1024], 4) == [compute_class.training_steps(100, 1024, 4, 512)] == [50]


def test_max_steps_split_by_hand():
    # tokens in the ratio 1 : 3 at lengths 128 and 512: steps in the ratio 1/128 : 3/512 = 4 : 3
    assert stages.steps_for_total(stages.parse("128:0.25,512", 512), 70) == [40, 30]
    with pytest.raises(ValueError, match="no step for the stage"):
        stages.steps_for_total(stages.parse("128:0.25,512", 512), 1)


def test_schedule_positions_by_hand():
    schedule = stages.Schedule((128, 512), (62, 46), (4096.0, 1024.0))
    assert [schedule.seq_len_at(s) for s in (0, 61, 62, 107, 200)] == [128, 128, 512, 512, 512]
    assert schedule.offset(62) == 62 * 128 and schedule.offset(70) == 62 * 128 + 8 * 512
    # 62 x 4 x 128 = 31,744 tokens in 7.75 s, then 46 x 4 x 512 = 94,208 tokens in 92 s
    assert schedule.tokens(108, 4) == 125_952
    assert schedule.accelerator_seconds(108, 4) == pytest.approx(99.75, rel=1e-12)
    assert schedule.accelerator_seconds(62, 4) == pytest.approx(7.75, rel=1e-12)
    unknown = stages.Schedule((128, 512), (62, 46), (4096.0, None))
    assert unknown.accelerator_seconds(62, 4) == pytest.approx(7.75) and unknown.accelerator_seconds(63, 4) is None


def test_batches_change_length_and_every_stream_continues_where_it_was(default_corpus_root):
    books = BooksDataset(default_corpus_root, 2048).books("train")
    schedule = stages.Schedule((3, 8, 5), (2, 2, 3), (None,) * 3)
    staged = TrainBatches(books, 2048, 4, 8, micro_batches=2, schedule=schedule)
    by_token = TrainBatches(books, 2048, 4, 1, micro_batches=2)  # token k of every stream at step k: the reference
    assert [staged(s)[0].shape[-1] for s in range(7)] == [3, 3, 8, 8, 5, 5, 5]
    inputs = np.concatenate([staged(s)[0].numpy() for s in range(7)], axis=-1)
    targets = np.concatenate([staged(s)[1].numpy() for s in range(7)], axis=-1)
    read = np.concatenate([by_token(k)[0].numpy() for k in range(3 + 3 + 8 + 8 + 15 + 1)], axis=-1)
    np.testing.assert_array_equal(inputs, read[..., :-1])
    np.testing.assert_array_equal(targets, read[..., 1:])


def registry_with_stage_rows(tmp_path, rates: dict[int, float]):
    registry = tmp_path / "throughput.csv"
    for seq_len, rate in rates.items():
        spec = throughput.model_spec("gpt", "cpu", configs.get("cpu", seq_len=seq_len, d_model=32, n_layers=1,
                                                               n_heads=2, d_head=16))
        throughput.append_row(registry, throughput.ThroughputRow(
            "gpt", "cpu", spec.fingerprint, spec.flags, "cpu", 4, seq_len, rate, None, "fp32", False, "2.13.0",
            "2026-01-02", "measured", "by hand"))
    return registry


def test_plan_without_a_row_for_a_stage_names_its_measure_command(tmp_path):
    registry = registry_with_stage_rows(tmp_path, {32: 1280.0})
    cfg = configs.get("cpu", seq_len=32, d_model=32, n_layers=1, n_heads=2, d_head=16)
    stage_models = [(s, throughput.model_spec("gpt", "cpu", configs.get("cpu", **{**cfg.__dict__, "seq_len": s.seq_len})),
                     None) for s in stages.parse("8:0.25,32", 32)]
    with pytest.raises(throughput.ThroughputNotFoundError, match=r"(?s)stage 1 of --stages \(seq_len 8\).*"
                       r"measure_throughput.py gpt cpu .*--seq_len 8"):
        planning.plan_compute_class(throughput.model_spec("gpt", "cpu", cfg), "1s", 4, 32, registry, "cpu",
                                    stage_models=stage_models)


def test_two_stage_run_accounts_tokens_and_time_per_stage(default_corpus_root, tmp_path, monkeypatch, capsys):
    # 1 s of reference time, a quarter of the tokens at 8 (640 tokens/s), the rest at 32 (1280 tokens/s), batch 4:
    # N/4/640 + 3N/4/1280 = 1 s gives N = 1024 tokens: 256 at 8 = 8 steps of 4 x 8 (0.4 s), 768 at 32 = 6 steps
    # of 4 x 32 (0.6 s).
    monkeypatch.setattr(throughput, "registry_path", lambda project: registry_with_stage_rows(tmp_path, {8: 640.0,
                                                                                                           32: 1280.0}))
    args = TINY + ["--data_root", str(default_corpus_root), "--compute_class", "1s", "--reference_hardware", "cpu",
                   "--stages", "8:0.25,32", "--stage_batch", "sequences", "--log_every", "1", "--out_dir",
                   str(tmp_path), "--run_name", "r"]
    assert main("gpt", configs, Model, args + ["--dry_run"]) is None
    plan = capsys.readouterr().out
    assert "stage 1                  8 tokens x 4 sequences x 8 steps = 256 tokens (25%), 0 s at 640 tokens/s" in plan
    assert "stage 2                  32 tokens x 4 sequences x 6 steps = 768 tokens (75%), 1 s at 1,280 tokens/s" in plan
    results = main("gpt", configs, Model, args)
    assert results["steps"] == 14 and results["tokens_seen"] == 1024
    assert results["accelerator_seconds"] == pytest.approx(1.0, rel=1e-12)
    assert results["stages"] == [
        {"seq_len": 8, "steps": 8, "sequences_per_step": 4, "tokens": 256, "tokens_per_second": 640.0,
         "accelerator_seconds": 0.4},
        {"seq_len": 32, "steps": 6, "sequences_per_step": 4, "tokens": 768, "tokens_per_second": 1280.0,
         "accelerator_seconds": 0.6}]
    log = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in log if r["event"] == "train"}
    assert (train[8]["seq_len"], train[8]["tokens"], train[8]["accelerator_seconds"]) == (8, 256, pytest.approx(0.4))
    assert (train[9]["seq_len"], train[9]["tokens"], train[9]["accelerator_seconds"]) == (32, 384, pytest.approx(0.5))


def test_stage_batch_in_tokens_by_hand(default_corpus_root, tmp_path, monkeypatch, capsys):
    """--stage_batch tokens (the default, the Shortformer authors'): every step trains batch x 32 tokens. The same
    1 s as above buys the same 1,024 tokens: 256 at 8 in 2 steps of 16 sequences (4 streams x 32 / 8), 768 at 32
    in 6 steps of 4; a quarter of the tokens in a quarter of the updates."""
    monkeypatch.setattr(throughput, "registry_path", lambda project: registry_with_stage_rows(tmp_path, {8: 640.0,
                                                                                                           32: 1280.0}))
    args = TINY + ["--data_root", str(default_corpus_root), "--compute_class", "1s", "--reference_hardware", "cpu",
                   "--stages", "8:0.25,32", "--log_every", "1", "--out_dir", str(tmp_path), "--run_name", "r"]
    assert main("gpt", configs, Model, args + ["--dry_run"]) is None
    plan = capsys.readouterr().out
    assert "stage 1                  8 tokens x 16 sequences x 2 steps = 256 tokens (25%), 0 s at 640 tokens/s" in plan
    assert "stage 2                  32 tokens x 4 sequences x 6 steps = 768 tokens (75%), 1 s at 1,280 tokens/s" in plan
    results = main("gpt", configs, Model, args)
    assert (results["steps"], results["tokens_seen"]) == (8, 1024)
    assert [(s["steps"], s["sequences_per_step"], s["tokens"]) for s in results["stages"]] == [(2, 16, 256), (6, 4, 768)]
    with pytest.raises(SystemExit, match="must divide the last one's"):
        main("gpt", configs, Model, args + ["--stages", "12:0.25,32", "--dry_run"])


def test_batches_in_tokens_read_each_streams_stage_text_in_consecutive_parts(default_corpus_root):
    books = BooksDataset(default_corpus_root, 2048).books("train")
    # stage 1: 3 steps of 4 rows of 2 tokens per stream (its 24 tokens in 4 parts of 6); stage 2: 2 steps of 8
    schedule = stages.Schedule((2, 8), (3, 2), (None, None), (4, 1))
    staged = TrainBatches(books, 2048, 4, 8, micro_batches=2, schedule=schedule)
    by_token = TrainBatches(books, 2048, 4, 1, micro_batches=1)  # token k of every stream at step k
    stream = np.concatenate([by_token(k)[0].numpy()[0] for k in range(24 + 16 + 1)], axis=-1)  # (4 streams, 41)
    for q in range(3):
        x, y = staged(q)
        assert x.shape == (2, 2 * 4, 2)  # micro-batches x (2 streams x 4 rows) x length
        rows = x.reshape(4, 4, 2).numpy()  # stream x row x length
        for j in range(4):
            np.testing.assert_array_equal(rows[:, j], stream[:, 6 * j + 2 * q:6 * j + 2 * q + 2])
    x, y = staged(3)
    np.testing.assert_array_equal(x.reshape(4, 8).numpy(), stream[:, 24:32])
    np.testing.assert_array_equal(y.reshape(4, 8).numpy(), stream[:, 25:33])
    assert [schedule.resets_state_at(s) for s in range(5)] == [False, False, False, True, False]
    assert not stages.Schedule((2, 8), (3, 2), (None, None)).resets_state_at(3)  # sequences: the state carries on
