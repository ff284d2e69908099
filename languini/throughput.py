"""Throughput registry: one CSV per project (projects/<name>/throughput.csv).

Each row is one throughput of a model config on one piece of hardware, either measured
by scripts/measure_throughput.py or published in a paper. Compute classes turn the
best matching throughput into a token budget (languini.compute_class).

Hardware names are matched after normalisation, so "RTX 3090" matches torch's
"NVIDIA GeForce RTX 3090" and "A100-80GB" matches "NVIDIA A100-SXM4-80GB" (see
normalise_hardware).

When several rows match, lookup takes the highest tokens/s whatever its source: the
paper defines a compute class by the best throughput achieved on the reference hardware.
"""

import csv
import importlib.util
import io
import os
import re
import tempfile
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch

SOURCES = ("measured", "published")
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct"}
_FORM_FACTORS = {"pcie": "pcie", "sxm": "sxm", "sxm2": "sxm", "sxm3": "sxm", "sxm4": "sxm", "sxm5": "sxm", "nvl": "nvl"}
_MEMORY = re.compile(r"(\d+)\s*gb")


@dataclass(frozen=True)
class ThroughputRow:
    project: str
    config: str
    hardware: str  # as reported by torch for measured rows ("NVIDIA GeForce RTX 3090", "cpu")
    batch_size: int
    seq_len: int
    tokens_per_second: float
    peak_memory_gib: float | None  # peak allocated accelerator memory; empty when unknown (CPU, published)
    precision: str  # "bf16", "fp16" (autocast) or "fp32"
    compiled: bool | None  # torch.compile used; None when unknown
    torch_version: str
    date: str  # ISO date of the measurement; empty for published rows
    source: str  # "measured" or "published"
    note: str = ""


COLUMNS = tuple(f.name for f in fields(ThroughputRow))


class ThroughputNotFoundError(LookupError):
    """No registry row for a (project, config, hardware); the message names the measuring command."""


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
    spec = importlib.util.find_spec("projects")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the 'projects' package is not importable; install the repository (pip install -e .)")
    for root in spec.submodule_search_locations:
        if (Path(root) / project).is_dir():
            return Path(root) / project / "throughput.csv"
    raise ValueError(f"no project {project!r} under {list(spec.submodule_search_locations)}")


def _parse_row(record: dict, where: str) -> ThroughputRow:
    try:
        compiled = {"true": True, "false": False, "": None}[record["compiled"].strip().lower()]
        row = ThroughputRow(
            project=record["project"],
            config=record["config"],
            hardware=record["hardware"],
            batch_size=int(record["batch_size"]),
            seq_len=int(record["seq_len"]),
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
    """All rows of a registry CSV; a missing file is an empty registry."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: registry lacks columns {sorted(missing)}; expected {list(COLUMNS)}")
        return [_parse_row(record, f"{path}:{line}") for line, record in enumerate(reader, start=2)]


def lookup(
    path: Path | str, project: str, config: str, hardware: str, seq_len: int | None = None
) -> ThroughputRow:
    """The fastest row for (project, config, hardware[, seq_len]); ThroughputNotFoundError if none."""
    rows = [r for r in read_registry(path) if r.project == project and r.config == config]
    at_seq_len = [r for r in rows if seq_len is None or r.seq_len == seq_len]
    matching = [r for r in at_seq_len if hardware_matches(r.hardware, hardware)]
    if matching:
        return max(matching, key=lambda r: r.tokens_per_second)
    seq_len_text = "" if seq_len is None else f" at seq_len {seq_len}"
    seq_len_flag = "" if seq_len is None else f" --seq_len {seq_len}"
    known = sorted({r.hardware for r in at_seq_len})
    raise ThroughputNotFoundError(
        f"no throughput for {project} {config}{seq_len_text} on {hardware!r} in {path} "
        f"(it has rows for: {', '.join(known) or 'no hardware'}).\n"
        f"Measure it on the {hardware} with\n"
        f"    python scripts/measure_throughput.py {project} {config} --sweep{seq_len_flag}\n"
        f"or set the throughput by hand with --tokens_per_second N."
    )


def _format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def append_row(path: Path | str, row: ThroughputRow) -> None:
    """Append `row` to the registry, keeping existing lines byte for byte.

    The new file is written to a temporary file and renamed over the old one, so a crash
    never leaves a truncated registry (two processes appending at once can still lose a row).
    """
    path = Path(path)
    if row.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {row.source!r}")
    read_registry(path)  # refuse to append to a malformed file
    text = path.read_text() if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    header = next(csv.reader([text.splitlines()[0]])) if text else list(COLUMNS)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, restval="", lineterminator="\n")
    if not text:
        writer.writeheader()
    writer.writerow({name: _format_value(value) for name, value in zip(COLUMNS, astuple(row))})
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644  # mkstemp would leave 0o600
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", newline="") as file:
            file.write(text + buffer.getvalue())
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
