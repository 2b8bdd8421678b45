"""Atomic local file writes: a writer's own complete temp file, then one rename (or link).

A temp file is named ``.<final name>.<pid>.<64 random bits>.tmp`` in the final file's folder (same
file system, so it can be renamed or linked there) and opened with ``O_CREAT | O_EXCL``, so two
live writers (a try and its zombie) never share one. It is written whole and fsynced before it is
given its final name, and the folder is fsynced after, so a reader (or a crash) sees the previous
file or the complete new one under that name, never a torn one; the last rename wins. A writer
that raises removes its temp file; one that is killed leaves it (hidden, never under the final
name).

The step store and the publisher of the article chain, the sales staging files (through
:mod:`onceflow.objects`) and the dashboard all write through here.
"""

from __future__ import annotations

import contextlib
import os
import secrets


def write_temp(final: str, data: bytes) -> str:
    """Write ``data`` to a fresh temp file beside ``final`` (folders created); return its path."""
    folder = os.path.dirname(final)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{os.path.basename(final)}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return temp


def replace_atomic(final: str | os.PathLike[str], data: bytes) -> None:
    """``final`` holds ``data``, all or nothing (an existing file is replaced whole)."""
    final = os.fspath(final)
    temp = write_temp(final, data)
    try:
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _fsync_dir(os.path.dirname(final))


#: the dashboard's name for :func:`replace_atomic`.
atomic_write_bytes = replace_atomic


def create_exclusive(final: str, data: bytes) -> bool:
    """Create ``final`` with ``data`` unless it exists; whether this call created it.

    ``os.link`` of the complete temp file is atomic and fails with ``EEXIST`` when the name is
    taken, so exactly one of any number of racing writers creates it.
    """
    temp = write_temp(final, data)
    try:
        os.link(temp, final)
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
    _fsync_dir(os.path.dirname(final))
    return True


def _fsync_dir(folder: str) -> None:
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


#: :func:`_fsync_dir` for writers that stream into their own temp file (staged parquet).
fsync_dir = _fsync_dir
