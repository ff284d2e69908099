"""scripts/bench_memory_layers.py: size choice against hand-counted parameters, parsing, and a tiny CPU run that
writes the CSV and reports it (report, PNG). No timing is asserted; the report itself is tested on hand-made CSVs
in test_report_memory_layers.py."""
import csv
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_memory_layers", REPO / "scripts" / "bench_memory_layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


# Hand counts at width 32.
# dense: 32*128 + 128 + 128*32 + 32 = 8352.
# LRAM: query 32*32 + 32, layer norm 2*32, out (2 heads * 64)*32 + 32, so 5248 + 64 N.
# PKM (8 heads, k_dim 64, v_dim 32): query 32*512 + 512, layer norm 2*512, sub-keys 8*2*n*32, values n^2*32,
#   so 17920 + 512 n + 32 n^2: n = 32 gives 67072, n = 52 gives 131072 = 2^17 exactly.
# PEER (8 heads, k_dim 128, knn 16; no biases but the query's): query 32*1024 + 1024, layer norm 2*1024, one set of
#   sub-keys 2*n*64, experts 2 * n^2 * 32, so 35840 + 128 n + 64 n^2: for 2^16, n = 20 gives 64000 (2^-0.034 off)
#   and n = 21 66752 (2^0.027); for 2^17, n = 37 gives 128192 (2^-0.032) and n = 38 133120 (2^0.022); the smallest,
#   n = knn = 16, 54272 = 2^15.73, more than half an octave above 2^15.
# UltraMemV2 (k_dim = value_dim = 32/4 = 8, rank 2; no biases): query 32*16, its norm 2*8, keys 2*2*n*8, their norm
#   2*8, core 2*2, pre-value map 32*8, pre-values and values 2 * n^2*8, output map 8*32, so 1060 + 32 n + 16 n^2:
#   for 2^15, n = 43 gives 32020 (2^-0.033) and n = 44 33444 (2^0.029); for 2^16, n = 62 64548 (2^-0.022) and
#   n = 63 66580 (2^0.023); for 2^17, n = 89 130644 (2^-0.005).
@pytest.mark.parametrize("layer, width, target, size, params", [
    ("dense", 32, None, None, 8352),
    ("lram", 32, 2**15, 2**9, 5248 + 64 * 2**9),
    ("lram", 32, 2**16, 2**10, 5248 + 64 * 2**10),
    ("pkm", 32, 2**16, 32, 67072),
    ("pkm", 32, 2**17, 52, 131072),
    ("peer", 32, 2**16, 21, 66752),
    ("peer", 32, 2**17, 38, 133120),
    ("peer", 32, None, 16, 54272),
    ("ultramem", 32, 2**15, 44, 33444),
    ("ultramem", 32, 2**16, 62, 64548),
    ("ultramem", 32, 2**17, 89, 130644),
    # w = 2048: LRAM's dense weights 2048*2048 + 2048 + 2*2048 + 8192*2048 + 2048 = 20979712, N = 256 adds 16384:
    # 2^24.32, within half an octave of 2^24
    ("lram", 2048, 2**24, 256, 20979712 + 64 * 256),
])
def test_size_choice_matches_hand_counts(bench, layer, width, target, size, params):
    if target is not None:
        assert bench.choose_size(layer, width, target) == size
    assert bench.parameter_count(layer, width, size) == params


@pytest.mark.parametrize("layer, width, target", [
    ("pkm", 32, 2**15),  # the smallest PKM (n_keys = knn = 32) has 67072 > 2^15.5 parameters
    ("peer", 32, 2**15),  # the smallest PEER (n_keys = knn = 16) has 54272 > 2^15.5
    ("lram", 4096, 2**24),  # LRAM's dense weights alone have about 5 * 4096^2 = 2^26.3
])
def test_unreachable_targets_are_refused(bench, layer, width, target):
    assert bench.choose_size(layer, width, target) is None


def test_parse_params(bench):
    assert bench.parse_params("2^20..2^23") == [2**20, 2**21, 2**22, 2**23]
    assert bench.parse_params("2^24,1000") == [1000, 2**24]
    for bad in ("3..8", "2^x", "0", "2^10..2^8"):
        with pytest.raises(Exception, match="parameter count|range|positive"):
            bench.parse_params(bad)


@pytest.mark.parametrize("name, gbps", [
    ("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H100 PCIe", 2000), ("NVIDIA H200", 4800),
    ("NVIDIA A100-SXM4-80GB", 2000), ("NVIDIA A100-PCIE-40GB", 1555), ("NVIDIA GeForce RTX 3090", 936),
    ("NVIDIA GeForce RTX 4090", 1008), ("NVIDIA GeForce RTX 3090 Ti", None), ("NVIDIA H100 NVL", None),
])
def test_hbm_spec_table(bench, name, gbps):
    assert bench.hbm_spec_gbps(name) == gbps


def test_cpu_smoke_run_writes_report_csv_and_png(bench, tmp_path, capsys):
    argv = ["--device", "cpu", "--widths", "32", "--params", "2^15..2^17", "--tokens", "8",
            "--repeats", "2", "--warmup", "1", "--out", str(tmp_path)]
    bench.main(argv)
    printed = capsys.readouterr().out
    assert "Facts for the goals" in printed and "the goals are GPU goals" in printed
    assert "PKM w=32: no memory size within a factor sqrt(2) of 2^15.0" in printed
    assert "PEER w=32: no memory size within a factor sqrt(2) of 2^15.0" in printed
    assert "- PEER / LRAM time at 2^24.0 parameters: -" in printed  # the default facts sizes; none measured

    (report,), (table,), (figure,) = (list(tmp_path.glob(f"*.{ext}")) for ext in ("txt", "csv", "png"))
    assert "fwd+bwd rev-idx" in report.read_text() and "of HBM" in report.read_text()
    assert "PKM w=32: no memory size within a factor sqrt(2) of 2^15.0" in report.read_text()
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(table.open()))
    assert {r["device"][:3] for r in rows} == {"CPU"} and {r["torch"] for r in rows} == {torch.__version__}
    assert "--widths 32" in rows[0]["command"] and rows[0]["date"]
    assert [(r["layer"], int(r["params"])) for r in rows] == [
        ("dense MLP", 8352), ("LRAM", 5248 + 64 * 2**9), ("LRAM", 5248 + 64 * 2**10), ("LRAM", 5248 + 64 * 2**11),
        ("PKM", 67072), ("PKM", 131072), ("PEER", 66752), ("PEER", 133120),
        ("UltraMemV2", 33444), ("UltraMemV2", 64548), ("UltraMemV2", 130644)]
    for r in rows:
        assert r["status"] == "ok"
        for column in ("fwd_us_per_token", "fwd_bwd_us_per_token", "step_adam_us_per_token"):
            assert float(r[column]) > 0
        assert 0 < float(r["adam_share"]) < 1
        assert r["fwd_bwd_reverse_index_us_per_token"] == ""  # the CPU runs the references: no kernel variants
        assert r["lookup_hbm_fraction"] == ""
        for column in ("lookup_gbps", "lookup_no_torus_us_per_token", "lookup_bwd_us_per_token", "lookup_bwd_gbps"):
            assert (r[column] != "") == (r["layer"] == "LRAM")
        assert (r["step_sparse_us_per_token"] != "") == (r["layer"] != "dense MLP")  # every memory has one


def test_cuda_request_without_cuda_is_refused(bench, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit):
        bench.main(["--device", "cuda", "--out", str(tmp_path)])
