"""Throughput registry: one CSV per project (projects/<name>/throughput.csv).

Each row is one throughput of a model on one piece of hardware, either measured by
scripts/measure_throughput.py, published in a paper, or derived by ratio (below). Compute
classes turn the throughput of the model actually trained into a token budget
(languini.plan), so a row records the whole model configuration it was measured
with: `model_fingerprint` (12 hex digits of SHA-256 over every field of the project's
ModelConfig) and `model_flags` (the fields that differ from the named config, as the
command-line flags that set them). A lookup matches rows by fingerprint, never by name alone.
Rows without a fingerprint (registries written before it existed) stand for the named
config unmodified at the row's seq_len, as configs.py defines it now.

Hardware names are matched after normalisation, so "RTX 3090" matches torch's
"NVIDIA GeForce RTX 3090" and "A100-80GB" matches "NVIDIA A100-SXM4-80GB" (see
normalise_hardware). A row measured with torch.compile serves compiled runs only and an
eager row eager runs; published rows (compilation unknown) serve both.

When several rows match, a published row wins (the paper's definition of its classes);
otherwise the newest measured row, then the newest derived row: a compute class buys tokens
at the throughput the code has now, not the fastest ever recorded.

A derived row gives a reference hardware one does not have: the published row of a baseline
model on that hardware times the ratio of the two models' throughputs measured on one local
GPU in one run (scripts/measure_throughput.py --derive); its note names its sources.
"""

import csv
import dataclasses
import hashlib
import importlib
import io
import json
import re
import shlex
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch

from languini import model_parallel
from languini.atomic_write import write_atomically

SOURCES = ("measured", "published", "derived")
_PREFERENCE = {"derived": 0, "measured": 1, "published": 2}  # among matching rows; then the newest
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct"}
_FORM_FACTORS = {"pcie": "pcie", "sxm": "sxm", "sxm2": "sxm", "sxm3": "sxm", "sxm4": "sxm", "sxm5": "sxm", "nvl": "nvl"}
_MEMORY = re.compile(r"(\d+)\s*gb")


@dataclass(frozen=True)
class ThroughputRow:
    project: str
    config: str  # the named config the model starts from
    model_fingerprint: str  # model_fingerprint() of the full model config measured
    model_flags: str  # the fields that differ from the named config, as flags ("--d_model 512"); empty if none
    hardware: str  # as reported by torch for measured rows ("NVIDIA GeForce RTX 3090", "cpu")
    batch_size: int
    seq_len: int
    tokens_per_second: float
    peak_memory_gib: float | None  # peak allocated accelerator memory; empty when unknown (CPU, published)
    precision: str  # "bf16", "fp16" (autocast) or "fp32"
    compiled: bool | None  # torch.compile used; None when unknown
    torch_version: str
    date: str  # ISO date of the measurement; empty for published rows
    source: str  # "measured", "published" or "derived"
    note: str = ""


COLUMNS = tuple(f.name for f in fields(ThroughputRow))
# Columns that registries written before rows carried the model configuration lack; read_registry fills them.
_MODEL_COLUMNS = ("model_fingerprint", "model_flags")


class ThroughputNotFoundError(LookupError):
    """No registry row for a model on a piece of hardware; the message names the measuring command."""


def _canonical(value):
    # 10 and 10.0 are one value whether a config was written in Python or parsed from a flag.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def model_fingerprint(model_config, step_settings: dict | None = None) -> str:
    """12 hex digits of SHA-256 over every field of a config dataclass, as JSON with sorted keys, and over the
    training settings that change the timed step (`step_settings`: the Hebbian Softmax's flags when it is on).

    Depends only on the field names and values, so it is the same in every process, on every machine and
    in every Python version, and changes with any field but its layout fields (languini.model_parallel: how
    the model is split over processes, which a row measured on one device does not see).
    """
    values = {name: _canonical(value)
              for name, value in {**model_parallel.model_fields(model_config), **(step_settings or {})}.items()}
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _flag_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else shlex.quote(str(value))


def model_flags(model_config, named_config) -> str:
    """The fields where `model_config` differs from `named_config`, as the flags that set them."""
    named = dataclasses.asdict(named_config)
    fields = model_parallel.model_fields(model_config)
    return " ".join(f"--{name} {_flag_value(value)}" for name, value in fields.items()
                    if _canonical(value) != _canonical(named[name]))


@dataclass(frozen=True)
class ModelSpec:
    """The model a registry row must match: its project, the named config it starts from, and all its fields."""

    project: str
    config: str
    fingerprint: str
    flags: str  # model_flags() against the named config, then the step settings as flags
    step_settings: tuple = ()  # (name, value) of the training settings that change the step (languini.hebbian)

    def __str__(self) -> str:
        return f"{self.project} {self.config}{' ' + self.flags if self.flags else ''} (model {self.fingerprint})"


