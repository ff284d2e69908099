"""Every Triton kernel the projects launch compiles for a Hopper GPU (sm_90), which needs no GPU.

The interpreter that runs the kernel tests on CPU accepts programs the compiler rejects (a kernel reading a
plain Python global, for one), so this compiles the launches the projects really make down to a cubin.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"

# The kernels each project's entry points launch, listed by hand so that a launch the recording misses fails.
KERNELS = {
    "lram_gpt": {"lram_lookup_fwd_kernel", "lram_lookup_bwd_kernel", "lram_lookup_segment_sum_kernel"},
    "pkm_gpt": {"pkm_bag_fwd_kernel", "pkm_bag_weight_grad_kernel", "pkm_bag_value_grad_atomic_kernel",
                "pkm_bag_value_grad_segment_kernel"},
    "qlstm": {"qlstm_scan_fwd_kernel", "qlstm_scan_bwd_kernel"},
}


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build has no NVIDIA backend with ptxas")
@pytest.mark.parametrize("project", sorted(KERNELS))
def test_kernels_compile_for_sm90(project, tmp_path):
    table = tmp_path / "compiled.csv"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")  # compile afresh, not from an earlier run's cache
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_kernels.py"), "--project", project,
                             "--arch", "90", "--csv", str(table)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(table) as file:
        rows = list(csv.DictReader(file))
    assert {row["kernel"] for row in rows} == KERNELS[project]
    assert all(not row["error"] and int(row["reg"]) > 0 for row in rows), rows
    assert all(int(row["local"]) == 0 for row in rows), "registers spill to local memory: " + str(rows)
