"""projects/qlstm/bench_cells.py prints one row per recurrence implementation."""
from projects.qlstm import bench_cells


def test_bench_prints_one_row_per_implementation(capsys):
    bench_cells.main(["--device", "cpu", "--d_model", "8", "--n_layers", "1", "--batch", "1", "--seq_len", "5",
                "--heads", "2x4", "--block_lens", "1,2", "--steps", "1", "--warmup", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [line.split(" | ") for line in lines[3:]]
    assert [(r[0], r[3], r[4]) for r in rows] == [
        ("LSTM", "-", "loop"), ("qLSTM", "-", "loop"), ("qLSTM", "1", "block"), ("qLSTM", "2", "block"),
        ("qLSTM", "-", "triton"),
    ]
    assert all(float(r[5].replace(",", "")) > 0 for r in rows)
