"""Atomic file writes: a unique temporary file in the target's folder, fsynced, then renamed.

A reader (or a crash) sees either the previous file or the complete new one, never a torn one;
two writers of the same path each use their own temporary name, so they never interleave, and
the last rename wins.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a unique temporary path beside ``path``; on a clean exit fsync it and rename it there.

    For writers that want a path (``DataFrame.to_parquet``). The temporary file is removed if
    the block raises.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (unique temp file + fsync + ``os.replace``)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()


def _fsync_dir(folder: Path) -> None:
    """Persist the rename itself; best effort (not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
