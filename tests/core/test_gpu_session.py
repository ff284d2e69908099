"""scripts/gpu_session.sh on the CPU: its plan fits the device tool's calls, and a dry run of both calls builds
every command and has each script parse its flags (GPU minutes are never spent on a typo)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "scripts" / "gpu_session.sh"


def session(*args, **env):
    return subprocess.run(["bash", str(SESSION), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_plan_fits_each_call_in_nine_minutes():
    result = session("--plan", "call1", "call2", "call3")
    assert result.returncode == 0, result.stdout + result.stderr
    sums = dict(line.split(": timeouts sum to ") for line in result.stdout.splitlines() if "timeouts sum to" in line
                and line.startswith("call"))
    assert set(sums) == {"call1", "call2", "call3"}
    assert all(int(total.rstrip("s")) <= 540 for total in sums.values()), sums


def test_unknown_step_is_refused():
    result = session("--plan", "no_such_step")
    assert result.returncode == 2 and "unknown step or group 'no_such_step'" in result.stderr


def test_dry_run_of_both_calls_checks_every_command(tmp_path):
    base = ROOT / ".base" / "0255b19"  # the LRAM step also needs the base tree; a stand-in with the script
    stand_in = tmp_path / "base"
    (stand_in / "scripts").mkdir(parents=True)
    (stand_in / "scripts" / "profile_memory_layer.py").write_text((ROOT / "scripts" / "profile_memory_layer.py")
                                                                  .read_text())
    result = session("--dry_run", "--pack", "dry", "call1", "call2", OUT=str(tmp_path / "out"),
                     LRAM_BASE_TREE=str(base if base.is_dir() else stand_in))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = subprocess.run(["tar", "xzOf", str(tmp_path / "out" / "dry.tgz"), "./summary.tsv"],
                             capture_output=True, text=True, check=True).stdout
    steps = [line.split("\t") for line in summary.splitlines()[1:]]
    assert len(steps) == 7 and all(rc == "0" for _, rc, *_ in steps), summary


@pytest.mark.parametrize("flags, ok", [(["gpt", "small", "--sweep", "--min_batch_size", "16"], True),
                                       (["gpt", "small", "--sweep", "--min_batch_sise", "16"], False)])
def test_check_flags_stops_after_parsing(flags, ok):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_flags.py"),
                             str(ROOT / "scripts" / "measure_throughput.py"), *flags],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    if not ok:
        assert "unrecognized arguments: --min_batch_sise" in result.stderr
