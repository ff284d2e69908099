import datetime
import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import projects
from languini import throughput as tp

REPO = Path(__file__).resolve().parents[2]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_row(**changes):
    row = tp.ThroughputRow(
        project="gpt", config="small", hardware="NVIDIA GeForce RTX 3090", batch_size=32, seq_len=512,
        tokens_per_second=50000.0, peak_memory_gib=20.5, precision="bf16", compiled=False,
        torch_version="2.11.0", date="2025-01-01", source="measured", note="",
    )
    return replace(row, **changes)


# ---- published rows (Languini paper, Tables 5 and 9) ----

@pytest.mark.parametrize(
    "project, config, hardware, tokens_per_second, batch_size",
    [("gpt", "mini", "RTX 3090", 238719, 97), ("gpt", "small", "RTX 3090", 55416, 34),
     ("gpt", "medium", "RTX 3090", 16618, 10), ("gpt", "tiny", "P100-16GB", 21452, 40),
     ("gpt", "large", "V100-32GB", 7296, 9), ("gpt", "XL", "A100-80GB", 14559, 20),
     ("qlstm", "mini", "RTX 3090", 94781, 82), ("qlstm", "small", "RTX 3090", 11143, 17),
     ("qlstm", "large", "RTX 4090", 1002, 2), ("qlstm", "XL", "A100-80GB", 1720, 5)],
)
def test_published_rows(project, config, hardware, tokens_per_second, batch_size):
    row = tp.lookup(tp.registry_path(project), project, config, hardware, seq_len=512)
    assert (row.tokens_per_second, row.batch_size, row.source) == (tokens_per_second, batch_size, "published")


def test_published_tables_leave_out_the_oom_cells():
    gpt = [r for r in tp.read_registry(tp.registry_path("gpt")) if r.source == "published"]
    qlstm = [r for r in tp.read_registry(tp.registry_path("qlstm")) if r.source == "published"]
    assert len(gpt) == 6 * 5 - 5 and len(qlstm) == 6 * 4 - 3
    assert not any(r.config == "XL" and r.hardware == "RTX 3090" for r in gpt + qlstm)
    assert not any(r.config == "large" and r.hardware == "P100-16GB" for r in gpt)


# ---- hardware names ----

@pytest.mark.parametrize(
    "registry_name, device_name",
    [("RTX 3090", "NVIDIA GeForce RTX 3090"), ("rtx3090", "NVIDIA GeForce RTX 3090"),
     ("A100-80GB", "NVIDIA A100-SXM4-80GB"), ("A100-80GB", "NVIDIA A100 80GB PCIe"), ("A100", "NVIDIA A100-SXM4-40GB"),
     ("V100-32GB", "Tesla V100-SXM2-32GB"), ("P100-16GB", "Tesla P100-PCIE-16GB"),
     ("H100 SXM", "NVIDIA H100 80GB HBM3"), ("cpu", "cpu"), ("CPU", "cpu")],
)
def test_hardware_names_that_match(registry_name, device_name):
    assert tp.hardware_matches(registry_name, device_name)
    assert tp.hardware_matches(device_name, registry_name)


@pytest.mark.parametrize(
    "registry_name, device_name",
    [("RTX 3090", "NVIDIA GeForce RTX 3090 Ti"), ("RTX 3090", "NVIDIA GeForce RTX 4090"),
     ("A100-80GB", "NVIDIA A100-SXM4-40GB"), ("A100", "NVIDIA A10"), ("H100 PCIe", "NVIDIA H100 NVL"),
     ("V100-32GB", "Tesla V100-SXM2-16GB"), ("cpu", "NVIDIA GeForce RTX 3090")],
)
def test_hardware_names_that_differ(registry_name, device_name):
    assert not tp.hardware_matches(registry_name, device_name)


def test_hardware_name_without_a_model_is_an_error():
    with pytest.raises(ValueError, match="names no device model"):
        tp.normalise_hardware("NVIDIA 80GB")


# ---- lookup and its error ----

