"""A guard that keeps a test suite's packets on this machine, in pytest and in every child process.

An audit hook (:func:`sys.addaudithook`) sees each socket operation before the system call: a
``connect``, ``sendto`` or ``sendmsg`` to anything but 127.0.0.0/8, ``::1`` or a Unix socket, a
name lookup that ``/etc/hosts`` does not answer (``localhost`` and the names the file lists, for
the address family it lists them with; numeric addresses), a reverse lookup of an address the
file does not list, and a socket whose packets no address check can follow (``AF_PACKET``, raw
IP) raise :class:`NetworkGuardError` at once, naming the address and the test. Nothing has been
sent when it raises.

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
#: The folder holding the ``sitecustomize`` that children load first.
SITE_DIR = Path(__file__).with_name("network_guard_site")

_LOOKUPS = {
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.gethostbyaddr",
}
_SENDS = {"socket.connect", "socket.sendto", "socket.sendmsg"}
# Families that never leave this machine's kernel (Unix sockets, netlink); IP is checked by address.
_LOCAL_FAMILIES = {socket.AF_UNIX, getattr(socket, "AF_NETLINK", socket.AF_UNIX)}
# IP socket types whose destination is the checked address: a raw socket writes its own IP header
# (IP_HDRINCL) and SOCK_PACKET frames, so the sendto address says nothing about where they go.
_ADDRESSED_TYPES = {socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET}


class NetworkGuardError(RuntimeError):
    """A socket operation that would send a packet beyond loopback (not an ``OSError``, so that no
    retry loop mistakes it for a network failure and hides it)."""


class InterceptedConnect(ConnectionRefusedError):
    """A connect to a non-loopback address, recorded by :func:`intercept_connects` and refused."""


@dataclass(frozen=True)
class HostsFile:
    """What ``/etc/hosts`` answers without a DNS query (nsswitch ``files`` first).

    The C library answers a name from the file only for an address family the file lists it
    with: with just ``127.0.0.1 localhost``, ``getaddrinfo("localhost", family=AF_INET6)`` (and a
    connect of an IPv6 socket to ``localhost``) goes to the DNS server; so does a reverse lookup of
    an address it does not list (``gethostbyaddr("127.0.0.2")``, ``::1``).
    """

    ipv4: frozenset[str] = frozenset({"localhost"})
    ipv6: frozenset[str] = frozenset()
    addresses: frozenset[str] = frozenset({"127.0.0.1"})

    def answers(self, name: str, family: int = socket.AF_UNSPEC) -> bool:
        """Whether looking ``name`` up for ``family`` is answered from the file."""
        if family == socket.AF_INET:
            return name in self.ipv4
        if family == socket.AF_INET6:
            return name in self.ipv6
        return name in self.ipv4 or name in self.ipv6


@dataclass
class _State:
    installed: bool = False
    # Taken at install: code under test may clear os.environ, and a refusal must still be logged.
    log_path: str | None = None
    hosts: HostsFile = field(default_factory=HostsFile)
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _State()
# Recorders of intercept_connects(), per thread: another thread's connect is never intercepted
# (a background thread's attempt would otherwise be refused as "firewalled" and never logged).
_local = threading.local()


def read_hosts_file(path: str = "/etc/hosts") -> HostsFile:
    """The names ``path`` lists by family, and its addresses (``localhost`` counts as listed for
    IPv4 always). Other names, ``localhost.localdomain`` included, may go to the DNS server."""
    # localhost and 127.0.0.1 are in every hosts file worth testing on (kept if one is not).
    ipv4, ipv6, addresses = {"localhost"}, set[str](), {"127.0.0.1"}
    with contextlib.suppress(OSError):
        for line in open(path, encoding="utf-8", errors="replace"):  # noqa: SIM115
            fields = line.split("#", 1)[0].split()
            ip = _ip(fields[0]) if fields else None
            if ip is None:
                continue
            addresses.add(str(ip))
            names = ipv4 if isinstance(ip, ipaddress.IPv4Address) else ipv6
            names.update(n.lower().rstrip(".") for n in fields[1:])
    return HostsFile(frozenset(ipv4), frozenset(ipv6), frozenset(addresses))


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


def _hosts() -> HostsFile:
    return _state.hosts if _state.installed else read_hosts_file()


def name_allowed(host: str, family: int = socket.AF_UNSPEC) -> bool:
    """Whether looking ``host`` up for ``family`` may happen: a numeric address (no packet is sent
    to resolve one), or a name ``/etc/hosts`` lists with an address of that family (``localhost``,
    this machine's host name, usually)."""
    name = host.lower().rstrip(".")
    if not name or _ip(name) is not None:
        return True
    return _hosts().answers(name, family)


def reverse_allowed(host: str) -> bool:
    """Whether a reverse lookup of the address ``host`` is answered by ``/etc/hosts``."""
    ip = _ip(host)
    return ip is not None and str(ip) in _hosts().addresses


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("idna", "replace")
    return str(value)


def _destination(sock: Any, address: Any) -> str | None:
    """The address as text when the guard must refuse it; None when it stays on this machine."""
    family = getattr(sock, "family", None)
    if family in _LOCAL_FAMILIES:
        return None  # a Unix socket path (or abstract name), netlink
    if family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple) or not address:
        return f"{address!r} on a socket of family {family!r}"  # AF_PACKET and other links out
    host = _text(address[0])
    port = address[1] if len(address) > 1 else "?"
    if is_loopback(host):
        return None
    # A name is resolved by the C library for the socket's family: from /etc/hosts only if the
    # file lists it with that family (an IPv6 socket's "localhost" goes to DNS otherwise).
    if _ip(host) is None and name_allowed(host, family) and _resolves_to_loopback(host, family):
        return None
    return f"{host} port {port}"


