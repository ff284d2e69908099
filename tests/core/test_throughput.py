import argparse
import datetime
import hashlib
import importlib
import importlib.util
import os
import shlex
import subprocess
import sys
import textwrap
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

import projects
from languini import throughput as tp
from languini.flags import add_dataclass_flags, overrides
from languini.trainer import TrainConfig
from projects.gpt import configs as gpt_configs

REPO = Path(__file__).resolve().parents[2]
GPT_SMALL = tp.model_spec("gpt", "small")


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_row(**changes):
    row = tp.ThroughputRow(
        project="gpt", config="small", model_fingerprint=GPT_SMALL.fingerprint, model_flags="",
        hardware="NVIDIA GeForce RTX 3090", batch_size=32, seq_len=512,
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
    row = tp.lookup(tp.registry_path(project), tp.model_spec(project, config), hardware)
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


# ---- model fingerprints ----

def test_fingerprint_is_sha256_of_the_fields_as_sorted_json():
    # Written out by hand: every field of GPT small, sorted, no spaces. The digest is pinned too, so a change
    # of Python version, machine or process (hash randomisation) that moved it would fail here.
    text = ('{"attention":"math","d_head":64,"d_model":768,"mlp_ratio":4,"n_heads":12,"n_layers":12,"seq_len":512,'
            '"tie_embeddings":false,"vocab_size":16384}')
    assert tp.model_fingerprint(gpt_configs.SIZES["small"]) == hashlib.sha256(text.encode()).hexdigest()[:12]
    assert tp.model_fingerprint(gpt_configs.SIZES["small"]) == "45cebdaabf4f"


# every project is checked, a new one included (discovered as tests/core/test_contract.py finds them)
LANGUAGE_MODELS = sorted(path.parent.name for path in (REPO / "projects").glob("*/model.py")
                         if getattr(importlib.import_module(f"projects.{path.parent.name}"), "LANGUAGE_MODEL", True))
REGISTRIES = sorted(path.parent.name for path in (REPO / "projects").glob("*/throughput.csv"))


def test_every_project_with_a_registry_is_a_language_model_checked_here():
    assert {"gpt", "qlstm", "lram_gpt", "pkm_gpt"} <= set(REGISTRIES) <= set(LANGUAGE_MODELS)


@pytest.mark.parametrize("project", LANGUAGE_MODELS)
def test_fingerprint_changes_with_any_model_field(project):
    configs = importlib.import_module(f"projects.{project}.configs")
    base = configs.SIZES["cpu"]

    def other(value):
        if isinstance(value, bool):
            return not value
        if isinstance(value, (int, float)):
            return value + 1  # not value * 2 + 1, which leaves -1 (feedback's memory_layer) as it is
        return 1 if value is None else value + "x"

    layout = getattr(configs.ModelConfig, "LAYOUT_FIELDS", ())  # how it is split over processes: not the model
    model_fields = [f for f in fields(base) if f.name not in layout]
    prints = {tp.model_fingerprint(replace(base, **{f.name: other(getattr(base, f.name))})) for f in model_fields}
    assert len(prints) == len(model_fields) and tp.model_fingerprint(base) not in prints
    assert tp.model_fingerprint(replace(base)) == tp.model_fingerprint(base)
    for name in layout:
        assert tp.model_fingerprint(replace(base, **{name: 2})) == tp.model_fingerprint(base)


def test_fingerprint_reads_whole_floats_as_integers():
    # A flag parses --value_lr_multiplier 10 as 10.0; the config file may say 10. One model, one fingerprint.
    configs = importlib.import_module("projects.lram_gpt.configs")
    cfg = configs.SIZES["cpu"]
    assert tp.model_fingerprint(replace(cfg, value_lr_multiplier=10)) == tp.model_fingerprint(replace(cfg, value_lr_multiplier=10.0))


def test_model_flags_are_the_fields_that_differ_from_the_named_config():
    spec = tp.model_spec("gpt", "cpu", gpt_configs.get("cpu", d_model=512, n_layers=8))
    assert spec.flags == "--d_model 512 --n_layers 8"
    assert tp.model_spec("gpt", "cpu").flags == ""
    lram = importlib.import_module("projects.lram_gpt.configs")
    changed = replace(lram.SIZES["cpu"], memory_layers="1", sparse_values=True, memory_query_norm="batch")
    assert (tp.model_spec("lram_gpt", "cpu", changed).flags
            == "--memory_layers 1 --memory_query_norm batch --sparse_values true")


def config_of_row(configs, row, step_settings=None):
    """The named config of a registry row with its recorded flags, parsed as train.py parses them; the flags of
    the training step (the Hebbian Softmax's) go into `step_settings` when a dict is given, else are refused."""
    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, configs.ModelConfig, "model")
    args, rest = parser.parse_known_args(shlex.split(row.model_flags))
    if rest and step_settings is None:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        step = argparse.ArgumentParser()
        add_dataclass_flags(step, TrainConfig, "train")
        step_settings.update(overrides(step.parse_args(rest), TrainConfig))
    return replace(configs.SIZES[row.config], **{"seq_len": row.seq_len, **overrides(args, configs.ModelConfig)})