def test_lookup_takes_the_fastest_matching_row(tmp_path):
    registry = tmp_path / "throughput.csv"
    tp.append_row(registry, make_row(tokens_per_second=50000.0, source="published"))
    tp.append_row(registry, make_row(tokens_per_second=60000.0, batch_size=48))
    tp.append_row(registry, make_row(tokens_per_second=90000.0, seq_len=256))  # other sequence length
    tp.append_row(registry, make_row(tokens_per_second=99000.0, hardware="NVIDIA GeForce RTX 4090"))
    tp.append_row(registry, make_row(tokens_per_second=98000.0, config="tiny"))
    row = tp.lookup(registry, "gpt", "small", "RTX 3090", seq_len=512)
    assert (row.tokens_per_second, row.batch_size) == (60000.0, 48)
    assert tp.lookup(registry, "gpt", "small", "RTX 3090", seq_len=256).tokens_per_second == 90000.0
    assert tp.lookup(registry, "gpt", "small", "RTX 3090").tokens_per_second == 90000.0


def test_missing_row_error_names_the_command(tmp_path):
    registry = tmp_path / "throughput.csv"
    tp.append_row(registry, make_row(hardware="NVIDIA A100-SXM4-80GB"))
    with pytest.raises(tp.ThroughputNotFoundError) as error:
        tp.lookup(registry, "gpt", "small", "RTX 3090", seq_len=512)
    message = str(error.value)
    assert "python scripts/measure_throughput.py gpt small --sweep --seq_len 512" in message
    assert "--tokens_per_second" in message and "NVIDIA A100-SXM4-80GB" in message and str(registry) in message
    with pytest.raises(tp.ThroughputNotFoundError, match="no hardware"):
        tp.lookup(tmp_path / "absent.csv", "gpt", "small", "RTX 3090")


# ---- appending ----

def test_append_keeps_existing_bytes_and_leaves_no_temp_files(tmp_path):
    registry = tmp_path / "throughput.csv"
    original = (REPO / "projects" / "gpt" / "throughput.csv").read_text()
    registry.write_text(original)
    registry.chmod(0o640)
    tp.append_row(registry, make_row(tokens_per_second=12345.678, peak_memory_gib=None, compiled=None))
    text = registry.read_text()
    assert text.startswith(original)
    assert text[len(original):] == "gpt,small,NVIDIA GeForce RTX 3090,32,512,12345.678,,bf16,,2.11.0,2025-01-01,measured,\n"
    assert [p.name for p in tmp_path.iterdir()] == ["throughput.csv"]
    assert registry.stat().st_mode & 0o777 == 0o640
    assert tp.read_registry(registry)[-1] == make_row(tokens_per_second=12345.678, peak_memory_gib=None, compiled=None)


def test_append_creates_a_registry_with_a_header(tmp_path):
    registry = tmp_path / "new" / "throughput.csv"
    tp.append_row(registry, make_row())
    assert registry.read_text().splitlines()[0] == ",".join(tp.COLUMNS)
    assert tp.read_registry(registry) == [make_row()]


def test_malformed_registries_are_refused(tmp_path):
    registry = tmp_path / "throughput.csv"
    registry.write_text("project,config\ngpt,small\n")
    with pytest.raises(ValueError, match="lacks columns"):
        tp.read_registry(registry)
    registry.write_text(",".join(tp.COLUMNS) + "\ngpt,small,RTX 3090,1\n")
    with pytest.raises(ValueError, match="malformed registry row"):
        tp.read_registry(registry)
    tp.append_row(tmp_path / "ok.csv", make_row())
    bad_source = (tmp_path / "ok.csv").read_text().replace(",measured,", ",guessed,")
    registry.write_text(bad_source)
    with pytest.raises(ValueError, match="source must be one of"):
        tp.read_registry(registry)
    with pytest.raises(ValueError, match="source must be one of"):
        tp.append_row(tmp_path / "ok.csv", make_row(source="guessed"))


# ---- the profiler script on CPU ----

TOY_CONFIGS = '''
from dataclasses import dataclass


@dataclass
class ModelConfig:
    vocab_size: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 2


SIZES = {"cpu": ModelConfig()}
COMPUTE_CLASSES = {"90s": {"config": "cpu", "batch_size": 2}}
'''

