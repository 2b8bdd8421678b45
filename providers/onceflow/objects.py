"""One object written and read whole through Airflow's ``ObjectStoragePath``: local files or GCS.

The article chain's step outputs (:mod:`onceflow.articles.storage`) and daily_sales' staging files
(:mod:`onceflow.sales.staging`) both write here, so they keep one atomicity rule:

* **Local files** (``file://`` or a plain absolute path): :func:`onceflow.files.replace_atomic`, a
  temp file of the writer's own (pid and 64 random bits, ``O_EXCL``) beside the final name,
  fsynced, then renamed over it. A writer that raises removes its temp file; a killed one leaves
  the previous file under the final name; two live writers never share a temp file.
* **Object stores** (``gs://``): the filesystem's ``pipe_file``, one upload request. Google (and
  the emulator) make an object visible only once its upload is complete, so a killed upload
  leaves the previous object and there is no temp object to share or leave behind.

Which filesystem a ``gs://`` path uses (credentials, an emulator's endpoint) is the business of
:meth:`onceflow.hooks.storage.StorageHook.path`; this module only moves bytes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import quote_from_bytes, unquote, urlsplit

from onceflow.files import replace_atomic

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

LOCAL_PROTOCOLS = ("file", "local", "")


class StorageUriError(ValueError):
    """A storage location is not usable; the message names where it was configured."""


def parse_storage_uri(value: object, what: str, error: type[ValueError] = StorageUriError) -> str:
    """``file:///abs/path`` or ``gs://bucket[/prefix]``, without a trailing slash.

    :param what: where ``value`` comes from, for the message (``onceflow_storage extra 'base'``).
    :param error: the exception class to raise.
    """
    if not isinstance(value, str) or not value.strip():
        raise error(f"{what} must be a non-empty URI, got {value!r}")
    parts = urlsplit(value.strip())
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise error(f"{what} must be an absolute file URI (file:///abs/path), got {value!r}")
        return "file://" + (parts.path.rstrip("/") or "/")
    if parts.scheme in ("gs", "gcs"):
        if not parts.netloc or parts.query or parts.fragment:
            raise error(f"{what} must be gs://bucket/prefix, got {value!r}")
        prefix = parts.path.strip("/")
        return f"gs://{parts.netloc}" + (f"/{prefix}" if prefix else "")
    raise error(f"{what} must start with file:/// or gs://, got {value!r}")


def storage_path(location: ObjectStoragePath | os.PathLike[str] | str) -> ObjectStoragePath:
    """``location`` as an ``ObjectStoragePath``; a plain path is a local file.

    A ``file://`` URI string is read percent-decoded, as URIs are written (``Path.as_uri()`` and
    :func:`uri_of` spell ``my dir`` as ``my%20dir``, and ``ObjectStoragePath`` would keep the
    escapes as characters of the path). An ``ObjectStoragePath`` is returned as it is: its path is
    already decoded, and decoding it again would turn a folder named ``50%41`` into ``50A``. An
    object store's path keeps its filesystem; a URI string of one gets Airflow's default
    filesystem: resolve those through :meth:`onceflow.hooks.storage.StorageHook.path` instead.
    """
    from airflow.sdk import ObjectStoragePath

    if isinstance(location, ObjectStoragePath):
        return location
    text = os.fspath(location)
    if "://" not in text:
        return ObjectStoragePath("file://" + os.path.abspath(text))
    if text.startswith("file://"):
        return ObjectStoragePath("file://" + unquote(urlsplit(text).path, errors="surrogateescape"))
    return ObjectStoragePath(text)


def is_local(path: ObjectStoragePath) -> bool:
    """Whether ``path`` is a local file (written by rename, not by upload)."""
    return path.protocol in LOCAL_PROTOCOLS


def uri_of(path: ObjectStoragePath) -> str:
    """The URI that names ``path`` (``file:///...``, ``gs://bucket/...``): for XComs and results.

    A local path is percent-encoded as ``Path.as_uri()`` does, so :func:`storage_path` (which
    decodes) gives back the very folder: ``/x/50%41`` is ``file:///x/50%2541``.
    """
    if is_local(path):
        return "file://" + quote_from_bytes(os.fsencode(path.path))
    return f"{path.protocol}://{path.path}"


def write_object(path: ObjectStoragePath, data: bytes) -> None:
    """Store ``data`` at ``path`` whole or not at all (an existing object is replaced whole)."""
    if is_local(path):
        replace_atomic(path.path, bytes(data))
    else:
        # The filesystem's pipe_file, not a buffered file: gcsfs sends one request below 50 MiB
        # and above it a resumable upload that declares the total size and is deleted on an
        # error. A buffered file (write_bytes) turns resumable past its 5 MiB block and its
        # close() runs even when a chunk failed.
        path.fs.pipe_file(path.path, bytes(data))


def read_object(path: ObjectStoragePath) -> bytes:
    """The bytes stored at ``path``.

    :raises FileNotFoundError: nothing is stored there.
    """
    return bytes(path.read_bytes())
