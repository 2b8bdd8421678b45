"""A TCP proxy on 127.0.0.1 that can *freeze*: connections stay open, bytes stop moving.

That is the hang no socket option reports (the proxy's kernel still ACKs, so TCP keepalives and
``tcp_user_timeout`` see a healthy peer) and the one that silenced the watchdog: PostgreSQL
reachable but not answering. ::

    proxy = FreezableProxy("127.0.0.1", 5432).start()
    url = f"postgresql+psycopg2://postgres@127.0.0.1:{proxy.port}/db"
    proxy.freeze()        # every connection, open or new, hangs
    proxy.thaw()          # held bytes flow again
    proxy.cut()           # the store is down: open connections reset, new ones closed at once
    proxy.restore()
    proxy.stop()
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FreezableProxy:
    """Forward ``127.0.0.1:<port>`` to ``host:port``; :meth:`freeze` holds every byte."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._cut = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> FreezableProxy:
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        """Close every open connection and every new one at once (the store is down), until
        :meth:`restore`."""
        self._cut.set()
        self._close_all()

    def restore(self) -> None:
        self._cut.clear()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def stop(self) -> None:
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self._close_all()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(None)
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            self._flowing.wait()  # frozen: hold the bytes, keep both connections open
            try:
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
