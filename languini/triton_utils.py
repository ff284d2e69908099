"""What the projects' Triton ops share."""
import os


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 set before any kernel is defined)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
