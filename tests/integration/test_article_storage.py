"""Step outputs through ``StorageHook`` and Airflow's ``ObjectStoragePath``: local files and GCS
(fake-gcs-server through gcsfs).

What is stored is read back independently: the file system with ``open``, the emulator over its
JSON API with ``urllib``. Crashes are real SIGKILLs of a child process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.hooks.storage import StorageConfigError, StorageHook, parse_config
from onceflow.testing.gcs_fixtures import StallingProxy

if TYPE_CHECKING:
    from onceflow.testing.gcs_fixtures import FakeGcs

CONN = "AIRFLOW_CONN_ONCEFLOW_STORAGE"
CTX = multiprocessing.get_context("spawn")


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ``onceflow_storage`` connection; ``ONCEFLOW_STORAGE_DIR`` names the folder."""
    monkeypatch.delenv(CONN, raising=False)
    root = tmp_path / "storage"
    monkeypatch.setenv("ONCEFLOW_STORAGE_DIR", str(root))
    return root


# -- workers (child processes) -----------------------------------------------------------------------


def _stuck_writer(data: bytes, chunk: int, mid: Any, go: Any) -> None:
    """StepStore.write whose disk takes ``chunk`` bytes, then waits for ``go`` (or forever)."""
    real_write = os.write
    calls = 0

    def slow_write(fd: int, buf: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            mid.set()
            go.wait(3600)
        return real_write(fd, bytes(buf[:chunk]))

    os.write = slow_write  # type: ignore[assignment]
    StorageHook().step_store().write("k", "v1", "fetch", 7, "raw.html", data)


def _gcs_step_writer(data: bytes) -> None:
    StorageHook().step_store().write("k", "v1", "fetch", 7, "raw.html", data)


def _kill(child: Any) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL


def _end(child: Any) -> None:
    if child.is_alive():
        child.kill()
        child.join(10)


# -- local files -------------------------------------------------------------------------------------


def test_outputs_are_keyed_by_article_version_step_and_token_on_local_files(local: Path) -> None:
    from airflow.sdk import ObjectStoragePath

    store = StorageHook().step_store()
    assert isinstance(store.base, ObjectStoragePath) and store.base.protocol == "file"
    uri = store.write("3f2a", "v1", "fetch", 7, "raw.html", b"<html>7</html>")
    final = local / "articles" / "3f2a" / "v1" / "fetch.7.raw.html"
    assert uri == final.as_uri()
    assert final.read_bytes() == b"<html>7</html>" and store.read(uri) == b"<html>7</html>"
    # a stale try (older token) writes beside the newer try's output, never over it
    stale = store.write("3f2a", "v1", "fetch", 6, "raw.html", b"<html>stale</html>")
    assert stale != uri and final.read_bytes() == b"<html>7</html>"
    doc = store.write_json("3f2a", "v1", "extract", 8, "text.json", {"title": "=1+1", "lang": "es", "b": [1]})
    assert json.loads((final.parent / "extract.8.text.json").read_text("utf-8"))["title"] == "=1+1"
    assert store.read_json(doc) == {"title": "=1+1", "lang": "es", "b": [1]}
    assert sorted(p.name for p in final.parent.iterdir()) == [
        "extract.8.text.json",
        "fetch.6.raw.html",
        "fetch.7.raw.html",
    ]


def test_without_the_connection_or_the_env_storage_is_under_airflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONN, raising=False)
    monkeypatch.delenv("ONCEFLOW_STORAGE_DIR", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    hook = StorageHook()
    assert hook.config.base == (tmp_path / "home" / "onceflow" / "storage").as_uri()
    assert hook.config.publish_base == hook.config.base + "/published" == hook.config.public_url


def test_a_writer_killed_mid_write_leaves_the_previous_output_or_nothing(local: Path) -> None:
    final = local / "articles" / "k" / "v1" / "fetch.7.raw.html"
    big = b"x" * (3 << 20)
    for before in (None, b"<html>complete</html>"):
        if before is not None:
            StorageHook().step_store().write("k", "v1", "fetch", 7, "raw.html", before)
        mid, go = CTX.Event(), CTX.Event()
        child = CTX.Process(target=_stuck_writer, args=(big, 1 << 20, mid, go))
        child.start()
        try:
            assert mid.wait(60), "the writer never got going"
            _kill(child)
        finally:
            _end(child)
        if before is None:
            assert not final.exists(), "a partial output under the final name"
        else:
            assert final.read_bytes() == before, "the complete output was replaced by a partial one"
        partial = [p for p in final.parent.iterdir() if p.name.startswith(".fetch.7.raw.html.")]
        assert partial and all(p.stat().st_size == 1 << 20 for p in partial)  # it was mid-write
        for p in partial:
            p.unlink()


def test_two_live_writers_of_one_output_never_share_a_temp_file(local: Path) -> None:
    final = local / "articles" / "k" / "v1" / "fetch.7.raw.html"
    slow, fast = b"A" * (3 << 20), b"B" * (2 << 20)
    mid, go = CTX.Event(), CTX.Event()
    child = CTX.Process(target=_stuck_writer, args=(slow, 1 << 20, mid, go))
    child.start()
    try:
        assert mid.wait(60)
        # while A is halfway through, B writes the same output completely
        StorageHook().step_store().write("k", "v1", "fetch", 7, "raw.html", fast)
        assert final.read_bytes() == fast
        go.set()  # A goes on writing into its own temp file, then renames it whole
        child.join(60)
        assert child.exitcode == 0
    finally:
        _end(child)
    assert final.read_bytes() == slow, "the last complete write wins, never a mix"
    assert [p.name for p in final.parent.iterdir()] == ["fetch.7.raw.html"], "no temp file left"


def test_bad_keys_and_foreign_uris_are_refused(local: Path) -> None:
    store = StorageHook().step_store()
    for bad in (
        {"row_key": "../etc"},
        {"version": "v 1"},
        {"step": "a/b"},
        {"name": ".."},
        {"token": -1},
        {"token": True},
    ):
        args: dict[str, Any] = {
            "row_key": "k",
            "version": "v1",
            "step": "fetch",
            "token": 1,
            "name": "x",
            **bad,
        }
        with pytest.raises(ValueError, match=next(iter(bad))):
            store.write(data=b"x", **args)
    (local / "secret.txt").parent.mkdir(parents=True, exist_ok=True)
    (local / "secret.txt").write_text("no")
    for uri in [
        (local / "secret.txt").as_uri(),
        "file:///etc/passwd",
        store.base.as_uri() + "/articles/../secret.txt",
    ]:
        with pytest.raises(ValueError, match="is not a step output"):
            store.read(uri)
    assert not (local / "articles").exists()


@pytest.mark.parametrize(
    ("extras", "key"),
    [
        ({"base": "s3://bucket/x"}, "'base'"),
        ({"base": "file://relative/path"}, "'base'"),
        ({"base": ""}, None),
        ({"publish_base": "gs://"}, "'publish_base'"),
        ({"public_url": "ftp://host/x"}, "'public_url'"),
        ({"public_url": "https://"}, "'public_url'"),
        ({"endpoint": 4443}, "'endpoint'"),
        ({"endpoint": "ftp://127.0.0.1:4443"}, "'endpoint'"),
        ({"project": 7}, "'project'"),
    ],
)
def test_bad_extras_are_refused_naming_the_key(extras: dict[str, Any], key: str | None) -> None:
    if key is None:  # an empty base falls back to the default
        assert parse_config(extras, "file:///tmp/x").base == "file:///tmp/x"
        return
    with pytest.raises(StorageConfigError, match=key):
        parse_config(extras, "file:///tmp/x")


def test_gcs_defaults_and_emulator_host_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    config = parse_config({"base": "gs://bucket/steps/"}, "file:///unused")
    assert config.base == "gs://bucket/steps"
    assert config.publish_base == "gs://bucket/steps/published"
    assert config.public_url == "https://storage.googleapis.com/bucket/steps/published"
    assert config.endpoint == "http://127.0.0.1:4443"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "default")  # the clients' spelling of "not set"
    assert parse_config({"base": "gs://bucket"}, "file:///unused").endpoint is None


