"""projects/neural_bloom/bench.py end to end at toy sizes on a small book folder written here (no ../shared)."""
import json

import pytest

from projects.neural_bloom import bench, classical

TOY = ["--max_len", "8", "--channels", "8", "--z_dim", "16", "--nbf_sizes", "4x2", "--test_sets", "2",
       "--negatives", "400", "--timing", "false"]


def test_database_space_table(books, tmp_path, capsys, single_thread):
    out = tmp_path / "results.json"
    bench.main(["--task", "database", "--books", str(books), "--set_size", "20", "--minutes", "0.03",
                "--out", str(out)] + TOY)
    printed = capsys.readouterr().out
    for row in ("Neural Bloom Filter (+ backup)", "Bloom filter (analytic, optimal)", "Bloom filter (real)",
                "Cuckoo filter (thesis formula)", "Cuckoo filter (real)", "LSTM 16 (+ backup)", "MemNet 2 (+ backup)",
                "Bloom (analytic) / NBF", "thesis Table 5.1", "1,000 unique words", "500 held out"):
        assert row in printed
    results = json.loads(out.read_text())
    sizes = results["sizes"]["20"]
    assert set(sizes["neural"]) == {"NBF 4x2", "LSTM 16", "MemNet 2"}
    for alpha in ("0.05", "0.01", "0.001"):
        nbf = sizes["neural"]["NBF 4x2"][alpha]
        assert nbf["state_bits"] == 4 * 2 * 32 and nbf["negatives"] == 400
        assert nbf["total_bits"] == pytest.approx(256 + nbf["backup_bits"])
        assert sizes["neural"]["MemNet 2"][alpha]["state_bits"] == 20 * 2 * 32
        assert sizes["classical"]["Bloom filter (real)"][alpha]["bits"] == pytest.approx(
            classical.bloom_bits(20, float(alpha)), abs=1)


def test_nbf_steps_trains_for_that_many_steps_whatever_the_time(books, capsys, single_thread):
    results = bench.main(["--task", "database", "--books", str(books), "--set_size", "20", "--minutes", "0.0001",
                          "--nbf_steps", "7", "--lstm", "false", "--memnet", "false"] + TOY)
    assert results["training"]["NBF 4x2"]["steps"] == 7  # 6 ms of --minutes would have stopped it before
    assert "each NBF for 7 steps" in capsys.readouterr().out


def test_extrapolation_plot_and_class_task(books, tmp_path, capsys, single_thread):
    plot = tmp_path / "extrapolation.png"
    bench.main(["--task", "extrapolation", "--books", str(books), "--minutes", "0.02", "--eval_sizes", "10,30",
                "--lstm", "false", "--plot", str(plot)] + TOY)
    assert plot.stat().st_size > 0
    assert "sets of 2..200" in capsys.readouterr().out
    bench.main(["--task", "class", "--per_class", "40", "--set_size", "8", "--minutes", "0.02", "--memnet", "false",
                "--rates", "0.01"] + TOY)
    assert "sets of 8: false-positive rates over 400 negative queries" in capsys.readouterr().out


def test_timing_table(capsys, single_thread):
    results = bench.main(["--task", "timing", "--timing_batch", "40", "--key_len", "12", "--timing_repeats", "1",
                          "--nbf_sizes", "4x2", "--channels", "8", "--z_dim", "16", "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "thesis Table 5.2" in printed
    names = [row["name"] for row in results["timing"]["rows"]]
    assert names == ["Bloom filter (real)", "Cuckoo filter (real)", "Neural Bloom Filter 4x2", "LSTM 16"]
    assert all(row["query_per_s"] > 0 and row["insert_per_s"] > 0 for row in results["timing"]["rows"])


@pytest.mark.parametrize("argv, message", [
    (["--nbf_sizes", "16"], "SLOTSxWORD"),
    (["--rates", "0.01,2"], "false-positive rates"),
    (["--task", "database", "--plot", "x.png"], "extrapolation"),
    (["--nbf_steps", "-1"], "--nbf_steps"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err
