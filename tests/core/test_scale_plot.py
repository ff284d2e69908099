import importlib.util
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def scale_plot():
    spec = importlib.util.spec_from_file_location("scale_plot", REPO / "scripts" / "scale_plot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(root, name, project, compute_class, hours, flops, perplexity, split="test", mode="slow", curve=(),
              **fields):
    """A hand-made run folder; `fields` add or replace results.json entries (dataset fingerprint, ...)."""
    run = root / name
    run.mkdir(parents=True)
    results = {
        "project": project, "config": "small", "compute_class": compute_class, "accelerator_seconds": hours * 3600,
        "accelerator_hours": hours, "total_flops": flops,
        "eval": {mode: {split: {"loss": 1.0, "normalised_perplexity": perplexity, "scored_tokens": 10,
                                  "scored_bytes": 40}}},
        **fields,
    }
    (run / "results.json").write_text(json.dumps(results))
    rows = [{"event": "train", "step": 1, "tokens": 1, "accelerator_seconds": 1.0, "loss": 5.0, "lr": 1e-3}]
    rows += [{"event": "eval", "step": i, "tokens": 1000 * (i + 1), "accelerator_seconds": s, "split": split, "mode": mode,
              "loss": 1.0, "normalised_perplexity": p, "scored_tokens": 10, "scored_bytes": 40}
             for i, (s, p) in enumerate(curve)]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


# The paper's best runs: (compute class hours, normalised perplexity, total exaFLOPs).
GPT_TABLE_6 = [(6, 2.262, 0.769), (12, 2.197, 1.538), (24, 2.146, 3.075), (48, 2.087, 5.930), (96, 2.032, 11.859)]
QLSTM_TABLE_10 = [(6, 2.518, 0.239), (12, 2.463, 0.414), (24, 2.361, 0.605), (48, 2.280, 1.211), (96, 2.215, 2.421)]


def test_fit_reproduces_the_papers_legends(scale_plot, tmp_path):
    for project, table in (("gpt", GPT_TABLE_6), ("qlstm", QLSTM_TABLE_10)):
        for hours, perplexity, exaflops in table:
            write_run(tmp_path, f"{project}_{hours}h", project, f"{hours}h", hours, exaflops * 1e18, perplexity)
    fits = {(f.project, f.axis): f for f in scale_plot.main([str(tmp_path), "--out", str(tmp_path / "scale.png")])}
    # Figures 9a/10a: GPT slope -0.082 intercept 2.406 over accelerator time; reproduced to the printed digits.
    assert fits["gpt", "accelerator hours"].slope == pytest.approx(-0.082, abs=5e-4)
    assert fits["gpt", "accelerator hours"].intercept == pytest.approx(2.406, abs=5e-4)
    # Figure 9b: slope -0.084 intercept 5.737 over FLOPs; Table 6's rounded exaFLOPs give 5.701.
    assert fits["gpt", "total FLOPs"].slope == pytest.approx(-0.084, abs=5e-4)
    assert fits["gpt", "total FLOPs"].intercept == pytest.approx(5.737, abs=0.05)
    # Figure 10: qLSTM slope -0.112 intercept 2.722 (time), -0.134 and 7.883 (FLOPs); Table 10 gives
    # -0.114 / 2.729 and -0.136 / 7.963, so the figure's points differ slightly from the table's.
    assert fits["qlstm", "accelerator hours"].slope == pytest.approx(-0.112, abs=0.003)
    assert fits["qlstm", "accelerator hours"].intercept == pytest.approx(2.722, abs=0.01)
    assert fits["qlstm", "total FLOPs"].slope == pytest.approx(-0.134, abs=0.003)
    assert fits["qlstm", "total FLOPs"].intercept == pytest.approx(7.883, abs=0.1)
    assert (tmp_path / "scale.png").read_bytes().startswith(PNG_MAGIC)