@pytest.mark.parametrize("project", REGISTRIES)
def test_committed_rows_are_tied_to_the_configs_they_were_measured_with(project):
    """Every row of the tracked registries is the named config with its recorded flags as configs.py defines it.

    Fails when a change to a ModelConfig (a new field, a new default) or to a named config moves a model away
    from the rows measured with it: decide per row whether it still describes the model, and measure anew
    where it does not.
    """
    configs = importlib.import_module(f"projects.{project}.configs")
    for row in tp.read_registry(tp.registry_path(project)):
        assert row.model_fingerprint == tp.model_fingerprint(config_of_row(configs, row)), row
        if row.source == "published":
            assert row.model_flags == "", row  # the paper's configs as the paper (and its code: math attention) ran them
        elif hasattr(configs.ModelConfig, "attention") and row.date <= "2026-11-23":
            # measured before --attention existed, when attention was F.scaled_dot_product_attention
            assert row.model_flags == "--attention sdpa", row


# a comparison's own registry: what scripts/compare.py charges the runs at when its grid is extended or resumed
COMPARISON_REGISTRIES = sorted(str(path.relative_to(REPO))
                               for path in REPO.glob("results/*/comparison/runs/throughput.csv"))


@pytest.mark.parametrize("registry", COMPARISON_REGISTRIES)
def test_comparison_rows_are_tied_to_the_configs_they_were_measured_with(registry):
    """As above for a committed comparison: a row left behind by a new config field would make an extended grid
    time its model anew, and charge the new runs at another throughput than the old ones."""
    for row in tp.read_registry(REPO / registry):
        step_settings = {}
        config = config_of_row(importlib.import_module(f"projects.{row.project}.configs"), row, step_settings)
        assert row.model_fingerprint == tp.model_fingerprint(config, step_settings), row


# ---- lookup and its error ----

def test_lookup_prefers_published_then_the_newest_measured_row(tmp_path):
    registry = tmp_path / "throughput.csv"
    tp.append_row(registry, make_row(tokens_per_second=60000.0, date="2025-03-01"))
    tp.append_row(registry, make_row(tokens_per_second=50000.0, date="2025-05-01"))  # newer and slower
    tp.append_row(registry, make_row(tokens_per_second=70000.0, date="2025-04-01"))
    tp.append_row(registry, make_row(tokens_per_second=99000.0, date="2025-06-01", source="derived"))
    tp.append_row(registry, make_row(tokens_per_second=99000.0, hardware="NVIDIA GeForce RTX 4090"))
    tp.append_row(registry, make_row(tokens_per_second=98000.0, config="tiny", model_fingerprint="0" * 12))
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090").tokens_per_second == 50000.0
    tp.append_row(registry, make_row(tokens_per_second=40000.0, date="", source="published"))
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090").tokens_per_second == 40000.0


def test_lookup_uses_a_derived_row_only_without_a_measured_one(tmp_path):
    registry = tmp_path / "throughput.csv"
    tp.append_row(registry, make_row(tokens_per_second=30000.0, date="2025-06-01", source="derived"))
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090").source == "derived"
    tp.append_row(registry, make_row(tokens_per_second=20000.0, date="2025-01-01"))
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090").tokens_per_second == 20000.0


