"""scripts/compare.py: the grid (entries x classes x seeds), skip and resume, the leaderboard and its "within
noise" rule against hand-made results, --collect on runs made by hand, and two tiny entries end to end."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.core.test_trainer import TINY

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare", REPO / "scripts" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["compare"]


def test_entries_parse_projects_and_named_variants(compare):
    assert compare.Entry.parse("gpt") == compare.Entry("gpt", "gpt", ())
    variant = compare.Entry.parse("gpt+hebbian=gpt --hebbian_softmax true")
    assert variant == compare.Entry("gpt+hebbian", "gpt", ("--hebbian_softmax", "true"))
    for bad, message in [("nonsense", "not a language-model project"), ("gpt --lr 1", "needs a name of its own"),
                         ("gpt=gpt --lr 1", "differ from the project's"), ("a/b=gpt", "folder name")]:
        with pytest.raises(ValueError, match=message):
            compare.Entry.parse(bad)


def test_grid_gives_the_middle_class_more_seeds_and_runs_the_cheapest_first(compare):
    entries = [compare.Entry.parse("gpt"), compare.Entry.parse("qlstm")]
    runs = compare.grid(entries, ["9m", "1m", "3m"], seeds=1, middle_seeds=2)
    assert [r.name for r in runs] == ["gpt_1m_seed0", "qlstm_1m_seed0", "gpt_3m_seed0", "qlstm_3m_seed0",
                                      "gpt_3m_seed1", "qlstm_3m_seed1", "gpt_9m_seed0", "qlstm_9m_seed0"]
    # with fewer than 3 classes there is no middle one: no class gets extra seeds
    assert len(compare.grid(entries, ["1m", "3m"], seeds=1, middle_seeds=2)) == 4


FAKE_TRAIN = """
import json, sys
from pathlib import Path
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
run = Path(args["--out_dir"]) / args["--run_name"]
run.mkdir(parents=True, exist_ok=True)
with open(run.parent.parent / "calls.txt", "a") as f:
    f.write(args["--run_name"] + " " + args["--resume"] + "\\n")
if args["--run_name"] == STOP_AT:
    sys.exit(EXIT_UNFINISHED)
