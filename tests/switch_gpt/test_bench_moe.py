"""projects/switch_gpt/bench_moe.py runs and prints the dense row and one row per number of experts (CPU: the
loop only)."""
from projects.switch_gpt import bench_moe


def test_bench_prints_a_row_per_layer(capsys, single_thread):
    bench_moe.main(["--d_model", "16", "--tokens", "64", "--experts", "2,4", "--steps", "1", "--warmup", "0"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith(("dense", "Switch"))]
    assert [row.split()[0] for row in rows] == ["dense", "Switch,", "Switch,"]
    assert [row.split()[-3] for row in rows[1:]] == ["2", "4"]
