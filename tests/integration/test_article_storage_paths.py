"""Step outputs and published pages land in the folder the storage URI names, whatever its spelling.

``default_base()`` and ``make run`` build their URIs with ``Path.as_uri()``, which percent-encodes
a space or a non-ASCII letter (``/home/josé`` -> ``/home/jos%C3%A9``); read back through the plain
file system, never through the store.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest

from onceflow.articles.publish import publish_path
from onceflow.hooks.storage import STORAGE_DIR_ENV, StorageHook


@pytest.fixture
def storage_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "mis artículos"
    monkeypatch.setenv(STORAGE_DIR_ENV, str(folder))
    monkeypatch.delenv("AIRFLOW_CONN_ONCEFLOW_STORAGE", raising=False)
    return folder


def test_step_outputs_land_in_the_storage_folder_not_one_named_by_its_escapes(storage_dir: Path) -> None:
    store = StorageHook().step_store()

    uri = store.write("0123abcd", "v1", "fetch", 7, "raw.html", b"<p>hola</p>")

    assert (storage_dir / "articles/0123abcd/v1/fetch.7.raw.html").read_bytes() == b"<p>hola</p>"
    assert store.read(uri) == b"<p>hola</p>"
    assert sorted(p.name for p in storage_dir.parent.iterdir()) == [
        "mis artículos"
    ]  # no "mis%20art%C3%ADculos"


def test_published_pages_land_where_their_link_points(storage_dir: Path) -> None:
    result = StorageHook().publisher().publish(publish_path("0123abcd", "v1"), b"<p>hola</p>")

    page = storage_dir / "published/articles/0123abcd/v1/index.html"
    assert page.read_bytes() == b"<p>hola</p>"
    assert result.url.startswith("file://")
    assert Path(url2pathname(urlsplit(result.url).path)) == page  # the link opens that very file
    assert sorted(os.listdir(storage_dir.parent)) == ["mis artículos"]


def test_a_literal_percent_in_the_storage_folder_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ONCEFLOW_STORAGE_DIR=/x/50%41`` names that folder, not ``/x/50A`` (decoded once, not twice)."""
    folder = tmp_path / "50%41"
    monkeypatch.setenv(STORAGE_DIR_ENV, str(folder))
    monkeypatch.delenv("AIRFLOW_CONN_ONCEFLOW_STORAGE", raising=False)
    store = StorageHook().step_store()

    uri = store.write("0123abcd", "v1", "fetch", 7, "raw.html", b"<p>hola</p>")

    assert (folder / "articles/0123abcd/v1/fetch.7.raw.html").read_bytes() == b"<p>hola</p>"
    assert os.listdir(tmp_path) == ["50%41"]
    assert StorageHook().step_store().read(uri) == b"<p>hola</p>"


def test_a_step_output_uri_in_either_spelling_reads_the_same_file(storage_dir: Path) -> None:
    """An output URI committed before outputs were percent-encoded (``file:///mis artículos/...``)
    still reads; a ``%2E%2E`` cannot climb out of ``articles/``."""
    store = StorageHook().step_store()
    uri = store.write("0123abcd", "v1", "fetch", 7, "raw.html", b"<p>hola</p>")
    final = storage_dir / "articles/0123abcd/v1/fetch.7.raw.html"

    assert uri == final.as_uri()
    assert store.read("file://" + str(final)) == b"<p>hola</p>"
    (storage_dir / "secret.txt").write_bytes(b"no")
    with pytest.raises(ValueError, match="not a step output"):
        store.read(storage_dir.as_uri() + "/articles/%2E%2E/secret.txt")
