"""scripts/bench_moe.py runs and prints the dense row and one row per number of experts (CPU: the loop only)."""
import importlib.util

from languini.experiment import REPO_ROOT


def test_bench_prints_a_row_per_layer(capsys, single_thread):
    spec = importlib.util.spec_from_file_location("bench_moe", REPO_ROOT / "scripts" / "bench_moe.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--d_model", "16", "--tokens", "64", "--experts", "2,4", "--steps", "1", "--warmup", "0"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith(("dense", "Switch"))]
    assert [row.split()[0] for row in rows] == ["dense", "Switch,", "Switch,"]
    assert [row.split()[-3] for row in rows[1:]] == ["2", "4"]