(run / "results.json").write_text("{}")
"""


def fake_grid(compare, tmp_path, monkeypatch, stop_at):
    script = tmp_path / "fake_train.py"
    script.write_text(f"STOP_AT = {stop_at!r}\nEXIT_UNFINISHED = {compare.EXIT_UNFINISHED}\n" + FAKE_TRAIN)
    monkeypatch.setattr(compare, "train_command", lambda run, out, common, plan_json=None: [
        sys.executable, str(script), "--out_dir", str(out / "runs"), "--run_name", run.name, "--resume", "auto"])
    entries = [compare.Entry.parse("gpt"), compare.Entry.parse("qlstm")]
    runs = compare.grid(entries, ["1m", "2m"], seeds=1, middle_seeds=1)
    plans = {f"{e.name}_{c}": {"expected_train_seconds": 1.0} for e in entries for c in ("1m", "2m")}
    return runs, plans


def test_a_stopped_grid_continues_where_it_stopped_and_skips_finished_runs(compare, tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "runs" / "gpt_1m_seed0").mkdir(parents=True)  # finished before: never started again
    (out / "runs" / "gpt_1m_seed0" / "results.json").write_text("{}")
    runs, plans = fake_grid(compare, tmp_path, monkeypatch, stop_at="gpt_2m_seed0")
    assert compare.train_grid(runs, plans, out, []) is False  # the run exited unfinished: the grid stops there
    calls = (out / "calls.txt").read_text().split("\n")
    assert calls[:-1] == ["qlstm_1m_seed0 auto", "gpt_2m_seed0 auto"]
    runs, plans = fake_grid(compare, tmp_path, monkeypatch, stop_at=None)
    assert compare.train_grid(runs, plans, out, []) is True
    calls = (out / "calls.txt").read_text().split("\n")[:-1]
    # the stopped run is started again with --resume auto (train.py continues it from its checkpoint)
    assert calls[2:] == ["gpt_2m_seed0 auto", "qlstm_2m_seed0 auto"]


def record(project, klass, seed, ppl, hours, ood=None, flags=None):
    """A results.json as train.py writes it, reduced to what the comparison reads."""
    evaluation = {split: {"normalised_perplexity": ood or ppl + 1, "normalised_perplexity_chars": ppl * 1.1,
                          "scored_tokens": 1000} for split in ("ood_holmes", "ood_oz", "ood_french")}
    evaluation["test"] = {"normalised_perplexity": ppl, "normalised_perplexity_chars": ppl * 1.1,
                          "scored_tokens": 1000}
    return {"project": project, "model_flags": flags, "compute_class": klass, "reference_hardware": "cpu",
            "dataset_fingerprint": "abc", "dataset_name": "books", "model_config": {"vocab_size": 16384},
            "tokenizer_fingerprint": "t", "train_config": {"seed": seed, "eval_max_batches": 8},
            "accelerator_seconds": hours * 3600, "accelerator_hours": hours, "total_flops": hours * 1e15,
            "parameters": 1000, "tokens_seen": 5000, "steps": 10, "tokens_per_second": 2000.0,
            "throughput_row": {"source": "measured", "hardware": "cpu"}, "eval": {"fast": evaluation}}


def write_runs(root, runs):
    for name, content in runs.items():
        (root / name).mkdir(parents=True)
        (root / name / "results.json").write_text(json.dumps(content))


def test_time_left_counts_the_runs_after_an_overrunning_one(compare):
    # three runs of 100 s expected; the first is at 30 s, then at 250 s (overrunning): 270 s, then the other two
    assert compare.seconds_left(300, 100, 30) == 270
    assert compare.seconds_left(300, 100, 250) == 200


def test_within_noise_unless_the_gap_passes_the_seed_spread(compare, tmp_path):
    # at 2m: gpt 4.0/4.2 (spread 0.2), qlstm 4.3/4.35 (gap 0.225 of means > 0.2): gpt leads; at 1m with one seed
    # each the spread measured at 2m is the band: gpt 5.0 and qlstm 5.1 are within noise
    write_runs(tmp_path, {
        "gpt_2m_seed0": record("gpt", "2m", 0, 4.0, 0.03), "gpt_2m_seed1": record("gpt", "2m", 1, 4.2, 0.03),
        "qlstm_2m_seed0": record("qlstm", "2m", 0, 4.3, 0.03), "qlstm_2m_seed1": record("qlstm", "2m", 1, 4.35, 0.03),
        "gpt_1m_seed0": record("gpt", "1m", 0, 5.0, 0.017), "qlstm_1m_seed0": record("qlstm", "1m", 0, 5.1, 0.017),
    })
    results = compare.collect([tmp_path])
    test = compare.cells(results, "fast", "test")
    assert test[("gpt", "2m")].mean == pytest.approx(4.1) and test[("gpt", "2m")].spread == pytest.approx(0.2)
    assert "**gpt** leads" in compare.verdict("2m", test)
    assert "within noise of qlstm" in compare.verdict("1m", test)
    # a second seed that brings qlstm within 0.2: within noise at 2m too
    write_runs(tmp_path / "more", {"qlstm_2m_seed2": record("qlstm", "2m", 2, 3.95, 0.03)})
    test = compare.cells(compare.collect([tmp_path]), "fast", "test")
    assert "within noise" in compare.verdict("2m", test)


def test_a_spread_taken_from_another_class_is_relative_to_the_mean(compare, tmp_path):
    # hebbian diverges: 2m seeds 400 and 600 (spread 200, 40% of the mean); at 1m, one seed, 100 against gpt's 5.0:
    # its band is 40% of 100 = 40, so the gap of 95 is no tie (200 borrowed as it is would make it one)
    write_runs(tmp_path, {
        "gpt_2m_seed0": record("gpt", "2m", 0, 4.0, 0.03), "gpt_2m_seed1": record("gpt", "2m", 1, 4.2, 0.03),
        "hebbian_2m_seed0": record("gpt", "2m", 0, 400.0, 0.03),
        "hebbian_2m_seed1": record("gpt", "2m", 1, 600.0, 0.03),
        "gpt_1m_seed0": record("gpt", "1m", 0, 5.0, 0.017), "hebbian_1m_seed0": record("gpt", "1m", 0, 100.0, 0.017),
    })
    test = compare.cells(compare.collect([tmp_path]), "fast", "test")
    band, source = compare.noise(test[("hebbian", "1m")], test)
    assert band == pytest.approx(40.0) and source == "its seeds at another class, relative"
    assert "**gpt** leads" in compare.verdict("1m", test)


def test_a_diverged_entry_is_left_out_of_the_plots_and_said_so(compare, tmp_path):
    # medians: 1m 5.1 (5.0, 5.1, 60.0), 2m 4.3: hebbian's 60.0 is over 10 x 5.1, qlstm's 4.3 and gpt's are not
    write_runs(tmp_path, {"gpt_1m_seed0": record("gpt", "1m", 0, 5.0, 0.017),
                          "qlstm_1m_seed0": record("qlstm", "1m", 0, 5.1, 0.017),
                          "hebbian_1m_seed0": record("gpt", "1m", 0, 60.0, 0.017),
                          "gpt_2m_seed0": record("gpt", "2m", 0, 4.2, 0.03),
                          "qlstm_2m_seed0": record("qlstm", "2m", 0, 4.3, 0.03),
                          "hebbian_2m_seed0": record("gpt", "2m", 0, 30.0, 0.03)})
    test = compare.cells(compare.collect([tmp_path]), "fast", "test")
    assert compare.off_scale(test) == ["hebbian"]


def test_one_seed_everywhere_names_no_winner(compare, tmp_path):
    write_runs(tmp_path, {"gpt_1m_seed0": record("gpt", "1m", 0, 5.0, 0.017),
                          "qlstm_1m_seed0": record("qlstm", "1m", 0, 6.0, 0.017)})
    test = compare.cells(compare.collect([tmp_path]), "fast", "test")
    assert "no winner can be named" in compare.verdict("1m", test)


def test_a_class_scored_on_two_samples_is_refused_with_the_runs_named(compare, tmp_path):
    # qlstm's ood_oz at 1m was scored on more tokens than gpt's (another commit's, or its own speed's, sample)
    other = record("qlstm", "1m", 0, 5.5, 1 / 60)
    other["eval"]["fast"]["ood_oz"]["scored_tokens"] = 1400
    write_runs(tmp_path / "runs", {"gpt_1m_seed0": record("gpt", "1m", 0, 5.0, 1 / 60), "qlstm_1m_seed0": other,
                                   "gpt_3m_seed0": record("gpt", "3m", 0, 4.0, 3 / 60)})
    with pytest.raises(SystemExit, match=r"At 1m .* samples of ood_oz .* 1,000 tokens scored by gpt_1m_seed0; "
                                         r"1,400 tokens scored by qlstm_1m_seed0\. .*--eval_max_batches N"):
        compare.main(["--collect", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "leaderboard.md").exists()


def test_each_class_on_its_own_sample_is_allowed_and_said(compare, tmp_path):
    runs = [compare.Result("gpt", k, 0, tmp_path, record("gpt", k, 0, 5.0, 1 / 60)) for k in ("1m", "3m")]
    runs[1].record["eval"]["fast"]["test"]["scored_tokens"] = 3000
    assert "1m 1,000, 3m 3,000). The classes' samples differ" in compare.sample_sentence(runs, "fast", ["1m", "3m"])


def test_collect_on_runs_made_by_hand_writes_every_output(compare, tmp_path):
    runs = tmp_path / "anywhere"
    write_runs(runs, {
        "gpt_1m_seed0": record("gpt", "1m", 0, 5.0, 1 / 60),
        "gpt_3m_seed0": record("gpt", "3m", 0, 4.0, 3 / 60),
        "my_own_name": record("qlstm", "1m", 0, 5.5, 1 / 60, flags="--d_model 64"),  # not a compare.py name
        "qlstm_3m_seed0": record("qlstm", "3m", 0, 4.5, 3 / 60),
        "other_data": {**record("gpt", "3m", 0, 1.0, 3 / 60), "dataset_fingerprint": "zzz"},
        "max_steps": {**record("gpt", "3m", 0, 1.0, 3 / 60), "compute_class": None},
    })
    out = tmp_path / "out"
    compare.main(["--collect", str(runs), "--out", str(out)])
    rows = (out / "leaderboard.csv").read_text().splitlines()
    assert rows[0].startswith("entry,project,compute_class,seeds,test_ppl")
    entries = sorted(row.split(",")[0] for row in rows[1:])
    # the run of other data is left out, as is the --max_steps run; the hand-named run keeps its model flags
    assert entries == ["gpt", "gpt", "qlstm", "qlstm --d_model 64"]
    text = (out / "leaderboard.md").read_text()
    assert "| 1m | gpt | 1 | 5.0000 |" in text and "Who leads at each class" in text
    assert "tokens of test scored: 1m 1,000, 3m 1,000)." in text and "samples differ" not in text
    fits = (out / "fits.txt").read_text()
    assert "-0.9102" in fits  # gpt: 5.0 -> 4.0 from 1m to 3m, a slope of -1 / ln 3
    assert (out / "scale.png").stat().st_size > 0 and (out / "commands.sh").is_file()
    # a second command on the folder keeps the first and what was written by hand, and counts the runs anew
    with (out / "commands.sh").open("a") as f:
        f.write("# evaluated again by hand\n")
    compare.main(["--collect", str(runs), "--out", str(out), "--mode", "fast"])
    lines = (out / "commands.sh").read_text().splitlines()
    assert [line for line in lines if line.startswith("python")] == [
        f"python scripts/compare.py --collect {runs} --out {out}",
        f"python scripts/compare.py --collect {runs} --out {out} --mode fast"]
    assert "# evaluated again by hand" in lines and sum(line.startswith("# Its 4 runs") for line in lines) == 1


def test_two_tiny_entries_end_to_end_on_the_default_corpus(compare, tmp_path, default_corpus_root):
    tiny = ["--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16"]
    entries = ["gpt", "gpt+deeper=gpt " + " ".join(tiny[:2] + ["--n_layers", "2"] + tiny[4:])]
    common = [*TINY, "--data_root", str(default_corpus_root), "--tokens_per_second", "1024"]
    out = tmp_path / "comparison"
    argv = ["--entries", *entries, "--classes", "1s", "2s", "--out", str(out)]
    compare.main([*argv, "--dry_run", "--", *common])
    assert not (out / "runs").exists() or not list((out / "runs").glob("*/results.json"))
    assert "gpt+deeper_2s_seed0" in (out / "plans.csv").read_text()
    compare.main([*argv, "--", *common])
    rows = (out / "leaderboard.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    first = {r.split(",")[0] + "_" + r.split(",")[2] for r in rows[1:]}
    assert first == {"gpt_1s", "gpt_2s", "gpt+deeper_1s", "gpt+deeper_2s"}
    assert "compare.py" in (out / "commands.sh").read_text() and (out / "curves.png").is_file()
    runs = sorted(p.parent.name for p in (out / "runs").glob("*/results.json"))
    assert runs == ["gpt+deeper_1s_seed0", "gpt+deeper_2s_seed0", "gpt_1s_seed0", "gpt_2s_seed0"]
    # 1 s of 1,024 tokens/s at batch 4 x 32: 8 steps
    assert json.loads((out / "runs" / "gpt_1s_seed0" / "results.json").read_text())["steps"] == 8
