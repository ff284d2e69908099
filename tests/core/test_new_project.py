"""scripts/new_project.py: `python scripts/new_project.py mygpt --op swiglu` makes a project that passes its own
tests and the model contract, starts training for `--compute_class 2m` with an empty throughput.csv, and whose
kernels compile; bad names, an unknown source and an existing project are refused with nothing written.

The scaffold runs in a copy of what a project needs (languini/, projects/gpt, the scripts, the tests' conftest.py
and the core tests that discover projects) in a temporary folder: the repository itself is never written.
"""
import ast
import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from languini.stop import EXIT_UNFINISHED
from languini.throughput import COLUMNS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import new_project  # noqa: E402  (a script, not a package)

COPIED = ["languini", "projects/__init__.py", "projects/gpt", "scripts/new_project.py", "scripts/compile_kernels.py",
          "tests/__init__.py", "tests/conftest.py", "tests/core/__init__.py", "tests/core/test_contract.py",
          "tests/core/test_throughput.py", "pyproject.toml"]


def copy_parts(root: Path, parts) -> Path:
    for part in parts:
        source, target = ROOT / part, root / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return root


def run(copy: Path, *args, **env):
    """A command in the copy, importing its own languini/ and projects/ (one thread: a shared CI machine)."""
    environment = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, *args], cwd=copy, env=environment, capture_output=True, text=True)


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    """A copy of the repository's needed parts with `python scripts/new_project.py mygpt --op swiglu` run in it."""
    copy = copy_parts(tmp_path_factory.mktemp("repository"), COPIED)
    result = run(copy, "scripts/new_project.py", "mygpt", "--op", "swiglu")
    assert result.returncode == 0, result.stdout + result.stderr
    return copy, result.stdout


def test_the_scaffold_says_what_it_wrote_and_what_to_do_next(scaffolded):
    copy, out = scaffolded
    listed = [line.strip() for line in out.splitlines() if line.startswith(("  projects/", "  tests/"))]
    written = sorted(str(p.relative_to(copy)) for folder in ("projects/mygpt", "tests/mygpt")
                     for p in (copy / folder).rglob("*") if p.is_file())
    assert sorted(listed) == written
    assert {"projects/mygpt/ops/swiglu/triton.py", "projects/mygpt/ops/__init__.py", "tests/mygpt/test_swiglu.py",
            "projects/mygpt/throughput.csv", "tests/mygpt/test_model.py"} <= set(written)
    assert "Next steps:" in out and "python projects/mygpt/train.py --compute_class 2m" in out


def test_the_name_replaces_the_sources_where_it_was_repeated(scaffolded):
    copy, _ = scaffolded
    project = copy / "projects" / "mygpt"
    assert 'main("mygpt", configs, Model)' in (project / "train.py").read_text()
    assert "Unknown mygpt config" in (project / "configs.py").read_text()
    assert (project / "README.md").read_text().startswith("# mygpt: ")
    triton_source = (project / "ops" / "swiglu" / "triton.py").read_text()
    assert '"mygpt::swiglu_forward"' in triton_source and "def mygpt_swiglu_bwd_kernel(" in triton_source
    with open(project / "throughput.csv") as file:
        assert list(csv.reader(file)) == [list(COLUMNS)]  # the header and no row: the source's rows are not its own
    for path in project.rglob("*.py"):  # projects never import each other
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m and m.startswith("projects.gpt")}, path


def test_the_project_passes_its_tests_and_the_model_contract(scaffolded):
    copy, _ = scaffolded
    result = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/mygpt", "tests/core/test_contract.py",
                 "-k", "mygpt")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    # tests/mygpt (2, and 18 of the op) and the contract's ~10 on mygpt: a -k that matched nothing would pass too
    assert int(summary.split(" passed")[0].split()[-1]) >= 20, summary


def test_the_project_trains_for_a_2m_class_without_a_throughput_row(scaffolded, default_corpus_root):
    copy, _ = scaffolded
    # The command of the README unchanged but for the data (the session's default corpus) and a stop after 2 of
    # its steps (the class's plan and schedule kept): the rest of 2 minutes would only repeat them.
    result = run(copy, "projects/mygpt/train.py", "--compute_class", "2m", "--data_root", str(default_corpus_root),
                 "--stop_at_step", "2")
    out = result.stdout + result.stderr
    assert result.returncode == EXIT_UNFINISHED, out
    assert "Timing mygpt cpu" in out  # no committed row: the cpu model is timed on this machine first
    assert "compute class            2m" in out
    [run_dir] = (copy / "runs").glob("mygpt_cpu_*_2m_*")
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    trained = [row for row in rows if row.get("event") == "train"]
    # two steps from an untrained model: about the loss of a uniform guess over the default corpus's 2048 tokens
    assert trained[-1]["step"] == 2 and abs(trained[-1]["loss"] - math.log(2048)) < 0.5, rows
    assert (run_dir / "checkpoint.pt").is_file()


