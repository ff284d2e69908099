"""A project's train.py whose model signals its own process at a chosen forward call, as a scheduler would.

    python tests/core/signalling_train.py PROJECT [train.py flags]
SIGNAL=SIGTERM SIGNAL_AT=train:5 sends SIGTERM during the 5th training forward (micro-batch) of the process;
SIGNAL_AT=eval:3 during the 3rd evaluation forward; SIGNAL_RANK=r (default 0) picks the data-parallel process.
"""
import importlib
import os
import signal
import sys

from languini.experiment import main


def signalling(model_cls):
    name = os.environ.get("SIGNAL", "SIGTERM")
    mode, call = os.environ["SIGNAL_AT"].split(":")
    mine = int(os.environ.get("RANK", "0")) == int(os.environ.get("SIGNAL_RANK", "0"))

    class Signalling(model_cls):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.calls = 0  # per instance: the FLOPs count runs a model of its own

        def forward(self, x, state=None):
            if mine and self.training == (mode == "train"):
                self.calls += 1
                if self.calls == int(call):
                    os.kill(os.getpid(), getattr(signal, name))
            return super().forward(x, state)

    return Signalling


if __name__ == "__main__":
    project = sys.argv[1]
    configs = importlib.import_module(f"projects.{project}.configs")
    model = importlib.import_module(f"projects.{project}.model").Model
    main(project, configs, signalling(model) if "SIGNAL_AT" in os.environ else model, sys.argv[2:])