def _resolves_to_loopback(host: str, family: int) -> bool:
    try:  # audited too, and allowed: name_allowed(host, family) holds
        infos = socket.getaddrinfo(host, None, family, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(is_loopback(str(info[4][0])) for info in infos)


def _family_name(family: int) -> str:
    try:
        return socket.AddressFamily(family).name
    except ValueError:
        return f"family {family}"


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
    if event == "socket.__new__":
        _, family, kind, _proto = args
        kind &= ~(getattr(socket, "SOCK_NONBLOCK", 0) | getattr(socket, "SOCK_CLOEXEC", 0))
        if family == -1 or kind == -1 or family in _LOCAL_FAMILIES:
            return  # -1: a socket made from a file descriptor; its connects are still checked
        if family not in (socket.AF_INET, socket.AF_INET6) or kind not in _ADDRESSED_TYPES:
            _refuse(event, f"a socket of family {family}, type {kind} (its packets bypass the address check)")
    elif event in _SENDS:
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
        if event == "socket.gethostbyaddr" and _ip(text) is not None and not reverse_allowed(text):
            _refuse(event, f"reverse lookup of {text}")
        # gethostbyname(_ex) asks for IPv4; gethostbyaddr of a name resolves it for any family.
        family = args[2] if event == "socket.getaddrinfo" else socket.AF_UNSPEC
        if event == "socket.gethostbyname":
            family = socket.AF_INET
        if not name_allowed(text, family):
            _refuse(event, f"name lookup of {text!r} ({_family_name(family)})")
    elif event == "socket.getnameinfo":
        # The event does not carry the flags: NI_NUMERICHOST (no lookup) is refused all the same.
        sockaddr = args[0]
        if isinstance(sockaddr, tuple) and sockaddr and not reverse_allowed(_text(sockaddr[0])):
            _refuse(event, f"reverse lookup of {_text(sockaddr[0])}")


def install() -> None:
    """Install the audit hook in this process (once; an audit hook cannot be removed)."""
    with _state.lock:
        if _state.installed:
            return
        _state.log_path = os.environ.get(ENV_LOG)
        _state.hosts = read_hosts_file()
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
