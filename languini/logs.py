"""Run logs: a JSON-lines file always; wandb and tensorboard when asked. Only rank 0 writes."""
from __future__ import annotations

import json
import os
from pathlib import Path

from languini.atomic_write import write_atomically


class RunLog:
    def __init__(self, run_dir: Path, config: dict, use_wandb: bool = False, wandb_project: str = "languini",
                 use_tensorboard: bool = False, enabled: bool = True, resume_step: int | None = None,
                 resume_rows: int | None = None):
        """A fresh run (resume_step None) starts a new log.jsonl; a resumed one keeps the rows its checkpoint saw:
        the first `resume_rows` rows, or, for checkpoints that did not count them, the rows up to resume_step."""
        self.enabled = enabled
        self.path = run_dir / "log.jsonl"
        self.wandb = self.tb = None
        self.rows = 0  # rows in log.jsonl, saved with each checkpoint
        if not enabled:
            return
        if resume_step is None:
            self.path.unlink(missing_ok=True)
        else:
            self._truncate(resume_step, resume_rows)
        if use_wandb:
            import wandb

            if "WANDB_MODE" not in os.environ and not os.environ.get("WANDB_API_KEY"):
                print("wandb: no WANDB_API_KEY and no WANDB_MODE set, logging offline (sync later with `wandb sync`).")
                os.environ["WANDB_MODE"] = "offline"
            self.wandb = wandb.init(project=wandb_project, name=run_dir.name, dir=str(run_dir), config=config,
                                    resume="allow", id=run_dir.name.replace("/", "_"))
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ValueError("--tensorboard true needs the tensorboard package: "
                                 "pip install -e '.[tensorboard]'") from e
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def _truncate(self, step: int, rows: int | None):
        """Drop rows a stopped run wrote after its checkpoint (the final evaluation's too), so no row repeats."""
        if not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        kept = lines[:rows] if rows is not None else [r for r in lines if json.loads(r).get("step", 0) <= step]
        write_atomically(self.path, lambda file: file.write("".join(r + "\n" for r in kept).encode()))
        self.rows = len(kept)

    def sync(self):
        """Flush log.jsonl to disk, so a checkpoint never counts rows a node crash could lose."""
        if self.enabled and self.path.exists():
            with self.path.open("a") as f:
                os.fsync(f.fileno())

    def write(self, row: dict):
        """One event; rows carry step, tokens and accelerator_seconds so any of them can be the x-axis."""
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.rows += 1
        metrics = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        prefix = row["event"] if row["event"] != "eval" else f"eval/{row['split']}/{row['mode']}"
        if self.wandb is not None:
            self.wandb.log({f"{prefix}/{k}" if k not in ("step", "tokens", "accelerator_seconds") else k: v
                            for k, v in metrics.items()}, step=row["step"])
        if self.tb is not None:
            for k, v in metrics.items():
                if k in ("step", "tokens", "accelerator_seconds"):
                    continue
                self.tb.add_scalar(f"{prefix}/{k}", v, row["step"])
                self.tb.add_scalar(f"{prefix}/{k}_by_tokens", v, row["tokens"])
                if row["accelerator_seconds"] is not None:
                    self.tb.add_scalar(f"{prefix}/{k}_by_accelerator_seconds", v, int(row["accelerator_seconds"]))

    def close(self):
        if self.wandb is not None:
            self.wandb.finish()
        if self.tb is not None:
            self.tb.close()