def test_compiled_rows_serve_compiled_runs_and_eager_rows_eager_runs(tmp_path):
    registry = tmp_path / "throughput.csv"
    tp.append_row(registry, make_row(tokens_per_second=50000.0, compiled=False))
    tp.append_row(registry, make_row(tokens_per_second=65000.0, compiled=True))
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090", compiled=False).tokens_per_second == 50000.0
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090", compiled=True).tokens_per_second == 65000.0
    eager_only = tmp_path / "eager.csv"
    tp.append_row(eager_only, make_row(compiled=False))
    with pytest.raises(tp.ThroughputNotFoundError, match="gpt small --compile true --sweep"):
        tp.lookup(eager_only, GPT_SMALL, "RTX 3090", compiled=True)
    unknown = tmp_path / "published.csv"  # a published row does not say; it serves both
    tp.append_row(unknown, make_row(compiled=None, source="published", date=""))
    assert tp.lookup(unknown, GPT_SMALL, "RTX 3090", compiled=True) == tp.lookup(unknown, GPT_SMALL, "RTX 3090")


def test_a_missing_row_names_the_rows_other_hardware_has_with_other_flags(tmp_path):
    registry = tmp_path / "throughput.csv"
    sdpa = tp.model_spec("gpt", "small", gpt_configs.get("small", attention="sdpa"))
    tp.append_row(registry, make_row(hardware="NVIDIA H100 80GB HBM3", model_fingerprint=sdpa.fingerprint,
                                     model_flags=sdpa.flags))
    with pytest.raises(tp.ThroughputNotFoundError) as error:
        tp.lookup(registry, GPT_SMALL, "RTX 3090")
    assert ("Other hardware has rows of 'small' with other model flags: NVIDIA H100 80GB HBM3 (--attention sdpa)."
            in str(error.value))


def test_modified_config_without_its_row_is_refused_with_the_measure_command_and_its_flags():
    # The example: the cpu config made several times larger must not get the cpu config's throughput.
    larger = tp.model_spec("gpt", "cpu", gpt_configs.get("cpu", d_model=512, n_layers=8))
    registry = tp.registry_path("gpt")
    assert tp.lookup(registry, tp.model_spec("gpt", "cpu", gpt_configs.get("cpu", attention="sdpa")),
                     "cpu").tokens_per_second == 24003.767
    with pytest.raises(tp.ThroughputNotFoundError) as error:
        tp.lookup(registry, larger, "cpu")
    message = str(error.value)
    assert ("python scripts/measure_throughput.py gpt cpu --d_model 512 --n_layers 8 --sweep --registry "
            f"{tp.display_path(registry)}") in message
    assert "--tokens_per_second" in message
    assert "rows of 'cpu' with other model flags (no flags, --attention sdpa) are not used" in message


def test_a_row_measured_with_the_modified_field_is_used(tmp_path):
    registry = tmp_path / "throughput.csv"
    larger = tp.model_spec("gpt", "small", gpt_configs.get("small", n_layers=24))
    tp.append_row(registry, make_row(tokens_per_second=55000.0))
    tp.append_row(registry, make_row(tokens_per_second=31000.0, model_fingerprint=larger.fingerprint,
                                     model_flags=larger.flags))
    assert tp.lookup(registry, larger, "RTX 3090").tokens_per_second == 31000.0
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090").tokens_per_second == 55000.0
    # The vocabulary is part of the model: the cpu config on book data is another model than on the default corpus.
    books_vocab = tp.model_spec("gpt", "cpu", gpt_configs.get("cpu", vocab_size=16384))
    assert books_vocab.flags == "--vocab_size 16384" and books_vocab.fingerprint != tp.model_spec("gpt", "cpu").fingerprint


def test_missing_row_error_names_the_measure_and_the_derive_commands(tmp_path):
    registry = tmp_path / "throughput.csv"
    tp.append_row(registry, make_row(hardware="NVIDIA A100-SXM4-80GB"))
    with pytest.raises(tp.ThroughputNotFoundError) as error:
        tp.lookup(registry, GPT_SMALL, "RTX 3090")
    message = str(error.value)
    command = f"python scripts/measure_throughput.py gpt small --sweep --registry {registry}"
    assert command in message and "--tokens_per_second" in message and "NVIDIA A100-SXM4-80GB" in message
    # The paper's GPT small has a published RTX 3090 row to derive from (issue 19: lram_gpt small on a 3090).
    lram = tp.model_spec("lram_gpt", "small")
    with pytest.raises(tp.ThroughputNotFoundError, match=r"--sweep --registry \S+ --derive 'RTX 3090' --baseline gpt:small"):
        tp.lookup(tp.registry_path("lram_gpt"), lram, "RTX 3090")
    with pytest.raises(tp.ThroughputNotFoundError, match="no hardware") as error:
        tp.lookup(tmp_path / "absent.csv", GPT_SMALL, "cpu")
    assert "--derive" not in str(error.value)  # nothing was published for a CPU


