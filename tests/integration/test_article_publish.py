"""Create-only publishing: local files and GCS (fake-gcs-server, real google-cloud-storage client).

Races really race (processes started at one barrier), crashes really crash (SIGKILL), and every
outcome is read back independently: the file system with ``open``/``os.listdir``, the emulator
over its JSON API with ``urllib`` (:meth:`FakeGcs.objects`).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.articles.publish import PublishConflict, Publisher, publish_path, render_page
from onceflow.testing.gcs_fixtures import StallingProxy

if TYPE_CHECKING:
    from onceflow.testing.gcs_fixtures import FakeGcs

PUBLIC = "http://127.0.0.1:8765/published"
CTX = multiprocessing.get_context("spawn")  # children start clean: no inherited client or lock


def _page(n: int = 0) -> bytes:
    return render_page(
        f"Article {n}", f"<p>Body {n}</p>", f"https://news.example.es/{n}", "Apertium", 0.9, "en"
    )


def _publisher(kind: str, base: str, endpoint: str | None) -> Publisher:
    if kind == "gs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(
            project="onceflow-test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": endpoint},
        )
        return Publisher(base, PUBLIC, gcs_client=client)
    return Publisher(base, PUBLIC)


# -- workers (run in child processes) ----------------------------------------------------------------


def _race_worker(
    kind: str, base: str, endpoint: str | None, jobs: list[tuple[str, bytes]], barrier: Any, out: Any
) -> None:
    publisher = _publisher(kind, base, endpoint)
    for rel_path, data in jobs:
        barrier.wait()
        try:
            result = publisher.publish(rel_path, data)
            out.put((os.getpid(), rel_path, "created" if result.created else "exists", result.url))
        except PublishConflict as err:
            out.put((os.getpid(), rel_path, "conflict", err.url))


def _stuck_local_writer(base: str, rel_path: str, data: bytes, chunk: int, mid: Any) -> None:
    """Publish, but the disk takes ``chunk`` bytes and then hangs (os.write may write less than
    asked; the publisher loops): the process is certainly mid-write when ``mid`` is set."""
    real_write = os.write
    calls = 0

    def slow_write(fd: int, buf: Any) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            mid.set()
            time.sleep(3600)
        return real_write(fd, bytes(buf[:chunk]))

    os.write = slow_write  # type: ignore[assignment]
    Publisher(base, PUBLIC).publish(rel_path, data)


def _gcs_writer(base: str, endpoint: str, rel_path: str, data: bytes) -> None:
    _publisher("gs", base, endpoint).publish(rel_path, data)


# -- helpers -----------------------------------------------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _race(
    kind: str, base: str, endpoint: str | None, jobs_per_worker: list[list[tuple[str, bytes]]]
) -> list[Any]:
    barrier = CTX.Barrier(len(jobs_per_worker), timeout=60)  # a worker that died breaks it
    out = CTX.Queue()
    procs = [
        CTX.Process(target=_race_worker, args=(kind, base, endpoint, jobs, barrier, out))
        for jobs in jobs_per_worker
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=90) for _ in range(sum(len(j) for j in jobs_per_worker))]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:  # a failed race leaves no worker behind
            if p.is_alive():
                p.kill()
                p.join(10)
    return results


@pytest.fixture(params=["file", "gs"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Where to publish: a local folder, or a fresh bucket on the fake GCS server."""
    if request.param == "file":
        root = tmp_path / "published"
        return {
            "kind": "file",
            "base": root.as_uri(),
            "endpoint": None,
            "objects": lambda: _files(root),
            "prefix": "",
        }
    gcs: FakeGcs = request.getfixturevalue("fake_gcs")
    bucket = gcs.bucket()
    return {
        "kind": "gs",
        "base": f"gs://{bucket}/site",
        "endpoint": gcs.url,
        "objects": lambda: {k.removeprefix("site/"): v for k, v in gcs.objects(bucket).items()},
        "prefix": "site/",
    }


# -- tests -------------------------------------------------------------------------------------------


def test_publish_creates_once_and_a_re_publish_returns_the_same_url_writing_nothing(
    target: dict[str, Any],
) -> None:
    publisher = _publisher(target["kind"], target["base"], target["endpoint"])
    rel = publish_path("3f2a9c", "v1")
    assert rel == "articles/3f2a9c/v1/index.html"
    page = _page()
    first = publisher.publish(rel, page)
    assert first.created and first.url == f"{PUBLIC}/articles/3f2a9c/v1/index.html"
    assert first.sha256 == hashlib.sha256(page).hexdigest()
    assert target["objects"]() == {rel: page}
    again = publisher.publish(rel, page)
    assert (again.url, again.created, again.sha256) == (first.url, False, first.sha256)
    assert target["objects"]() == {rel: page}, "no temp file or second object left behind"


def test_a_different_page_at_the_same_path_is_a_conflict_never_an_overwrite(target: dict[str, Any]) -> None:
    publisher = _publisher(target["kind"], target["base"], target["endpoint"])
    rel = publish_path("k", "v1")
    publisher.publish(rel, _page(1))
    with pytest.raises(PublishConflict, match="bump the processing version to republish") as caught:
        publisher.publish(rel, _page(2))
    assert caught.value.url == f"{PUBLIC}/{rel}" and caught.value.step == "publish"
    assert target["objects"]() == {rel: _page(1)}
    # a new processing version is a new path
    assert publisher.publish(publish_path("k", "v2"), _page(2)).created