def ptxas_exists() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not ptxas_exists(), reason="this Triton build has no NVIDIA backend with ptxas")
def test_the_op_skeleton_compiles_for_sm90(scaffolded, tmp_path):
    copy, _ = scaffolded
    table = tmp_path / "compiled.csv"
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment.update(PYTHONPATH=str(copy), OMP_NUM_THREADS="1", TRITON_CACHE_DIR=str(tmp_path / "triton_cache"))
    result = subprocess.run([sys.executable, "scripts/compile_kernels.py", "--project", "mygpt", "--arch", "90",
                             "--csv", str(table)], cwd=copy, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(table) as file:
        rows = list(csv.DictReader(file))
    # the forward and the backward kernel, each in fp32 and bf16, without spills
    assert sorted((row["kernel"], row["pointers"]) for row in rows) == [
        ("mygpt_swiglu_bwd_kernel", "bf16"), ("mygpt_swiglu_bwd_kernel", "fp32"),
        ("mygpt_swiglu_fwd_kernel", "bf16"), ("mygpt_swiglu_fwd_kernel", "fp32")]
    assert all(not row["error"] and int(row["local"]) == 0 for row in rows), rows


# ---- refusals, and a source with kernels of its own (in-process, nothing run)


@pytest.fixture
def small_repository(tmp_path):
    return copy_parts(tmp_path, ["projects/__init__.py", "projects/gpt", "projects/qlstm", "tests/qlstm/test_scan.py"])


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("argv,message", [
    (["1gpt"], "not a lowercase Python identifier"),
    (["My_gpt"], "not a lowercase Python identifier"),
    (["my-gpt"], "not a lowercase Python identifier"),
    (["class"], "not a lowercase Python identifier"),
    (["mygpt", "--op", "Swi-GLU"], "--op 'Swi-GLU' is not a lowercase Python identifier"),
    (["gpt"], "projects/gpt already exists"),
    (["qlstm_two", "--from", "qlstm", "--op", "scan"], "projects/qlstm/ops/scan exists"),
    (["mygpt", "--from", "gtp"], "unknown --from 'gtp': a new project starts from one of gpt, qlstm"),
], ids=["digit-first", "capitals", "dash", "keyword", "op-name", "existing", "op-of-the-source", "unknown-source"])
def test_bad_input_is_refused_and_nothing_written(small_repository, argv, message, capsys):
    before = tree(small_repository)
    with pytest.raises(SystemExit) as stop:
        new_project.main(argv, root=small_repository)
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert tree(small_repository) == before


def test_an_existing_tests_folder_is_not_overwritten(small_repository, capsys):
    (small_repository / "tests" / "mygpt").mkdir()
    with pytest.raises(SystemExit):
        new_project.main(["mygpt"], root=small_repository)
    assert "tests/mygpt already exists" in capsys.readouterr().err
    assert not (small_repository / "projects" / "mygpt").exists()


def test_an_error_while_writing_leaves_nothing_behind(small_repository, monkeypatch):
    before = tree(small_repository)

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(new_project, "write_op", fail)
    with pytest.raises(OSError, match="disk full"):
        new_project.main(["mygpt", "--op", "swiglu"], root=small_repository)
    assert tree(small_repository) == before  # neither folder, nor their staging folders


def test_a_project_from_qlstm_takes_its_modules_kernels_and_kernel_tests(small_repository, capsys):
    files, _ = new_project.scaffold(small_repository, "my_lstm", "qlstm", "gate")
    assert {"projects/my_lstm/cell.py", "projects/my_lstm/ops/scan/triton.py", "tests/my_lstm/test_scan.py",
            "projects/my_lstm/ops/gate/triton.py", "tests/my_lstm/test_gate.py"} <= set(files)
    project = small_repository / "projects" / "my_lstm"
    assert "Started from [qlstm](../qlstm/README.md)" in (project / "README.md").read_text()
    scan = (project / "ops" / "scan" / "triton.py").read_text()
    assert "def my_lstm_scan_fwd_kernel(" in scan and '"my_lstm::scan_fwd"' in scan and "qlstm" not in scan
    copied_test = (small_repository / "tests" / "my_lstm" / "test_scan.py").read_text()
    assert "from projects.my_lstm.ops.scan import" in copied_test
    # kernel_scenarios() launches the copied kernels and then the new op's
    scenarios = (project / "ops" / "__init__.py").read_text()
    assert scenarios.index("QuasiLSTM(") < scenarios.index("yield from gate_scenarios()")
    compile(scenarios, "ops/__init__.py", "exec")  # still Python