def test_fit_recovers_exact_synthetic_laws(scale_plot, tmp_path, capsys):
    hours = np.array([0.25, 1, 3, 10, 40])
    flops = 7e15 * hours
    for h, f in zip(hours, flops):
        write_run(tmp_path, f"log_{h}", "loglaw", f"{h}h", h, f, 3.1 - 0.07 * math.log(h))
        write_run(tmp_path, f"pow_{h}", "power", f"{h}h", h, f, 2.5 * h ** -0.05)
    write_run(tmp_path, "ood_only", "loglaw", "2h", 2, 1e16, 9.9, split="java")
    fits = {(f.project, f.axis): f for f in scale_plot.main([str(tmp_path), "--out", str(tmp_path / "p.png")])}
    assert fits["loglaw", "accelerator hours"].slope == pytest.approx(-0.07, abs=1e-12)
    assert fits["loglaw", "accelerator hours"].intercept == pytest.approx(3.1, abs=1e-12)
    # Over FLOPs = 7e15 x hours the same law has intercept 3.1 + 0.07 ln(7e15).
    assert fits["loglaw", "total FLOPs"].intercept == pytest.approx(3.1 + 0.07 * math.log(7e15), abs=1e-9)
    assert fits["power", "accelerator hours"].loglog_exponent == pytest.approx(-0.05, abs=1e-12)
    assert fits["power", "total FLOPs"].loglog_exponent == pytest.approx(-0.05, abs=1e-12)
    out = capsys.readouterr().out
    assert "skipped" in out and "ood_only" in out and "log-log exponent" in out
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)


def test_best_run_per_compute_class_and_the_split_option(scale_plot, tmp_path):
    write_run(tmp_path, "a", "gpt", "6h", 6, 1e18, 2.30, split="java")
    write_run(tmp_path, "b", "gpt", "6h", 6, 2e18, 2.20, split="java")
    write_run(tmp_path, "c", "gpt", "12h", 12, 3e18, 2.10, split="java")
    out = str(tmp_path / "s.png")
    fits = scale_plot.main([str(tmp_path), "--out", out, "--split", "java"])
    assert fits[0].runs == 2
    assert fits[0].slope == pytest.approx((2.10 - 2.20) / math.log(2))
    assert scale_plot.main([str(tmp_path), "--out", out, "--split", "java", "--all_runs", "true"])[0].runs == 3
    with pytest.raises(SystemExit, match="no run has a slow eval on 'test'"):
        scale_plot.main([str(tmp_path), "--out", out])
    with pytest.raises(SystemExit, match="no run has a fast eval"):
        scale_plot.main([str(tmp_path), "--out", out, "--mode", "fast", "--split", "java"])


def test_learning_curves_are_drawn_from_the_logs(scale_plot, tmp_path, capsys):
    curve = [(60.0, 4.0), (600.0, 3.0), (3600.0, 2.5)]
    write_run(tmp_path, "gpt_1h", "gpt", "1h", 1, 1e16, 2.5, mode="fast", curve=curve)
    write_run(tmp_path, "qlstm_1h", "qlstm", "1h", 1, 1e16, 2.7, mode="fast", curve=curve[:2])
    out = tmp_path / "curves.png"
    scale_plot.main([str(tmp_path / "gpt_1h"), str(tmp_path / "qlstm_1h"), "--out", str(out), "--curves"])
    assert "2 learning curves" in capsys.readouterr().out  # fast eval rows on each run's own split by default
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(SystemExit, match="no slow eval rows"):
        scale_plot.main([str(tmp_path), "--out", str(out), "--curves", "--mode", "slow"])


