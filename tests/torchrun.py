"""A script of the repository (a project's train.py, scripts/distill.py) under torchrun on CPU processes (gloo), one
thread each, for the tests that compare a run on several processes with one; and the train losses a run logged."""
import json
import os
import subprocess
import sys

from languini.experiment import REPO_ROOT, child_python_path


def torchrun(script: str, argv: list[str], processes: int, timeout: float = 300) -> subprocess.CompletedProcess:
    """python -m torch.distributed.run --standalone --nproc_per_node `processes` REPO_ROOT/script argv."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": child_python_path()}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), str(REPO_ROOT / script), *argv],
                          env=env, capture_output=True, text=True, timeout=timeout)


def train_losses(run_dir) -> list[tuple[int, float]]:
    """(step, loss) of every train row of the run's log.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]