def model_spec(project: str, config: str, model_config=None, step_settings: dict | None = None) -> ModelSpec:
    """The ModelSpec of `model_config` (default: the named config unmodified) of projects/<project>/configs.py,
    trained with `step_settings` (languini.hebbian.settings: {} or None for the plain step)."""
    named = importlib.import_module(f"projects.{project}.configs").SIZES[config]
    model_config = named if model_config is None else model_config
    step_settings = step_settings or {}
    flags = " ".join([model_flags(model_config, named)] + [f"--{k} {_flag_value(v)}" for k, v in step_settings.items()])
    return ModelSpec(project, config, model_fingerprint(model_config, step_settings), flags.strip(),
                     tuple(step_settings.items()))


def _named_config_fingerprint(project: str, config: str, seq_len: int) -> str:
    """The fingerprint a row without one stands for; empty (matching nothing) for an unknown project or config."""
    try:
        named = importlib.import_module(f"projects.{project}.configs").SIZES[config]
        return model_fingerprint(dataclasses.replace(named, seq_len=seq_len))
    except (ImportError, KeyError, AttributeError, TypeError):
        return ""


class HardwareName(NamedTuple):
    model: str  # e.g. "rtx3090", "a100", "cpu"
    memory_gb: int | None
    form_factor: str | None  # "sxm", "pcie" or "nvl"


def normalise_hardware(name: str) -> HardwareName:
    """Split a device name into model, memory and form factor, dropping vendor words and punctuation.

    "NVIDIA GeForce RTX 3090" -> ("rtx3090", None, None); "NVIDIA A100-SXM4-80GB" -> ("a100", 80, "sxm").
    """
    text = name.lower()
    memory = _MEMORY.search(text)
    text = _MEMORY.sub(" ", text)
    words = [w for w in re.split(r"[^a-z0-9]+", text) if w and w not in _VENDOR_WORDS]
    form_factors = [_FORM_FACTORS[w] for w in words if w in _FORM_FACTORS]
    # Memory types (HBM3, HBM2e) say nothing the model name does not.
    model = "".join(w for w in words if w not in _FORM_FACTORS and not w.startswith("hbm"))
    if not model:
        raise ValueError(f"hardware name {name!r} names no device model (e.g. 'RTX 3090', 'A100-80GB', 'cpu')")
    return HardwareName(model, int(memory.group(1)) if memory else None, form_factors[0] if form_factors else None)


def hardware_matches(a: str, b: str) -> bool:
    """Same device model; memory size and form factor must agree where both names give them."""
    x, y = normalise_hardware(a), normalise_hardware(b)
    return (
        x.model == y.model
        and (x.memory_gb is None or y.memory_gb is None or x.memory_gb == y.memory_gb)
        and (x.form_factor is None or y.form_factor is None or x.form_factor == y.form_factor)
    )


def local_device_name(device: torch.device | str) -> str:
    """The name a measurement on `device` is recorded under: torch's GPU name, or 'cpu'."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def registry_path(project: str) -> Path:
    """projects/<project>/throughput.csv, found without importing the project."""
    try:
        search = importlib.import_module("projects").__path__  # the package's own list, which may be extended
    except ImportError as error:
        raise ValueError("the 'projects' package is not importable; install the repository (pip install -e .)") from error
    for root in search:
        if (Path(root) / project).is_dir():
            return Path(root) / project / "throughput.csv"
    raise ValueError(f"no project {project!r} under {list(search)}")


def _parse_row(record: dict, where: str) -> ThroughputRow:
    try:
        compiled = {"true": True, "false": False, "": None}[record["compiled"].strip().lower()]
        seq_len = int(record["seq_len"])
        fingerprint = (record.get("model_fingerprint") or "").strip()
        row = ThroughputRow(
            project=record["project"],
            config=record["config"],
            model_fingerprint=fingerprint or _named_config_fingerprint(record["project"], record["config"], seq_len),
            model_flags="" if not fingerprint else (record.get("model_flags") or "").strip(),
            hardware=record["hardware"],
            batch_size=int(record["batch_size"]),
            seq_len=seq_len,
            tokens_per_second=float(record["tokens_per_second"]),
            peak_memory_gib=float(record["peak_memory_gib"]) if record["peak_memory_gib"] else None,
            precision=record["precision"],
            compiled=compiled,
            torch_version=record["torch_version"],
            date=record["date"],
            source=record["source"],
            note=record["note"] or "",
        )
    except (KeyError, ValueError, TypeError, AttributeError) as error:  # DictReader fills short rows with None
        raise ValueError(f"{where}: malformed registry row {record} ({error!r})") from error
    if row.source not in SOURCES:
        raise ValueError(f"{where}: source must be one of {SOURCES}, got {row.source!r}")
    return row


def read_registry(path: Path | str) -> list[ThroughputRow]:
    """All rows of a registry CSV; a missing file is an empty registry.

    A registry without the model columns (written before rows had them) is read as the named configs
    unmodified, each at its row's seq_len.
    """
    path = Path(path)
    if not path.exists():
        return []
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        missing = set(COLUMNS) - set(_MODEL_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: registry lacks columns {sorted(missing)}; expected {list(COLUMNS)}")
        return [_parse_row(record, f"{path}:{line}") for line, record in enumerate(reader, start=2)]


def display_path(path: Path) -> str:
    """A path as a user types it: relative to the working directory when inside it."""
    path = Path(path).absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def measure_command(model: ModelSpec, registry: Path | str | None = None, compiled: bool = False) -> str:
    """The scripts/measure_throughput.py command that measures `model` (same flags) into `registry`."""
    parts = ["python scripts/measure_throughput.py", model.project, model.config, model.flags,
             "--compile true" if compiled else "", "--sweep",
             f"--registry {shlex.quote(display_path(registry))}" if registry is not None else ""]
    return " ".join(p for p in parts if p)


def _derive_baseline(model: ModelSpec, hardware: str) -> str | None:
    """A project:config with a published row on `hardware` (this project first, then GPT; same config name
    preferred) from which this model's row can be derived by ratio; None if there is none."""
    candidates = []
    for project in dict.fromkeys([model.project, "gpt"]):
        try:
            rows = read_registry(registry_path(project))
        except ValueError:  # no such project here
            continue
        candidates += [r for r in rows if r.source == "published" and hardware_matches(r.hardware, hardware)]
    if not candidates:
        return None
    best = next((r for r in candidates if r.config == model.config), candidates[0])
    return f"{best.project}:{best.config}"