def test_learning_curves_without_accelerator_seconds_are_said_and_drawn_over_tokens(scale_plot, tmp_path, capsys):
    # A --max_steps run of a config with no registry row logs no accelerator seconds.
    write_run(tmp_path, "gpt_1h", "gpt", "1h", 1, 1e16, 2.5, mode="fast", curve=[(60.0, 4.0), (600.0, 3.0)])
    write_run(tmp_path, "lram_gpt_600steps", "lram_gpt", None, 1, 1e16, 2.6, mode="fast",
              curve=[(None, 4.1), (None, 3.2)])
    out = tmp_path / "curves.png"
    scale_plot.main([str(tmp_path), "--out", str(out), "--curves"])
    printed = capsys.readouterr().out
    assert "skipped lram_gpt_600steps: its eval rows have no accelerator_seconds" in printed
    assert "(1 learning curves)" in printed
    scale_plot.main([str(tmp_path), "--out", str(out), "--curves", "--x", "tokens"])
    assert "(2 learning curves)" in capsys.readouterr().out
    assert out.read_bytes().startswith(PNG_MAGIC)


def progress_run(root, name, points, final, **fields):
    """A run whose log marks its evaluations during training (one subset of valid, the last step's included)
    and holds its final evaluation of the whole split after them."""
    run = write_run(root, name, "gpt", "1h", 1, 1e16, final, split="valid", mode="fast", **fields)
    rows = [{"event": "eval", "step": i + 1, "tokens": 1000 * (i + 1), "accelerator_seconds": s, "split": "valid",
             "mode": "fast", "normalised_perplexity": p, "max_batches": 2, "progress": True}
            for i, (s, p) in enumerate(points)]
    rows.append({"event": "eval", "step": len(points), "tokens": 1000 * len(points),
                 "accelerator_seconds": points[-1][0], "split": "valid", "mode": "fast",
                 "normalised_perplexity": final, "max_batches": 500})
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_learning_curves_draw_the_evaluations_during_training_not_the_final_one(scale_plot, tmp_path, monkeypatch):
    """Issue 26: the final evaluation scores other (more) text; joined to the curve it drew a cliff."""
    progress_run(tmp_path, "gpt_1h", [(60.0, 20.0), (600.0, 17.0), (3600.0, 16.7)], final=13.6, **BOOKS)
    drawn = []
    monkeypatch.setattr(scale_plot.plt.Axes, "plot", lambda self, *a, **k: drawn.append((a, k)) or [MagicLine()])
    scale_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--curves"])
    [(xs, ys), _] = drawn[0]
    assert list(xs) == [60.0, 600.0, 3600.0] and list(ys) == [20.0, 17.0, 16.7] and len(drawn) == 1


def test_learning_curves_of_older_logs_draw_the_final_point_apart(scale_plot, tmp_path, monkeypatch):
    write_run(tmp_path, "gpt_1h", "gpt", "1h", 1, 1e16, 2.5, mode="fast", curve=[(60.0, 4.0), (600.0, 3.0),
                                                                                 (600.0, 2.0)])
    drawn = []
    monkeypatch.setattr(scale_plot.plt.Axes, "plot", lambda self, *a, **k: drawn.append((a, k)) or [MagicLine()])
    scale_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--curves"])
    (line, _), (final, style) = drawn
    assert list(line[1]) == [4.0, 3.0] and final == (600.0, 2.0) and style["fillstyle"] == "none"


def test_learning_curves_of_other_datasets_are_not_drawn_together(scale_plot, tmp_path, capsys):
    progress_run(tmp_path, "gpt_books", [(60.0, 4.0), (600.0, 3.0)], final=2.5, **BOOKS)
    progress_run(tmp_path, "gpt_default", [(60.0, 9.0), (600.0, 8.0)], final=7.5,
                 **{**BOOKS, "dataset_fingerprint": "ffffffffffff", "dataset_name": "default_corpus_books_2048"})
    out = tmp_path / "c.png"
    with pytest.raises(SystemExit, match="2 groups that cannot be drawn together; they differ in dataset"):
        scale_plot.main([str(tmp_path), "--out", str(out), "--curves"])
    scale_plot.main([str(tmp_path), "--out", str(out), "--curves", "--group", "2"])
    assert "(1 learning curves)" in capsys.readouterr().out


