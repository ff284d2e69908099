"""scripts/report_memory_layers.py on hand-made CSVs: the facts it prints against ratios computed by hand, CSVs
of older benchmark versions (fewer columns), bad input, and the command line writing the report and the plot."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
META = "NVIDIA H100 80GB HBM3,2026-11-23T09:18:55,2.11.0,3.6.0,bf16,8192,5,2,python scripts/bench_memory_layers.py"
HEADER = ("device,date,torch,triton,precision,tokens,repeats,warmup,command,hbm_spec_gbps,layer,width,memory,"
          "params,target,status,fwd_us_per_token,fwd_bwd_us_per_token,lookup_gbps")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("report_memory_layers", REPO / "scripts" / "report_memory_layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def write_csv(path, rows):
    """rows: (layer, width, memory, params, target, fwd µs, fwd+bwd µs, lookup GB/s); spec HBM 3350 GB/s."""
    lines = [HEADER] + [f"{META},3350," + ",".join(str(c) for c in row[:4]) + f",{row[4]},ok," +
                        ",".join(str(c) for c in row[5:]) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


# Hand-made numbers (µs per token) and what they give:
# w=512:  PKM / LRAM at 2^24: forward 0.66 / 0.55 = 1.20, forward + backward 3.6 / 1.2 = 3.00;
#         at 2^28: 1.5 / 0.6 = 2.50 and 7.5 / 1.5 = 5.00.
#         PEER / LRAM at 2^24: 1.1 / 0.55 = 2.00, 2.4 / 1.2 = 2.00; against the dense MLP (0.04, 0.1) at 2^24:
#         LRAM 0.55 / 0.04 = 13.75, 1.2 / 0.1 = 12.00; PKM 16.50, 36.00; PEER 27.50, 24.00.
#         UltraMemV2 / LRAM at 2^24: 0.88 / 0.55 = 1.60, 3.0 / 1.2 = 2.50; against the dense MLP 22.00, 30.00.
#         LRAM over the targets 2^20, 2^24, 2^28 (2^30 lies outside 2^16..2^28): 0.60 / 0.50 = 1.20
#         (with 2^30's 0.8 it would be 1.60); largest memory (2^30) reads 670 GB/s = 0.20 of 3350.
#         dense / slowest LRAM (every size, 2^30's too): 0.04 / 0.8 = 0.05.
# w=4096: dense / LRAM 4.0 / 2.0 = 2.00; w=8192: 16 / 3.2 = 5.00: LRAM faster from 4096 on.
# crossover at w=8192: F = 16 * 8192^2 / 16e-6 s = 6.71e13 FLOP/s (67.1 TFLOP/s), c = 3.2e-6 / 8192 = 0.391 ns,
#         w* = c F / 16 = 3.2 * 8192 / 16 = 1638.4.
ROWS = [
    ("dense MLP", 512, "-", 2**21, "", 0.04, 0.1, ""),
    ("LRAM", 512, "N=2^14", 2**20, 2**20, 0.50, 1.0, 1000),
    ("LRAM", 512, "N=2^18", 2**24, 2**24, 0.55, 1.2, 1000),
    ("LRAM", 512, "N=2^22", 2**28, 2**28, 0.60, 1.5, 900),
    ("LRAM", 512, "N=2^24", 2**30, 2**30, 0.80, 2.0, 670),
    ("PKM", 512, "n_keys=179", 2**24, 2**24, 0.66, 3.6, ""),
    ("PKM", 512, "n_keys=723", 2**28, 2**28, 1.5, 7.5, ""),
    ("PEER", 512, "n_keys=128", 2**24, 2**24, 1.1, 2.4, ""),
    ("UltraMemV2", 512, "n_keys=256", 2**24, 2**24, 0.88, 3.0, ""),
    ("dense MLP", 4096, "-", 2**27, "", 4.0, 12, ""),
    ("LRAM", 4096, "N=2^21", 2**28, 2**28, 2.0, 6, ""),
    ("dense MLP", 8192, "-", 2**29, "", 16.0, 48, ""),
    ("LRAM", 8192, "N=2^8", 2**28, 2**28, 3.2, 9, ""),
]


def test_facts_match_hand_computed_ratios(report, tmp_path):
    run = report.read_csv(write_csv(tmp_path / "hand.csv", ROWS))
    assert run.hbm_gbps == 3350 and run.meta["precision"] == "bf16" and len(run.results) == len(ROWS)
    assert run.results[1].fwd == pytest.approx(0.5e-6) and run.results[1].lookup_no_torus is None
    lines = report.facts(run.results, run.hbm_gbps)
    pkm_24, peer_24, ultramem_24, lram_dense_24, pkm_dense_24, peer_dense_24, ultramem_dense_24 = lines[:7]
    pkm_28, peer_28, ultramem_28 = lines[7:10]
    flat, hbm, dense, beaten, crossover = lines[14:]
    assert pkm_24.startswith("- PKM / LRAM time at 2^24.0")
    assert pkm_24.endswith("2^24.0 parameters: w=512: forward 1.20 (0.66 vs 0.55 µs), "
                           "forward + backward 3.00 (3.6 vs 1.2 µs)")
    assert "forward 2.50 (1.5 vs 0.6 µs), forward + backward 5.00 (7.5 vs 1.5 µs)" in pkm_28
    assert "w=4096" not in pkm_28  # no PKM measured there
    assert peer_24.startswith("- PEER / LRAM time at 2^24.0")
    assert peer_24.endswith("w=512: forward 2.00 (1.1 vs 0.55 µs), forward + backward 2.00 (2.4 vs 1.2 µs)")
    assert peer_28.endswith("2^28.0 parameters: -")  # no PEER at 2^28
    assert ultramem_24.startswith("- UltraMemV2 / LRAM time at 2^24.0")
    assert ultramem_24.endswith("w=512: forward 1.60 (0.88 vs 0.55 µs), forward + backward 2.50 (3 vs 1.2 µs)")
    assert ultramem_28.endswith("2^28.0 parameters: -")
    assert lram_dense_24.startswith("- LRAM / dense MLP time at 2^24.0")
    assert lram_dense_24.endswith("w=512: forward 13.75 (0.55 vs 0.04 µs), forward + backward 12.00 (1.2 vs 0.1 µs)")
    assert pkm_dense_24.endswith("forward 16.50 (0.66 vs 0.04 µs), forward + backward 36.00 (3.6 vs 0.1 µs)")
    assert peer_dense_24.endswith("forward 27.50 (1.1 vs 0.04 µs), forward + backward 24.00 (2.4 vs 0.1 µs)")
    assert ultramem_dense_24.endswith("forward 22.00 (0.88 vs 0.04 µs), forward + backward 30.00 (3 vs 0.1 µs)")
    assert flat.endswith("w=512 (3 sizes, 2^20.0..2^28.0): 1.20")  # one size at 4096 and 8192: no ratio
    assert hbm.endswith("w=512 N=2^24: 0.20 (670 of 3350 GB/s)")
    assert dense.endswith("w=512: 0.05 (0.04 vs 0.8 µs); w=4096: 2.00 (4 vs 2 µs); w=8192: 5.00 (16 vs 3.2 µs)")
    assert beaten.endswith("from width 4096 on, of the widths measured")
    assert "67.1 TFLOP/s" in crossover and "0.391 ns" in crossover and crossover.endswith("= 1,638")


def test_facts_at_other_sizes_and_where_lram_loses_again(report, tmp_path):
    rows = [row for row in ROWS if row[1] != 8192] + [("dense MLP", 8192, "-", 2**29, "", 2.0, 6, ""),
                                                        ("LRAM", 8192, "N=2^8", 2**28, 2**28, 3.2, 9, "")]
    run = report.read_csv(write_csv(tmp_path / "hand.csv", rows))
    lines = report.facts(run.results, run.hbm_gbps, ratios_at=[2**20], flat_range=(2**16, 2**30))
    assert lines[0].endswith("2^20.0 parameters: -")  # no PKM at 2^20
    assert lines[7].endswith("w=512 (4 sizes, 2^20.0..2^30.0): 1.60")  # 0.8 / 0.5
    assert lines[10].endswith("at no width measured")  # faster at 4096, slower at 8192 (2.0 / 3.2)


def test_report_has_tables_notes_and_no_verdicts(report, tmp_path):
    lines = report.report(report.read_csv(write_csv(tmp_path / "hand.csv", ROWS)), extra_notes=["a note"])
    text = "\n".join(lines)
    assert lines[0] == "# NVIDIA H100 80GB HBM3, bf16, torch 2.11.0, triton 3.6.0, 2026-11-23T09:18:55"
    assert "fewer runs than the paper's median of 15" in text and "- a note" in text
    table_4 = [line.split() for line in lines[lines.index("Forward time per token by width (the layout of the "
                                                         "paper's Table 4):") + 1:][:4]]
    assert table_4[1:] == [["512", "0.04", "0.5", "0.8", "4"], ["4096", "4", "2", "2", "1"],
                           ["8192", "16", "3.2", "3.2", "1"]]
    assert not any(mark in text for mark in ("[x]", "[ ]", "[?]", "goal met", "missed"))


def test_bad_input_is_refused(report, tmp_path):
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="no column layer"):
        report.read_csv(tmp_path / "other.csv")
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "missing.csv")])
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "other.csv"), "--flat_range", "2^28"])


def test_command_line_writes_report_and_plot(report, tmp_path, capsys):
    first, second = write_csv(tmp_path / "one.csv", ROWS), write_csv(tmp_path / "two.csv", ROWS[:3])
    report.main([str(first), str(second), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert printed.count("Facts for the goals") == 2
    for name in ("one", "two"):
        assert (tmp_path / "out" / f"{name}.txt").read_text().startswith("# NVIDIA H100 80GB HBM3, bf16")
        assert (tmp_path / "out" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