def test_rows_without_model_columns_stand_for_the_named_config(tmp_path):
    """A registry written before rows recorded the model: read as the named configs, upgraded on append."""
    registry = tmp_path / "throughput.csv"
    registry.write_text("project,config,hardware,batch_size,seq_len,tokens_per_second,peak_memory_gib,precision,"
                        "compiled,torch_version,date,source,note\n"
                        "gpt,small,RTX 3090,34,512,55416,,fp16,,2.0.0,,published,Table 5\n"
                        "gpt,small,RTX 3090,34,256,90000,,fp16,,2.0.0,,published,Table 5\n"
                        "gpt,nonesuch,RTX 3090,34,512,1,,fp16,,2.0.0,,published,\n")
    rows = tp.read_registry(registry)
    assert [r.model_fingerprint for r in rows] == [
        GPT_SMALL.fingerprint, tp.model_fingerprint(gpt_configs.get("small", seq_len=256)), ""]
    assert tp.lookup(registry, GPT_SMALL, "RTX 3090").tokens_per_second == 55416
    tp.append_row(registry, make_row())
    assert registry.read_text().splitlines()[0] == ",".join(tp.COLUMNS)
    assert tp.read_registry(registry) == rows + [make_row()]


# ---- appending ----

def test_append_keeps_existing_bytes_and_leaves_no_temp_files(tmp_path):
    registry = tmp_path / "throughput.csv"
    original = (REPO / "projects" / "gpt" / "throughput.csv").read_text()
    registry.write_text(original)
    registry.chmod(0o640)
    tp.append_row(registry, make_row(tokens_per_second=12345.678, peak_memory_gib=None, compiled=None))
    text = registry.read_text()
    assert text.startswith(original)
    assert text[len(original):] == ("gpt,small,45cebdaabf4f,,NVIDIA GeForce RTX 3090,32,512,12345.678,,bf16,,2.11.0,"
                                    "2025-01-01,measured,\n")
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


SIZES = {"cpu": ModelConfig(), "base": ModelConfig(d_model=64)}
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
    # --force: a busy test machine's spread must not stop what this tests (test_..._busy_machine tests the refusal)
    args = [toy_project, "cpu", "--registry", str(registry), "--steps", "10", "--warmup", "1", "--force", "true"]
    [row] = script.main(args + ["--sweep", "--max_batch_size", "4"])
    out = capsys.readouterr().out
    # Hand count: q, k, v, out projections 4*2*T*d^2, attention 2*2*T^2*d, head 2*T*d*V, extra 1000*T.
    assert "forward FLOPs at batch 1: 245,376" in out and "MFU n/a" in out
    assert row.batch_size in (1, 2, 4) and row.tokens_per_second > 0
    assert (row.project, row.config, row.hardware, row.seq_len, row.source) == (toy_project, "cpu", "cpu", 16, "measured")
    assert (row.model_fingerprint, row.model_flags) == (tp.model_spec(toy_project, "cpu").fingerprint, "")
    assert (row.precision, row.compiled, row.torch_version) == ("fp32", False, torch.__version__)
    assert row.date == datetime.date.today().isoformat()
    # The note says how the row was measured: enough to measure it again.
    assert row.note.startswith("best of ") and "; triton " in row.note
    assert row.note.endswith(f"python scripts/measure_throughput.py {toy_project} cpu --registry {registry} --steps 10 "
                             "--warmup 1 --force true --sweep --max_batch_size 4")
    assert tp.read_registry(registry) == [replace(row, tokens_per_second=round(row.tokens_per_second, 3))]
    assert tp.lookup(registry, tp.model_spec(toy_project, "cpu"), "cpu").batch_size == row.batch_size

    # Model flags as train.py has them: the row is of the model they make, and says so.
    [second] = script.main(args + ["--batch_size", "3", "--seq_len", "8", "--d_model", "16"])
    modified = tp.model_spec(toy_project, "cpu", importlib.import_module(f"projects.{toy_project}.configs")
                             .ModelConfig(seq_len=8, d_model=16))
    assert (second.batch_size, second.seq_len, second.model_flags) == (3, 8, "--seq_len 8 --d_model 16")
    assert tp.lookup(registry, modified, "cpu").tokens_per_second == round(second.tokens_per_second, 3)
    assert tp.lookup(registry, tp.model_spec(toy_project, "cpu"), "cpu").batch_size == row.batch_size


