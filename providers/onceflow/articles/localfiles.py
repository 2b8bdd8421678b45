"""Local-file primitives of the step store and the publisher: a writer's own complete temp file.

A temp file is named ``.<final name>.<pid>.<64 random bits>.tmp`` in the final file's folder (same
file system, so it can be renamed or linked there) and opened with ``O_CREAT | O_EXCL``, so two
live writers (a try and its zombie) never share one. It is complete and flushed before it is given
its final name, so a crash leaves nothing or the whole file under that name.
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


def replace_atomic(final: str, data: bytes) -> None:
    """``final`` holds ``data``, all or nothing (an existing file is replaced whole)."""
    temp = write_temp(final, data)
    try:
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def create_exclusive(final: str, data: bytes) -> bool:
    """Create ``final`` with ``data`` unless it exists; whether this call created it.

    ``os.link`` of the complete temp file is atomic and fails with ``EEXIST`` when the name is
    taken, so exactly one of any number of racing writers creates it.
    """
    temp = write_temp(final, data)
    try:
        os.link(temp, final)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
