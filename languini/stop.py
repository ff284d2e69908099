"""Stopping a run cleanly when a scheduler asks: SIGTERM (preemption, `timeout`, the end of a job), SIGUSR1 (what
SLURM's `--signal` sends before the time limit) and SIGINT (Ctrl-C).

Training stops at the end of the current step with a checkpoint, and the process exits with EXIT_UNFINISHED so a
requeue script can tell an unfinished run from a finished one (0) or a failed one (1).
"""
from __future__ import annotations

import os
import signal
import threading

import torch
import torch.distributed as dist

EXIT_UNFINISHED = 75  # EX_TEMPFAIL of sysexits.h: "try again later", here with --resume auto
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGINT") if hasattr(signal, name))


class StopRequested(Exception):
    """The run stopped before its last step (a stop signal, --stop_at_step); the message says what was saved."""

    def __init__(self, message: str, announce: bool = True, drop_flags: tuple[str, ...] = ()):
        super().__init__(message)
        self.announce = announce  # only rank 0 prints how to continue
        self.drop_flags = drop_flags  # flags the command that continues the run leaves out


class StopSignals:
    """While active, a stop signal is recorded and training stops at the end of the step.

    After `stop_at_once()` (the final evaluation, which changes nothing on disk) a signal raises StopRequested
    right away. Ctrl-C after a first stop signal raises KeyboardInterrupt at once: the last checkpoint is kept.
    """

    def __init__(self, announce: bool = True):
        self.announce = announce
        self.received: str | None = None  # the name of the first stop signal
        self._at_once = False
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # Python only lets the main thread set handlers
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None and name == "SIGINT":  # someone at the terminal who will not wait
            raise KeyboardInterrupt
        if self.received is None:
            self.received = name
            if self.announce and not self._at_once:
                # os.write, not print: a handler may interrupt a print to the same stream
                hint = " (Ctrl-C again quits at once, without saving)" if name == "SIGINT" else ""
                os.write(2, f"\n{name} received: stopping at the end of this step with a checkpoint{hint}.\n".encode())
        if self._at_once:
            raise StopRequested(self._during_final_evaluation(), self.announce)

    def agreed(self, world_size: int, device: torch.device) -> bool:
        """Whether any process received a stop signal; every process gets the same answer (one all-reduce)."""
        if world_size == 1:
            return self.received is not None
        flag = torch.tensor([float(self.received is not None)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = "a stop signal on another process"
        return bool(flag.item())

    def stop_at_once(self) -> None:
        self._at_once = True
        if self.received is not None:
            raise StopRequested(self._during_final_evaluation(), self.announce)

    def _during_final_evaluation(self) -> str:
        return (f"Stopped by {self.received} before the final evaluation was done; the checkpoint of the last "
                "training step is saved and the evaluation runs again when the run is continued.")