def test_two_processes_racing_to_publish_the_same_page_create_it_once(target: dict[str, Any]) -> None:
    rels = [publish_path(f"race{i}", "v1") for i in range(6)]
    jobs = [(rel, _page(i)) for i, rel in enumerate(rels)]
    results = _race(target["kind"], target["base"], target["endpoint"], [jobs, jobs])
    for rel in rels:
        outcomes = sorted(r[2] for r in results if r[1] == rel)
        assert outcomes == ["created", "exists"], (rel, outcomes)
        assert len({r[3] for r in results if r[1] == rel}) == 1, "both get the same URL"
    assert target["objects"]() == dict(jobs), "exactly one object per page, whole"


def test_two_different_pages_racing_for_one_path_leave_the_winners_page(target: dict[str, Any]) -> None:
    rels = [publish_path(f"clash{i}", "v1") for i in range(4)]
    a = [(rel, _page(100 + i)) for i, rel in enumerate(rels)]
    b = [(rel, _page(200 + i)) for i, rel in enumerate(rels)]
    results = _race(target["kind"], target["base"], target["endpoint"], [a, b])
    stored = target["objects"]()
    for i, rel in enumerate(rels):
        outcomes = sorted(r[2] for r in results if r[1] == rel)
        assert outcomes == ["conflict", "created"], (rel, outcomes)
        winner = next(r[0] for r in results if r[1] == rel and r[2] == "created")
        assert stored[rel] in (a[i][1], b[i][1])
        loser_page = b[i][1] if stored[rel] == a[i][1] else a[i][1]
        assert loser_page != stored[rel] and winner  # the loser raised, its page is nowhere
    assert len(stored) == len(rels)


def test_a_local_writer_killed_mid_write_leaves_nothing_under_the_final_name(tmp_path: Path) -> None:
    root = tmp_path / "published"
    rel = publish_path("killed", "v1")
    page = _page() + b"<!--" + b"x" * (4 << 20) + b"-->"
    mid = CTX.Event()
    child = CTX.Process(target=_stuck_local_writer, args=(root.as_uri(), rel, page, 1 << 20, mid))
    child.start()
    try:
        assert mid.wait(60), "the writer never got going"
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
    folder = root / "articles" / "killed" / "v1"
    assert not (folder / "index.html").exists(), "a partial page under the final name"
    temps = list(folder.iterdir())
    assert len(temps) == 1 and temps[0].name.startswith(".index.html.") and temps[0].stat().st_size == 1 << 20
    # the next try publishes the whole page; the dead writer's temp file does not get in its way
    result = Publisher(root.as_uri(), PUBLIC).publish(rel, page)
    assert result.created and (folder / "index.html").read_bytes() == page


def test_a_gcs_writer_killed_mid_upload_leaves_no_object(fake_gcs: FakeGcs) -> None:
    bucket = fake_gcs.bucket()
    host, port = fake_gcs.url.removeprefix("http://").split(":")
    proxy = StallingProxy((host, int(port)), stall_after=1 << 20)
    rel = publish_path("killed", "v1")
    page = _page() + b"<!--" + b"x" * (4 << 20) + b"-->"
    child = CTX.Process(target=_gcs_writer, args=(f"gs://{bucket}/site", proxy.url, rel, page))
    child.start()
    proxy.kill_when_stalled(child, timeout=60)
    assert fake_gcs.objects(bucket) == {}, "a partial object is visible"
    result = _publisher("gs", f"gs://{bucket}/site", fake_gcs.url).publish(rel, page)
    assert result.created and fake_gcs.objects(bucket) == {f"site/{rel}": page}


def test_bad_paths_and_bases_are_refused(tmp_path: Path) -> None:
    publisher = Publisher(tmp_path.as_uri(), PUBLIC)
    for rel in ["../escape/index.html", "/abs/index.html", "articles//x", "articles/./x", "a/b c/index.html"]:
        with pytest.raises(ValueError, match="rel_path"):
            publisher.publish(rel, b"x")
    with pytest.raises(ValueError, match="row_key"):
        publish_path("../k", "v1")
    with pytest.raises(ValueError, match="publish_base"):
        Publisher("s3://bucket/x", PUBLIC)
    with pytest.raises(ValueError, match="gcs_client"):
        Publisher("gs://bucket/x", PUBLIC)
    assert list(tmp_path.iterdir()) == []


def test_the_hook_publishes_through_the_connection_to_fake_gcs(
    fake_gcs: FakeGcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow.hooks.storage import StorageHook

    bucket = fake_gcs.bucket()
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_STORAGE",
        fake_gcs.connection_json(base=f"gs://{bucket}/steps", public_url="https://pages.example.org/site/"),
    )
    publisher = StorageHook().publisher()
    result = publisher.publish(publish_path("k", "v1"), _page())
    assert result.url == "https://pages.example.org/site/articles/k/v1/index.html"
    assert fake_gcs.objects(bucket) == {"steps/published/articles/k/v1/index.html": _page()}
    assert json.loads(fake_gcs.connection_json())["extra"]["endpoint"] == fake_gcs.url
