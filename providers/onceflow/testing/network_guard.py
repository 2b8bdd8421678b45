"""A guard that keeps a test suite's packets on this machine, in pytest and in every child process.

An audit hook (:func:`sys.addaudithook`) sees each socket operation before the system call: a
``connect``, ``sendto`` or ``sendmsg`` to anything but 127.0.0.0/8, ``::1`` or a Unix socket, and a
name lookup of anything but ``localhost`` (names ``/etc/hosts`` lists, numeric addresses and the
names a test allows) raise :class:`NetworkGuardError` at once, naming the address
and the test. Nothing has been sent when it raises.

The pytest plugin installs it in the pytest process and exports the environment below, so every
Python child (Airflow's api-server, scheduler, dag-processor, triggerer, task processes, Celery
workers, the emulators, ``make run`` under test) installs it at start-up through the
``sitecustomize`` in ``network_guard_site/``, which the plugin puts first on ``PYTHONPATH``. A
refusal may be swallowed by the code that caused it (a retry loop, a task's error handling, another
process), so each one is also appended to a log file that the plugin reads after every test phase:
any refusal fails the test during which it was logged, and the session.

What the guard cannot see: sockets opened by C libraries without Python's socket module (libpq,
gRPC's C core, uvloop: kept out of guarded processes), processes started with ``-I``, ``-E`` or
``-S`` or with a ``PYTHONPATH`` that drops the guard's folder, and programs that are not Python
(uv). docs/testing.md lists them and how each is kept on loopback.

A test that needs "a public address" uses :func:`intercept_connects`: inside it, a connect to a
non-loopback address is recorded and refused with :class:`InterceptedConnect` (a
``ConnectionRefusedError``, as a firewall would answer) before any packet leaves.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: "1" in a process's environment: its sitecustomize installs the guard.
ENV_ENABLED = "ONCEFLOW_NETWORK_GUARD"
#: File every refusal is appended to (one JSON object per line), shared by the whole test session.
ENV_LOG = "ONCEFLOW_NETWORK_GUARD_LOG"
#: Extra host names that may be looked up (comma-separated): names a test maps to loopback itself.
ENV_ALLOW_NAMES = "ONCEFLOW_NETWORK_GUARD_ALLOW_NAMES"
#: The folder holding the ``sitecustomize`` that children load first.
SITE_DIR = Path(__file__).with_name("network_guard_site")

_LOOKUPS = {
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.gethostbyaddr",
}
_SENDS = {"socket.connect", "socket.sendto", "socket.sendmsg"}


class NetworkGuardError(RuntimeError):
    """A socket operation that would send a packet beyond loopback (not an ``OSError``, so that no
    retry loop mistakes it for a network failure and hides it)."""


class InterceptedConnect(ConnectionRefusedError):
    """A connect to a non-loopback address, recorded by :func:`intercept_connects` and refused."""


@dataclass
class _State:
    installed: bool = False
    # Taken at install: code under test may clear os.environ, and a refusal must still be logged.
    log_path: str | None = None
    # Names whose lookup stays on this machine: those /etc/hosts lists, and ENV_ALLOW_NAMES.
    local_names: frozenset[str] = frozenset({"localhost"})
    allowed_names: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _State()
# Recorders of intercept_connects(), per thread: another thread's connect is never intercepted
# (a background thread's attempt would otherwise be refused as "firewalled" and never logged).
_local = threading.local()


def _hosts_file_names(path: str = "/etc/hosts") -> set[str]:
    """Names ``/etc/hosts`` lists: the C library answers them from the file (nsswitch ``files``
    first), so looking one up sends no DNS query. Other names, ``localhost.localdomain`` included,
    may go to the DNS server."""
    names: set[str] = set()
    with contextlib.suppress(OSError):
        for line in open(path, encoding="utf-8", errors="replace"):  # noqa: SIM115
            fields = line.split("#", 1)[0].split()
            names.update(n.lower().rstrip(".") for n in fields[1:])
    return names


def _local_names() -> frozenset[str]:
    names = {"localhost"} | _hosts_file_names()
    extra = os.environ.get(ENV_ALLOW_NAMES, "")
    names.update(n.strip().lower().rstrip(".") for n in extra.split(",") if n.strip())
    return frozenset(names)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if ":" in host:
        host = host.split("%", 1)[0]  # an IPv6 scope id is not part of the address
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """True for an address in 127.0.0.0/8 or ``::1`` (also IPv4-mapped), given as text."""
    ip = _ip(host)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def name_allowed(host: str) -> bool:
    """Whether looking ``host`` up may happen: a numeric address (no packet is sent to resolve
    one), ``localhost``, a name ``/etc/hosts`` lists (this machine's host name, usually), or a
    name a test allowed."""
    name = host.lower().rstrip(".")
    if not name or _ip(name) is not None:
        return True
    local = _state.local_names if _state.installed else _local_names()
    return name in local or name in _state.allowed_names


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("idna", "replace")
    return str(value)


def _destination(sock: Any, address: Any) -> str | None:
    """The address as text when the guard must refuse it; None when it stays on this machine."""
    family = getattr(sock, "family", None)
    if family == socket.AF_UNIX or isinstance(address, str | bytes | bytearray):
        return None  # a Unix socket path (or abstract name)
    if family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple) or not address:
        return None  # netlink and other local families
    host = _text(address[0])
    port = address[1] if len(address) > 1 else "?"
    if is_loopback(host):
        return None
    if _ip(host) is None and name_allowed(host) and _resolves_to_loopback(host):
        return None  # a name the C library resolves itself (from /etc/hosts) to loopback only
    return f"{host} port {port}"


def _resolves_to_loopback(host: str) -> bool:
    try:  # audited too, and allowed: name_allowed(host) holds
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(is_loopback(str(info[4][0])) for info in infos)


def _who() -> str:
    test = os.environ.get("PYTEST_CURRENT_TEST") or "no test"
    return f"test {test!r}, pid {os.getpid()} ({' '.join(sys.argv[:2])[:120]})"


def _log(event: str, target: str, message: str) -> None:
    path = _state.log_path or os.environ.get(ENV_LOG)
    if not path:
        return
    line = json.dumps(
        {
            "time": time.time(),
            "pid": os.getpid(),
            "argv": sys.argv[:3],
            "test": os.environ.get("PYTEST_CURRENT_TEST"),
            "event": event,
            "target": target,
            "message": message,
        }
    )
    # O_APPEND: lines from many processes never interleave (each write is one short line).
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def _refuse(event: str, target: str) -> None:
    message = (
        f"onceflow network guard: {event}: {target} refused: tests never send a packet beyond "
        f"loopback (127.0.0.0/8, ::1); fake the remote host at the socket (docs/testing.md); {_who()}"
    )
    _log(event, target, message)
    raise NetworkGuardError(message)


def check(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: refuse ``event`` when it would leave this machine, else return."""
    if event[:7] != "socket.":
        return
    if event in _SENDS:
        target = _destination(args[0], args[1])
        if target is None:
            return
        if event == "socket.connect":
            recorders = getattr(_local, "recorders", None)
            recorder = recorders[-1] if recorders else None
            if recorder is not None:
                host, port = _text(args[1][0]), int(args[1][1])
                recorder.append((host, port))
                raise InterceptedConnect(f"intercepted by the test: connect to {host} port {port}")
        _refuse(event, target)
    elif event in _LOOKUPS:
        host = args[0]
        if host is None:
            return
        text = _text(host)
        if event == "socket.gethostbyaddr" and _ip(text) is not None and not is_loopback(text):
            _refuse(event, f"reverse lookup of {text}")
        if not name_allowed(text):
            _refuse(event, f"name lookup of {text!r}")
    elif event == "socket.getnameinfo":
        sockaddr = args[0]
        if isinstance(sockaddr, tuple) and sockaddr and not is_loopback(_text(sockaddr[0])):
            _refuse(event, f"reverse lookup of {_text(sockaddr[0])}")


def install() -> None:
    """Install the audit hook in this process (once; an audit hook cannot be removed)."""
    with _state.lock:
        if _state.installed:
            return
        _state.log_path = os.environ.get(ENV_LOG)
        _state.local_names = _local_names()
        _state.installed = True
    sys.addaudithook(check)
    # uvloop opens its sockets in C (libuv) with no audit event; uvicorn (Airflow's api-server)
    # picks it when importable. Without it, uvicorn's "auto" loop is asyncio, which is audited.
    sys.modules.setdefault("uvloop", None)  # type: ignore[arg-type]


def installed() -> bool:
    """Whether this process refuses non-loopback traffic."""
    return _state.installed


def child_environment(log_path: Path | str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that make every Python child install the guard and log to ``log_path``.

    Also ``NO_GCE_CHECK=true``: google-auth then never probes the metadata server
    (169.254.169.254) when a client has no credentials; if anything probes anyway, the guard
    refuses it and the test fails.
    """
    base = dict(os.environ if base is None else base)
    path = [str(SITE_DIR), *[p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {
        ENV_ENABLED: "1",
        ENV_LOG: str(log_path),
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
        "NO_GCE_CHECK": "true",
    }


@contextlib.contextmanager
def allow_names(*names: str) -> Iterator[None]:
    """Allow looking these names up in this process (names a test maps to loopback itself)."""
    added = {n.lower().rstrip(".") for n in names} - _state.allowed_names
    _state.allowed_names.update(added)
    try:
        yield
    finally:
        _state.allowed_names.difference_update(added)


@contextlib.contextmanager
def intercept_connects() -> Iterator[list[tuple[str, int]]]:
    """Record each attempted connect to a non-loopback address made by this thread, and refuse
    it before any packet (other threads' attempts are refused and logged as usual).

    Yields the list of ``(host, port)`` attempted; the code under test sees
    :class:`InterceptedConnect`, a ``ConnectionRefusedError``.
    """
    seen: list[tuple[str, int]] = []
    recorders: list[list[tuple[str, int]]] = _local.__dict__.setdefault("recorders", [])
    recorders.append(seen)
    try:
        yield seen
    finally:
        recorders.remove(seen)


@dataclass
class Refusal:
    """One line of the refusal log."""

    offset: int
    pid: int
    test: str | None
    event: str
    target: str
    message: str
    argv: list[str]


class RefusalLog:
    """Reads the refusals logged since the last read; a test may take (consume) the ones it
    provoked on purpose so they do not fail it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._taken: set[int] = set()

    def _read(self, start: int) -> tuple[list[Refusal], int]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(start)
                data = fh.read()
        except FileNotFoundError:
            return [], start
        end = start + data.rfind(b"\n") + 1  # a line still being written is read next time
        found: list[Refusal] = []
        offset = start
        for raw in data[: end - start].splitlines(keepends=True):
            try:
                rec = json.loads(raw)
                found.append(
                    Refusal(
                        offset=offset,
                        pid=int(rec["pid"]),
                        test=rec.get("test"),
                        event=str(rec["event"]),
                        target=str(rec["target"]),
                        message=str(rec["message"]),
                        argv=list(rec.get("argv") or []),
                    )
                )
            except (ValueError, KeyError, TypeError):
                found.append(Refusal(offset, 0, None, "unreadable", "", raw.decode(errors="replace"), []))
            offset += len(raw)
        return found, end

    def new(self) -> list[Refusal]:
        """Refusals logged since the last call that no test took."""
        found, self._offset = self._read(self._offset)
        return [r for r in found if r.offset not in self._taken]

    def take(self, match: Callable[[Refusal], bool], *, wait: float = 0.0) -> list[Refusal]:
        """Consume the not-yet-reported refusals that ``match`` (waiting up to ``wait`` s for one)."""
        deadline = time.monotonic() + wait
        while True:
            found, _ = self._read(self._offset)
            hits = [r for r in found if r.offset not in self._taken and match(r)]
            if hits or time.monotonic() >= deadline:
                self._taken.update(r.offset for r in hits)
                return hits
            time.sleep(0.1)
