"""Files replaced whole: a reader, or a crash, sees the old file or the new one, never half of one."""
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make renames in `folder` durable (a node crash after os.replace may otherwise undo them)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder (nor needs to flush one)
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # filesystems that cannot flush a folder
            raise
    finally:
        os.close(fd)


def write_atomically(path: Path, write: Callable) -> Path:
    """Replace `path` by what `write(binary_file)` writes: never half-written, and on disk once this returns.

    Writes through a temporary file of its own beside `path` (two writers never share one) and keeps the
    permissions of the file it replaces (a new file gets 0o644).
    """
    path = Path(path)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644  # mkstemp would leave 0o600
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
