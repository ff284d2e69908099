"""The cost benchmark (bench_cost.py): SAM's memory for training over 1,000 steps does not grow with N (thesis
3.2.6, Figure 3.3b), and the script prints its table."""
import pytest

from projects.sam import bench_cost

TINY = {"hidden": 16, "heads": 1, "word_size": 8, "k": 2}


@pytest.mark.skipif(not bench_cost.Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
def test_peak_memory_of_a_1000_step_sequence_does_not_grow_with_the_memory():
    """N = 2^8 and 2^14 words: 1,000 steps of forward and backward add the same few MiB, although a dense or
    copying implementation would keep 1,000 x N x W x 4 bytes = 500 MiB more at the larger N."""
    small = bench_cost.measure("sam", 2 ** 8, "memory", 1, 1000, **TINY)["peak_mib"]
    large = bench_cost.measure("sam", 2 ** 14, "memory", 1, 1000, **TINY)["peak_mib"]
    assert 0 < small < 64 and 0 < large < 64
    # the step's temporaries over all N words (scores, norms: a few x 16384 x 4 bytes) are the only difference
    assert abs(large - small) < 4, (small, large)


def test_the_script_prints_a_table(tmp_path, capsys):
    bench_cost.main(["--words", "6", "--kinds", "sam", "--repeats", "1", "--warmup", "0", "--no_memory",
                     "--csv", str(tmp_path / "cost.csv"), "--plot", str(tmp_path / "cost.png")])
    out = capsys.readouterr().out
    assert "ms per forward + backward step" in out and "2^6" in out
    assert (tmp_path / "cost.png").exists() and "sam,64," in (tmp_path / "cost.csv").read_text()
    rows = bench_cost.read_csv(tmp_path / "cost.csv")
    assert rows[0]["kind"] == "sam" and rows[0]["words"] == 64 and rows[0]["ms_per_step"] > 0
    bench_cost.main(["--from_csv", str(tmp_path / "cost.csv"), "--plot", str(tmp_path / "again.png")])
    assert (tmp_path / "again.png").exists()
