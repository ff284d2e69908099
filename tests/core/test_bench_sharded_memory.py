"""scripts/bench_sharded_memory.py on 2 processes (gloo), tiny sizes: one row per layer, and the bytes it counts
from the collectives equal the formulas of languini/README.md (its own formula_bytes, and a hand count here).
No timing is asserted."""
import csv
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "scripts"))  # the spawned processes import the script's worker by its name
    spec = importlib.util.spec_from_file_location("bench_sharded_memory", REPO / "scripts" / "bench_sharded_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    sys.path.remove(str(REPO / "scripts"))


def test_two_processes_send_the_bytes_of_the_formulas(bench, tmp_path):
    rows = bench.main(["--device", "cpu", "--ranks", "2", "--width", "64", "--tokens", "16", "--lram_memory", "2^10",
                       "--pkm_keys", "32", "--repeats", "1", "--warmup", "1", "--out", str(tmp_path)])
    lram, pkm = rows
    # LRAM, width 64: 4 heads of 32 reads of 64 values; the other process gets each pair (8 bytes) and returns
    # half of each head's 64 columns (4 bytes each); the backward returns the column gradients and those of the
    # weights (4 bytes per pair). The counts (8 bytes per all-to-all) come on top, over 16 tokens.
    assert lram["fwd_bytes_per_token"] == pytest.approx(4 * (8 * 32 + 4 * 32), abs=2)
    assert lram["fwd_bwd_bytes_per_token"] == pytest.approx(4 * (12 * 32 + 8 * 32), abs=2)
    # PKM, width 64: one bag of 8 heads x 32 reads of 64 values
    assert pkm["fwd_bytes_per_token"] == pytest.approx(8 * 256 + 4 * 32, abs=2)
    for row in rows:
        assert row["fwd_bytes_per_token"] == pytest.approx(row["fwd_bytes_formula"], abs=2)
        assert row["fwd_bwd_bytes_per_token"] == pytest.approx(row["fwd_bwd_bytes_formula"], abs=2)
        assert row["ranks"] == 2 and row["fwd_us_per_token"] > 0
    assert lram["table_mib_per_process"] == 16 * 2 ** 10 * 32 / 2 ** 20  # half of 64 columns
    with open(tmp_path / "sharded_memory_cpu.csv") as f:
        assert [r["layer"] for r in csv.DictReader(f)] == ["LRAM", "PKM"]