def lookup(path: Path | str, model: ModelSpec, hardware: str, compiled: bool = False) -> ThroughputRow:
    """The row of `model` (by fingerprint) on `hardware` for an eager or compiled run; ThroughputNotFoundError
    (naming the measuring command with the model's flags) if none. See the module's docstring for the choice."""
    rows = [r for r in read_registry(path) if r.project == model.project]
    same_model = [r for r in rows if r.model_fingerprint == model.fingerprint]
    matching = [(i, r) for i, r in enumerate(same_model)
                if hardware_matches(r.hardware, hardware) and r.compiled in (None, compiled)]
    if matching:
        return max(matching, key=lambda ir: (_PREFERENCE[ir[1].source], ir[1].date, ir[0]))[1]
    mode = "compiled" if compiled else "eager"
    elsewhere = sorted({f"{r.hardware}{' (compiled)' if r.compiled else ''}" for r in same_model})
    lines = [f"no throughput for {model} on {hardware!r} ({mode}) in {display_path(path)}; "
             f"it has rows for this model on: {', '.join(elsewhere) or 'no hardware'}."]
    other_flags = sorted({r.model_flags for r in rows if r.config == model.config
                          and hardware_matches(r.hardware, hardware) and r.model_fingerprint != model.fingerprint})
    if other_flags:
        flags = ", ".join(f or "no flags" for f in other_flags)
        lines.append(f"The rows of '{model.config}' with other model flags ({flags}) are not used: they are of other "
                     "models, and a compute class buys tokens at the throughput of the model trained.")
    other_hardware = sorted({f"{r.hardware} ({r.model_flags or 'no flags'})" for r in rows
                             if r.config == model.config and not hardware_matches(r.hardware, hardware)
                             and r.model_fingerprint != model.fingerprint})
    if other_hardware:  # e.g. a GPU row measured only under --attention sdpa: the flags to plan with there
        lines.append(f"Other hardware has rows of '{model.config}' with other model flags: {', '.join(other_hardware)}.")
    lines += [f"Measure it on the {hardware} with", f"    {measure_command(model, path, compiled)}"]
    baseline = _derive_baseline(model, hardware)
    if baseline is not None:
        lines += [f"or, on another GPU, derive it by ratio to {baseline.replace(':', ' ')}, which has a published row "
                  f"on the {hardware}:",
                  f"    {measure_command(model, path, compiled)} --derive {shlex.quote(hardware)} --baseline {baseline}"]
    lines.append("or set the throughput by hand with --tokens_per_second N.")
    raise ThroughputNotFoundError("\n".join(lines))


def _format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def csv_text(rows: list[ThroughputRow], header: bool = True) -> str:
    """Rows as registry CSV lines (with the header line first unless `header` is false)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    writer.writerows([_format_value(value) for value in astuple(row)] for row in rows)
    return buffer.getvalue()


def append_row(path: Path | str, row: ThroughputRow) -> None:
    """Append `row` to the registry, keeping existing lines byte for byte.

    A registry in an older format (without the model columns) is rewritten in the current one first,
    its rows standing for what read_registry reads them as. The new file is written to a temporary file
    and renamed over the old one, so a crash never leaves a truncated registry (two processes appending
    at once can still lose a row).
    """
    path = Path(path)
    if row.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {row.source!r}")
    existing = read_registry(path)  # refuses to append to a malformed file
    text = path.read_text() if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    header = next(csv.reader([text.splitlines()[0]])) if text else []
    if set(COLUMNS) - set(header):
        text = csv_text(existing)
        header = list(COLUMNS)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, restval="", lineterminator="\n")
    writer.writerow({name: _format_value(value) for name, value in zip(COLUMNS, astuple(row))})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda file: file.write((text + buffer.getvalue()).encode()))