def test_measure_without_registry_prints_the_row_and_writes_nothing(toy_project, tmp_path, capsys):
    script = load_script("measure_throughput")
    before = {p: p.read_bytes() for p in Path(projects.__path__[0]).glob("*/throughput.csv")}
    [row] = script.main([toy_project, "cpu", "--batch_size", "2", "--steps", "10", "--warmup", "1"])
    out = capsys.readouterr().out
    assert "Not saved (no --registry)" in out
    assert out.rstrip().endswith(tp.csv_text([row], header=False).rstrip())
    assert not (tmp_path / toy_project / "throughput.csv").exists()
    assert {p: p.read_bytes() for p in Path(projects.__path__[0]).glob("*/throughput.csv")} == before


def test_derived_row_is_the_baselines_published_row_times_the_measured_ratio(toy_project, tmp_path, monkeypatch):
    """Issue 19: a row for a reference GPU one lacks, from a baseline with a published row there."""
    script = load_script("measure_throughput")
    # Deterministic timings: the toy model of width d runs at 1e6 / d tokens/s, so cpu (d 32) is twice base (d 64).
    monkeypatch.setattr(script, "measure_batch_size", lambda model, cfg, batch_size, *rest: script.Measurement(
        batch_size, 1e6 / cfg.d_model, batch_size * cfg.seq_len * cfg.d_model / 1e6, None))
    tp.append_row(tmp_path / toy_project / "throughput.csv", make_row(
        project=toy_project, config="base", model_fingerprint=tp.model_spec(toy_project, "base").fingerprint,
        hardware="RTX 3090", tokens_per_second=1000.0, source="published", date=""))
    registry = tmp_path / "out.csv"
    measured, derived = script.main([toy_project, "cpu", "--batch_size", "2", "--steps", "10", "--warmup", "1",
                                     "--derive", "RTX 3090", "--baseline", f"{toy_project}:base",
                                     "--registry", str(registry)])
    assert (measured.source, measured.hardware, measured.tokens_per_second) == ("measured", "cpu", 31250.0)
    assert (derived.source, derived.hardware, derived.tokens_per_second) == ("derived", "RTX 3090", 2000.0)
    assert derived.model_fingerprint == tp.model_spec(toy_project, "cpu").fingerprint
    assert derived.note.startswith(f"derived: 1,000 tokens/s of {toy_project} base (published, RTX 3090) x 2.0000 = "
                                   "31,250 / 15,625 tokens/s")
    assert tp.read_registry(registry) == [measured, derived]
    assert tp.lookup(registry, tp.model_spec(toy_project, "cpu"), "NVIDIA GeForce RTX 3090") == derived
    with pytest.raises(SystemExit, match="cannot anchor --derive 'RTX 4090'"):  # the baseline has no row there
        script.main([toy_project, "cpu", "--batch_size", "2", "--derive", "RTX 4090", "--baseline", f"{toy_project}:base"])


def test_measure_times_train_py_defaults_or_the_given_clipping_and_micro_batches(toy_project, monkeypatch, capsys):
    script = load_script("measure_throughput")
    seen = []
    monkeypatch.setattr(script, "measure_batch_size", lambda model, cfg, batch_size, device, tcfg, *rest: seen.append(
        (batch_size, tcfg.grad_clip, tcfg.micro_batches)) or script.Measurement(batch_size, 1.0 * batch_size, 1.0, None))
    script.main([toy_project, "cpu", "--batch_size", "2", "--steps", "10", "--warmup", "1"])
    assert seen == [(2, TrainConfig().grad_clip, TrainConfig().micro_batches)]  # what a default run trains
    seen.clear()
    script.main([toy_project, "cpu", "--sweep", "--max_batch_size", "8", "--micro_batches", "2", "--grad_clip", "1.0",
                 "--steps", "10", "--warmup", "1"])
    assert seen == [(2, 1.0, 2), (4, 1.0, 2), (8, 1.0, 2)]  # the sweep grows the micro-batch
    with pytest.raises(SystemExit):
        script.main([toy_project, "cpu", "--batch_size", "3", "--micro_batches", "2"])
    assert "--batch_size 3 is not divisible into 2 micro-batches" in capsys.readouterr().err


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