# -- GCS (fake-gcs-server) ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["endpoint extra", "STORAGE_EMULATOR_HOST"])
def test_outputs_on_gcs_through_object_storage_path(
    fake_gcs: FakeGcs, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    bucket = fake_gcs.bucket()
    if how == "endpoint extra":
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        monkeypatch.setenv(CONN, fake_gcs.connection_json(base=f"gs://{bucket}/steps"))
    else:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url)
        monkeypatch.setenv(
            CONN,
            json.dumps({"conn_type": "google_cloud_platform", "extra": {"base": f"gs://{bucket}/steps"}}),
        )
    hook = StorageHook()
    store = hook.step_store()
    assert store.base.protocol in ("gs", "gcs") and hook.path(f"gs://{bucket}/steps").protocol in (
        "gs",
        "gcs",
    )
    uri = store.write("3f2a", "v1", "fetch", 7, "raw.html", b"<html>7</html>")
    assert uri == f"gs://{bucket}/steps/articles/3f2a/v1/fetch.7.raw.html"
    doc = store.write_json("3f2a", "v1", "score", 9, "score.json", {"score": 0.5})
    assert fake_gcs.objects(bucket) == {
        "steps/articles/3f2a/v1/fetch.7.raw.html": b"<html>7</html>",
        "steps/articles/3f2a/v1/score.9.score.json": b'{"score":0.5}',
    }
    assert store.read(uri) == b"<html>7</html>" and store.read_json(doc) == {"score": 0.5}
    with pytest.raises(ValueError, match="is not a step output"):
        store.read(f"gs://{bucket}/other/x")


def test_a_gcs_writer_killed_mid_upload_leaves_no_object(
    fake_gcs: FakeGcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = fake_gcs.bucket()
    host, port = fake_gcs.url.removeprefix("http://").split(":")
    proxy = StallingProxy((host, int(port)), stall_after=1 << 20)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv(
        CONN,
        json.dumps(
            {
                "conn_type": "google_cloud_platform",
                "extra": {"base": f"gs://{bucket}/steps", "endpoint": proxy.url},
            }
        ),
    )
    child = CTX.Process(target=_gcs_step_writer, args=(b"y" * (3 << 20),))
    child.start()
    try:
        assert proxy.stalled.wait(120), "the upload never got going"
        _kill(child)
    finally:
        proxy.close()
        _end(child)
    time.sleep(0.5)  # let the emulator notice the cut connection
    assert fake_gcs.objects(bucket) == {}, "a partial object is visible"
