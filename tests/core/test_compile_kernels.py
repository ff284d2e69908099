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

sys.path.insert(0, str(ROOT / "scripts"))
import compile_kernels  # noqa: E402  (a script, not a package)


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build has no NVIDIA backend with ptxas")
@pytest.mark.parametrize("project", compile_kernels.PROJECTS)
def test_kernels_compile_for_sm90(project, tmp_path):
    table = tmp_path / "compiled.csv"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")  # compile afresh, not from an earlier run's cache
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_kernels.py"), "--project", project,
                             "--arch", "90", "--csv", str(table)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(table) as file:
        rows = list(csv.DictReader(file))
    # every kernel defined in the project's ops/ is launched by its scenarios, so none goes uncompiled
    assert {row["kernel"] for row in rows} == compile_kernels.project_kernels(project)
    assert all(not row["error"] and int(row["reg"]) > 0 for row in rows), rows
    assert all(int(row["local"]) == 0 for row in rows), "registers spill to local memory: " + str(rows)
