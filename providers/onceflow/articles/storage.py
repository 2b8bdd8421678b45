"""Step outputs of the article chain: ``<base>/articles/<row key>/<version>/<step>.<token>.<name>``.

Each keyed step writes its output here *before* it commits its ledger result, and the result
names the URI, so the next step reads exactly what the committed try wrote. The step's fencing
token is in the name: a stale try (its lease taken over) writes beside the newer try's output,
never over it, and the ledger refuses its commit, so its file is simply never read.

Every write is atomic (:mod:`onceflow.objects`, shared with daily_sales' staging): a reader (or a
crash) sees the whole output or nothing under the final name. Local files: a temp file unique to
the writer (pid and 64 random bits) in the same directory, fsynced, then ``os.replace``. GCS: one
object upload, which Google (and the emulator) only makes visible when complete, so there is no
temp object to share or leave behind.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from onceflow.objects import is_local, read_object, storage_path, uri_of, write_object

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")


def _segment(what: str, value: str) -> str:
    # one path segment: no "/", not "." or ".." (no leading dot at all), nothing a shell or URL
    # would reinterpret; inner dots are plain characters ("v1..2" is a processing version)
    if not isinstance(value, str) or not _SEGMENT_RE.fullmatch(value):
        raise ValueError(
            f"{what} must match [A-Za-z0-9_.-], not start with '.', at most 128 characters, got {value!r}"
        )
    return value


def _escapes(path: str) -> bool:
    return "/../" in path or path.endswith("/..")


class StepStore:
    """Atomic, fenced step outputs under one base (an ``ObjectStoragePath``, or a URI string).

    :param base: ``file:///abs/path`` or ``gs://bucket/prefix`` (through
        :meth:`onceflow.hooks.storage.StorageHook.step_store`, which gives gs:// its filesystem).
    """

    def __init__(self, base: ObjectStoragePath | str) -> None:
        # a file URI is read percent-decoded (Path.as_uri: "my dir" -> "my%20dir")
        self.base = storage_path(base)
        self.local = is_local(self.base)

    def _uri(self, path: ObjectStoragePath) -> str:
        return uri_of(path)

    def location(self, row_key: str, version: str, step: str, token: int, name: str) -> ObjectStoragePath:
        """Where that output lives (whether or not it was written)."""
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"token must be a fencing token (an int >= 0), got {token!r}")
        folder = self.base / "articles" / _segment("row_key", row_key) / _segment("version", version)
        return folder / f"{_segment('step', step)}.{token}.{_segment('name', name)}"

    def write(self, row_key: str, version: str, step: str, token: int, name: str, data: bytes) -> str:
        """Store ``data`` atomically; return its URI (give it to the ledger result).

        Writing the same output again (a repeated call of the same try) replaces it whole.
        """
        path = self.location(row_key, version, step, token, name)
        write_object(path, data)
        return self._uri(path)

    def _resolve(self, uri: str) -> ObjectStoragePath:
        base = self._uri(self.base).rstrip("/") + "/articles/"
        if self.local:
            # compared decoded: a URI written before outputs were percent-encoded
            # ("file:///my dir/...") names the same file as "file:///my%20dir/..."
            target = storage_path(uri) if uri.startswith("file://") else None
            inside = self.base.path.rstrip("/") + "/articles/"
            if target is None or not target.path.startswith(inside) or _escapes(target.path):
                raise ValueError(f"{uri!r} is not a step output under {base}")
            return target
        if not uri.startswith(base) or _escapes(uri):
            raise ValueError(f"{uri!r} is not a step output under {base}")
        return self.base / "articles" / uri[len(base) :]

    def read(self, uri: str) -> bytes:
        """The bytes stored at ``uri`` (a URI :meth:`write` returned).

        :raises ValueError: a URI outside this store's ``articles/`` folder.
        :raises FileNotFoundError: nothing is stored there.
        """
        return read_object(self._resolve(uri))

    def write_json(self, row_key: str, version: str, step: str, token: int, name: str, value: Any) -> str:
        """:meth:`write` of ``value`` as UTF-8 JSON (keys sorted, so equal values give equal bytes)."""
        data = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return self.write(row_key, version, step, token, name, data)

    def read_json(self, uri: str) -> Any:
        """:meth:`read`, decoded from JSON."""
        return json.loads(self.read(uri).decode("utf-8"))