TOY_MODEL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.attention = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, bias=False, batch_first=True)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x, state=None):
        steps = 0 if state is None else state["steps"]
        h = self.embed(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        a, _ = self.attention(h, h, h, attn_mask=mask, need_weights=False)
        return self.head(h + a), {"steps": steps + 1, "last": h[:, -1]}

    def extra_flops(self, seq_len):
        return 1000 * seq_len
'''


@pytest.fixture
def toy_project(tmp_path, monkeypatch, single_thread):
    """A throwaway project 'toy_lm' following the contract, importable as projects.toy_lm."""
    package = tmp_path / "toy_lm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "configs.py").write_text(textwrap.dedent(TOY_CONFIGS))
    (package / "model.py").write_text(textwrap.dedent(TOY_MODEL))
    monkeypatch.setattr(projects, "__path__", [*projects.__path__, str(tmp_path)])
    yield "toy_lm"
    for name in [m for m in sys.modules if m.startswith("projects.toy_lm")]:
        del sys.modules[name]


def test_measure_sweep_on_cpu_appends_a_row(toy_project, tmp_path, capsys):
    script = load_script("measure_throughput")
    registry = tmp_path / "registry.csv"
    args = [toy_project, "cpu", "--registry", str(registry), "--steps", "10", "--warmup", "1"]
    row = script.main(args + ["--sweep", "--max_batch_size", "4"])
    out = capsys.readouterr().out
    # Hand count: q, k, v, out projections 4*2*T*d^2, attention 2*2*T^2*d, head 2*T*d*V, extra 1000*T.
    assert "forward FLOPs at batch 1: 245,376" in out and "MFU n/a" in out
    assert row.batch_size in (1, 2, 4) and row.tokens_per_second > 0
    assert (row.project, row.config, row.hardware, row.seq_len, row.source) == (toy_project, "cpu", "cpu", 16, "measured")
    assert (row.precision, row.compiled, row.torch_version) == ("fp32", False, torch.__version__)
    assert row.date == datetime.date.today().isoformat()
    # The note says how the row was measured: enough to measure it again.
    assert row.note.startswith("best of ") and "; triton " in row.note
    assert row.note.endswith(f"python scripts/measure_throughput.py {toy_project} cpu --registry {registry} --steps 10 "
                             "--warmup 1 --sweep --max_batch_size 4")
    assert tp.read_registry(registry) == [replace(row, tokens_per_second=round(row.tokens_per_second, 3))]
    assert tp.lookup(registry, toy_project, "cpu", "cpu", seq_len=16).batch_size == row.batch_size

    second = script.main(args + ["--batch_size", "3", "--seq_len", "8"])
    assert (second.batch_size, second.seq_len) == (3, 8)
    assert [r.seq_len for r in tp.read_registry(registry)] == [16, 8]


def test_sweep_doubles_then_bisects_to_the_largest_batch_that_fits():
    script = load_script("measure_throughput")
    tried = []

    def measure(batch_size):  # fits up to 37; throughput grows with the batch
        tried.append(batch_size)
        tokens_per_second = None if batch_size > 37 else 1000.0 * batch_size / (batch_size + 4)
        return script.Measurement(batch_size, tokens_per_second, None, None)

    results = script.sweep_batch_sizes(measure, max_batch_size=4096, stop_when_slower=False)
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert max((r for r in results if r.tokens_per_second), key=lambda r: r.tokens_per_second).batch_size == 37


def test_cpu_sweep_stops_when_a_larger_batch_is_slower():
    script = load_script("measure_throughput")
    speeds = {1: 10.0, 2: 20.0, 4: 15.0, 8: 30.0}
    results = script.sweep_batch_sizes(lambda b: script.Measurement(b, speeds[b], None, None), 8, stop_when_slower=True)
    assert [r.batch_size for r in results] == [1, 2, 4]


def test_measure_refuses_several_gpus(toy_project, monkeypatch):
    script = load_script("measure_throughput")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit, match="CUDA_VISIBLE_DEVICES=0"):
        script.main([toy_project, "cpu", "--batch_size", "2", "--device", "cuda"])


def test_measure_rejects_too_few_steps_and_unknown_configs(toy_project, capsys):
    script = load_script("measure_throughput")
    with pytest.raises(SystemExit):
        script.main([toy_project, "cpu", "--batch_size", "2", "--steps", "9"])
    assert "at least 10" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="choose one of"):
        script.main([toy_project, "huge", "--batch_size", "2", "--save", "false"])


@pytest.mark.skipif(importlib.util.find_spec("projects.gpt.model") is None, reason="projects.gpt not present")
def test_measure_script_runs_from_the_command_line_on_gpt(tmp_path):
    registry = tmp_path / "registry.csv"
    command = [sys.executable, "scripts/measure_throughput.py", "gpt", "cpu", "--batch_size", "2", "--seq_len", "32",
               "--steps", "10", "--warmup", "1", "--device", "cpu", "--registry", str(registry)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see single_thread
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    row = tp.lookup(registry, "gpt", "cpu", "cpu", seq_len=32)
    assert (row.batch_size, row.source) == (2, "measured")