def test_cpu_sweep_stops_after_two_larger_batches_slower_than_the_best():
    script = load_script("measure_throughput")
    # 4 was noisy: one slower measurement does not stop the sweep; 16 and 32 both slower than 8 do
    speeds = {1: 10.0, 2: 20.0, 4: 15.0, 8: 30.0, 16: 29.0, 32: 28.0, 64: 50.0}
    results = script.sweep_batch_sizes(lambda b: script.Measurement(b, speeds[b], None, None), 64,
                                       stop_when_slower=True)
    assert [r.batch_size for r in results] == [1, 2, 4, 8, 16, 32]


def test_on_a_cpu_paper_configs_and_committed_registries_are_refused_unless_asked(toy_project, capsys):
    script = load_script("measure_throughput")
    with pytest.raises(SystemExit):
        script.main([toy_project, "base", "--batch_size", "2", "--device", "cpu"])
    assert "'base' is a paper config" in capsys.readouterr().err
    committed = str(script.PROJECTS / toy_project / "throughput.csv")
    with pytest.raises(SystemExit):
        script.main([toy_project, "cpu", "--batch_size", "2", "--device", "cpu", "--registry", committed])
    assert "is a project's committed registry" in capsys.readouterr().err


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
        script.main([toy_project, "huge", "--batch_size", "2", "--paper_config_on_cpu", "true"])
    with pytest.raises(SystemExit):
        script.main([toy_project, "cpu", "--batch_size", "2", "--derive", "RTX 3090"])
    assert "--derive and --baseline go together" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("projects.gpt.model") is None, reason="projects.gpt not present")
def test_measure_script_runs_from_the_command_line_on_gpt(tmp_path):
    registry = tmp_path / "registry.csv"
    command = [sys.executable, "scripts/measure_throughput.py", "gpt", "cpu", "--batch_size", "2", "--seq_len", "32",
               "--steps", "10", "--warmup", "1", "--device", "cpu", "--registry", str(registry), "--force", "true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see single_thread
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    row = tp.lookup(registry, tp.model_spec("gpt", "cpu", gpt_configs.get("cpu", seq_len=32)), "cpu")
    assert (row.batch_size, row.source, row.model_flags) == (2, "measured", "--seq_len 32")


def test_sweep_from_a_smallest_batch_skips_the_smaller_ones():
    script = load_script("measure_throughput")
    tried = []

    def measure(batch_size):  # fits up to 100
        tried.append(batch_size)
        return script.Measurement(batch_size, None if batch_size > 100 else float(batch_size), None, None)

    script.sweep_batch_sizes(measure, max_batch_size=4096, stop_when_slower=False, min_batch_size=16)
    assert tried == [16, 32, 64, 128, 96, 112, 104, 100, 102, 101]


def test_measure_refuses_to_write_a_row_timed_on_a_busy_machine(toy_project, tmp_path, monkeypatch, capsys):
    """Issue 50: a shared machine once committed 1,120 tokens/s for a model that then trained at 4,347."""
    script = load_script("measure_throughput")
    spread = {"value": 0.9}  # the slowest step 90% of the median slower than the fastest
    monkeypatch.setattr(script, "measure_batch_size", lambda model, cfg, batch_size, *rest: script.Measurement(
        batch_size, 1000.0, batch_size * cfg.seq_len / 1000.0, None, spread["value"]))
    registry = tmp_path / "out.csv"
    args = [toy_project, "cpu", "--batch_size", "2", "--steps", "10", "--warmup", "1", "--registry", str(registry)]
    with pytest.raises(SystemExit, match=r"Not written to .*spread over 90% of their median.*--force true"):
        script.main(args)
    assert not registry.exists()
    [row] = script.main(args + ["--force", "true"])
    assert tp.read_registry(registry) == [row]
    assert "Warning: This machine looked busy" in capsys.readouterr().out
    spread["value"] = 0.2  # an idle machine's spread: written without a word
    script.main(args)
    assert len(tp.read_registry(registry)) == 2 and "busy" not in capsys.readouterr().out