def test_an_output_folder_that_does_not_exist_is_one_error(scale_plot, tmp_path):
    write_run(tmp_path, "gpt_1h", "gpt", "1h", 1, 1e16, 2.5)
    with pytest.raises(SystemExit, match="the folder .*nonexistent.* does not exist"):
        scale_plot.main([str(tmp_path), "--out", str(tmp_path / "nonexistent" / "x.png")])


def test_capped_slow_evaluations_are_said_on_the_plot_and_in_the_output(scale_plot, tmp_path, capsys):
    capped = {**BOOKS, "train_config": {"slow_eval_max_windows": 52}}
    for hours, ppl in ((1, 3.0), (2, 2.8)):
        write_run(tmp_path, f"gpt_{hours}h", "gpt", f"{hours}h", hours, 1e16 * hours, ppl, **capped)
    scale_plot.main([str(tmp_path), "--out", str(tmp_path / "s.png")])
    assert "warning: capped slow evaluation: the points score a sample of the split (slow eval on test, 10 " \
           "tokens scored (at most 52 windows))" in capsys.readouterr().out


class MagicLine:
    def get_color(self):
        return "black"


def test_paths_without_runs_are_errors(scale_plot, tmp_path):
    with pytest.raises(SystemExit, match="no results.json"):
        scale_plot.main([str(tmp_path), "--out", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match="not a run directory"):
        scale_plot.main([str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")])


BOOKS = {"dataset": "/data/books_16384", "dataset_name": "books_16384", "dataset_fingerprint": "a1b2c3d4e5f6",
         "tokenizer_fingerprint": "0123456789ab", "model_config": {"vocab_size": 16384},
         "reference_hardware": "RTX 3090", "train_config": {"slow_eval_max_windows": None}}


def slow_test_eval(perplexity, scored_tokens=5000):
    return {"slow": {"test": {"loss": 1.0, "normalised_perplexity": perplexity, "scored_tokens": scored_tokens,
                              "scored_bytes": 4 * scored_tokens}}}


def test_runs_that_cannot_be_compared_are_not_fitted_together(scale_plot, tmp_path, capsys):
    write_run(tmp_path, "gpt_6h", "gpt", "6h", 6, 1e18, 2.26, **BOOKS, eval=slow_test_eval(2.26))
    write_run(tmp_path, "gpt_12h", "gpt", "12h", 12, 2e18, 2.20, **BOOKS, eval=slow_test_eval(2.20))
    # the same GPU under torch's name: comparable
    write_run(tmp_path, "gpt_24h", "gpt", "24h", 24, 4e18, 2.15,
              **{**BOOKS, "reference_hardware": "NVIDIA GeForce RTX 3090"}, eval=slow_test_eval(2.15))
    shutil.copytree(tmp_path / "gpt_12h", tmp_path / "gpt_12h copy")  # a copied run counts once
    write_run(tmp_path, "gpt_debug", "gpt", None, 0.01, 1e15, 4.0, **BOOKS, eval=slow_test_eval(4.0))  # --max_steps
    write_run(tmp_path, "gpt_6h_default_corpus", "gpt", "6h", 6, 1e18, 1.9,
              **{**BOOKS, "dataset_name": "default_corpus_books_2048", "dataset_fingerprint": "ffff00001111",
                 "model_config": {"vocab_size": 2048}, "tokenizer_fingerprint": "999999999999"},
              eval=slow_test_eval(1.9))
    write_run(tmp_path, "gpt_48h_capped", "gpt", "48h", 48, 8e18, 2.9,
              **{**BOOKS, "train_config": {"slow_eval_max_windows": 8}}, eval=slow_test_eval(2.9, scored_tokens=1408))
    out = str(tmp_path / "s.png")
    with pytest.raises(SystemExit) as refused:
        scale_plot.main([str(tmp_path), "--out", out])
    message = str(refused.value)
    assert "3 groups that cannot be fitted together; they differ in dataset, tokenizer, evaluation:" in message
    assert "group 1 (3 runs): dataset books_16384 (fingerprint a1b2c3d4e5f6)" in message
    assert "reference hardware RTX 3090" in message and "1,408 tokens scored (at most 8 windows)" in message
    printed = capsys.readouterr().out
    assert "gpt_12h copy: a copy of" in printed and "gpt_debug: trained for --max_steps" in printed

    fits = {f.axis: f for f in scale_plot.main([str(tmp_path), "--out", out, "--group", "1"])}
    assert fits["accelerator hours"].runs == 3
    assert fits["accelerator hours"].slope == pytest.approx(np.polyfit(np.log([6, 12, 24]), [2.26, 2.20, 2.15], 1)[0])
    assert "dataset books_16384 (fingerprint a1b2c3d4e5f6); reference hardware RTX 3090" in capsys.readouterr().out
    assert scale_plot.main([str(tmp_path), "--out", out, "--group", "1", "--with_max_steps"])[0].runs == 4
    with pytest.raises(SystemExit, match="--group 4: the runs form 3 group"):
        scale_plot.main([str(tmp_path), "--out", out, "--group", "4"])


def test_a_rising_fit_is_flagged(scale_plot, tmp_path, capsys):
    write_run(tmp_path, "a", "gpt", "6h", 6, 1e18, 2.0, **BOOKS, eval=slow_test_eval(2.0))
    write_run(tmp_path, "b", "gpt", "12h", 12, 2e18, 2.5, **BOOKS, eval=slow_test_eval(2.5))
    fits = scale_plot.main([str(tmp_path), "--out", str(tmp_path / "s.png")])
    assert all(f.rising for f in fits)
    printed = capsys.readouterr().out
    assert "warning: gpt over accelerator hours: slope +0.7213, RISING" in printed
    assert printed.count("RISING: perplexity grows with compute") == 4  # two table rows, two warnings


def test_title_names_dataset_and_hardware(scale_plot, tmp_path, monkeypatch):
    titles = []
    monkeypatch.setattr(scale_plot, "plot_scaling", lambda points, fits, out, title: titles.append(title))
    write_run(tmp_path, "a", "gpt", "6h", 6, 1e18, 2.3, **BOOKS, eval=slow_test_eval(2.3))
    scale_plot.main([str(tmp_path), "--out", str(tmp_path / "s.png")])
    assert "dataset books_16384 (fingerprint a1b2c3d4e5f6), reference hardware RTX 3090" in titles[0]
    assert "slow eval on test, 5,000 tokens scored (all windows)" in titles[0]


@pytest.mark.parametrize("low,high,expected", [
    (2 / 60, 2 / 60, ["0.02", "0.03", "0.05"]),  # runs of one class, 2 minutes: the axis the issue saw as 120 s
    (6, 96, ["5", "10", "20", "50", "100"]),  # the paper's classes
])
def test_x_ticks_are_readable_hours(scale_plot, low, high, expected):
    figure, axis = scale_plot.plt.subplots()
    scale_plot.readable_log_axis(axis, low, high, scale_plot.hours_label)
    figure.canvas.draw()
    start, end = axis.get_xlim()
    assert start < low and high < end and end / start >= 4
    labels = [t.get_text() for t in axis.get_xticklabels() if start <= t.get_position()[0] <= end]
    assert labels == expected
    scale_plot.plt.close(figure)


def test_slow_eval_protocols_are_not_fitted_together(scale_plot, tmp_path):
    # the same text scored (same count) under two protocols: windows moved by 128 or by 64
    for name, hours, last_n in (("a", 6, 128), ("b", 12, 128), ("c", 24, 64)):
        evaluation = slow_test_eval(2.0)
        evaluation["slow"]["test"].update(protocol="last_n", window=512, last_n=last_n)
        write_run(tmp_path, name, "gpt", f"{hours}h", hours, 1e18, 2.0, **BOOKS, eval=evaluation)
    with pytest.raises(SystemExit, match="differ in evaluation:(.|\n)*protocol last_n \\(window 512, last 64\\)"):
        scale_plot.main([str(tmp_path), "--out", str(tmp_path / "s.png")])


def test_the_first_targets_sample_fits_stateless_and_stateful_models_together(scale_plot, tmp_path, capsys):
    """The issue's walkthrough pair: a GPT (windows, every_target) and a qLSTM (one stream) that scored the
    split's same first targets (the caps sized to a CPU class) are fitted together; the same pair under their
    own protocols over the whole split is not."""
    for name, project, hours, protocol, sample in (("g1", "gpt", 6, "every_target", "first"),
                                                   ("g2", "gpt", 12, "every_target", "first"),
                                                   ("q1", "qlstm", 6, "stream", "first"),
                                                   ("q2", "qlstm", 12, "stream", "first")):
        evaluation = slow_test_eval(2.0 + hours / 100)
        evaluation["slow"]["test"].update(protocol=protocol, window=512, last_n=128 if project == "gpt" else 512,
                                          max_windows=4, sample=sample)
        write_run(tmp_path / "first", name, project, f"{hours}h", hours, 1e18, 2.0, **{
            **BOOKS, "train_config": {"slow_eval_max_windows": 4, "slow_eval_sample": sample}}, eval=evaluation)
    scale_plot.main([str(tmp_path / "first"), "--out", str(tmp_path / "s.png")])
    assert "first 4 windows of targets" in capsys.readouterr().out
    for name, project, hours, protocol in (("g1", "gpt", 6, "last_n"), ("q1", "qlstm", 6, "stream")):
        evaluation = slow_test_eval(2.0)
        evaluation["slow"]["test"].update(protocol=protocol, window=512, last_n=128 if project == "gpt" else 512)
        write_run(tmp_path / "whole", name, project, f"{hours}h", hours, 1e18, 2.0, **BOOKS, eval=evaluation)
    with pytest.raises(SystemExit, match="differ in evaluation"):
        scale_plot.main([str(tmp_path / "whole"), "--out", str(tmp_path / "w.png")])


def test_learning_curves_are_labelled_by_run_and_their_axis_has_readable_ticks(scale_plot, tmp_path, monkeypatch):
    """Legends name the project, config, class and seed (not folder names); the log axis carries several ticks,
    however narrow the curves' range."""
    figures = []
    monkeypatch.setattr(scale_plot.plt, "close", figures.append)
    curve = [(60.0, 4.0), (90.0, 3.0), (120.0, 2.5)]
    for name, seed in (("run_a", 0), ("run_b", 1)):
        write_run(tmp_path, name, "gpt", "2m", 1, 1e16, 2.5, mode="fast", curve=curve,
                  train_config={"seed": seed, "compute_class": "2m"})
    scale_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--curves"])
    axis = figures[0].axes[0]
    legend = [t.get_text() for t in axis.get_legend().get_texts() if "final" not in t.get_text()]
    assert legend == ["gpt/small 2m seed 0", "gpt/small 2m seed 1"]
    figures[0].canvas.draw()
    labels = [t.get_text() for t in axis.get_xticklabels() if t.get_text()]
    assert len(labels) >= 3 and "100" in labels


def test_a_project_of_one_class_is_printed_with_its_numbers(scale_plot, tmp_path, capsys):
    for name, project, hours, ppl in (("g6", "gpt", 6, 2.26), ("g12", "gpt", 12, 2.2), ("q6", "qlstm", 6, 2.52)):
        write_run(tmp_path, name, project, f"{hours}h", hours, 1e18 * hours, ppl, **BOOKS,
                  eval=slow_test_eval(ppl))
    scale_plot.main([str(tmp_path), "--out", str(tmp_path / "s.png")])
    out = capsys.readouterr().out
    assert "2.5200" in out and "not fitted (runs of one compute class; drawn as points): qlstm" in out
