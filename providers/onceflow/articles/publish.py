"""Publish a rendered page, create-only, to a deterministic path: local files or GCS.

A page is published at most once per article and processing version: the path is a function of
the row key and the version (:func:`publish_path`), and the write can only *create* it.

* Local files: the page goes into a temp file of this writer's own (``O_CREAT | O_EXCL``), then
  ``os.link`` gives it its final name. ``link`` fails with ``EEXIST`` if the name exists, and it
  names a complete file, so a crash leaves nothing or the whole page under the final name (at
  worst a hidden ``.index.html.<pid>.<hex>.tmp`` beside it). ``O_EXCL`` on the final name alone
  would be create-only too, but a writer killed mid-write would leave a partial page there that
  every later publish would then call a conflict.
* GCS: ``upload_from_string(..., if_generation_match=0)``: Google creates the object only if no
  live generation exists, atomically, and an upload is visible only once complete. A 412 means
  someone published first.

When the page exists: identical bytes return its URL with ``created=False`` and write nothing
(a retry, a re-run, the loser of a race); different bytes raise :class:`PublishConflict`, never
overwrite. See ``docs/articles.md#publish``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from onceflow.articles.errors import PermanentStepError
from onceflow.articles.page import render_page, sanitize
from onceflow.articles.storage import _segment
from onceflow.files import create_exclusive

__all__ = ["PublishConflict", "PublishResult", "Publisher", "publish_path", "render_page", "sanitize"]

CONTENT_TYPE = "text/html; charset=utf-8"


class PublishConflict(PermanentStepError):
    """A different page already sits at the path of this article and version."""

    def __init__(self, url: str, existing_sha256: str, new_sha256: str) -> None:
        super().__init__(
            f"a different page is already published at {url} for this article and version "
            f"(sha256 {existing_sha256[:12]}, this one {new_sha256[:12]}); bump the processing "
            "version to republish",
            step="publish",
        )
        self.url = url


@dataclass(frozen=True)
class PublishResult:
    """:param url: where the page is reachable. :param created: whether this call created it.
    :param sha256: hex digest of the page's bytes."""

    url: str
    created: bool
    sha256: str


def publish_path(row_key: str, version: str) -> str:
    """``articles/<row key>/<version>/index.html``: one page per article and processing version."""
    return f"articles/{_segment('row_key', row_key)}/{_segment('version', version)}/index.html"


def _check_rel_path(rel_path: str) -> list[str]:
    parts = rel_path.split("/")
    if rel_path.startswith("/") or not all(p and p not in (".", "..") for p in parts):
        raise ValueError(
            f"rel_path must be a relative path without '.', '..' or empty parts, got {rel_path!r}"
        )
    return [_segment("rel_path part", p) for p in parts]


class Publisher:
    """Create-only writes under ``publish_base``.

    :param publish_base: ``file:///abs/path`` or ``gs://bucket/prefix``.
    :param public_url: the URL prefix ``publish_base`` is served under.
    :param gcs_client: a ``google.cloud.storage.Client`` (required for ``gs://``).
    """

    def __init__(self, publish_base: str, public_url: str, *, gcs_client: Any = None) -> None:
        parts = urlsplit(publish_base)
        self.public_url = public_url.rstrip("/")
        if parts.scheme == "file":
            # a file URI spells its path percent-encoded (Path.as_uri: "my dir" -> "my%20dir")
            self.root: str | None = unquote(parts.path)
            self.bucket = self.prefix = ""
        elif parts.scheme in ("gs", "gcs"):
            if gcs_client is None:
                raise ValueError("a gs:// publish_base needs a gcs_client")
            self.root = None
            self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
        else:
            raise ValueError(f"publish_base must be file:///... or gs://..., got {publish_base!r}")
        self.client = gcs_client

    def url(self, rel_path: str) -> str:
        """The public URL of ``rel_path``."""
        return f"{self.public_url}/{quote('/'.join(_check_rel_path(rel_path)))}"

    def publish(self, rel_path: str, data: bytes) -> PublishResult:
        """Create ``rel_path`` with ``data`` unless it exists.

        :return: its URL; ``created`` is True only for the call whose write created it.
        :raises PublishConflict: it exists with other bytes (nothing is overwritten).
        """
        parts = _check_rel_path(rel_path)
        digest = hashlib.sha256(data).hexdigest()
        url = self.url(rel_path)
        if self.root is not None:
            created, existing = _create_local(os.path.join(self.root, *parts), bytes(data))
        else:
            created, existing = self._create_gcs(
                "/".join([p for p in [self.prefix] if p] + parts), bytes(data)
            )
        if not created and existing != data:
            raise PublishConflict(url, hashlib.sha256(existing or b"").hexdigest(), digest)
        return PublishResult(url, created, digest)

    def _create_gcs(self, name: str, data: bytes) -> tuple[bool, bytes | None]:
        from google.api_core.exceptions import PreconditionFailed

        blob = self.client.bucket(self.bucket).blob(name)
        try:
            # generation 0: create only if no live object exists (Google's ifGenerationMatch=0)
            blob.upload_from_string(data, content_type=CONTENT_TYPE, if_generation_match=0)
            return True, None
        except PreconditionFailed:
            # someone created it first, or our own upload did and its reply was lost (the client
            # retries a conditional upload): the bytes decide
            return False, bytes(self.client.bucket(self.bucket).blob(name).download_as_bytes())


def _create_local(final: str, data: bytes) -> tuple[bool, bytes | None]:
    """Create ``final`` with ``data`` if it does not exist: (created, existing bytes if not)."""
    try:
        with open(final, "rb") as existing:  # already there: compare, write nothing
            return False, existing.read()
    except FileNotFoundError:
        pass
    if create_exclusive(final, data):
        return True, None
    with open(final, "rb") as existing:  # someone linked first
        return False, existing.read()
