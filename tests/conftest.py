import os

# The Triton interpreter must be switched on before any kernel is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
