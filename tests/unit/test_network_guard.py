"""The network guard refuses traffic beyond loopback in this process and in its children.

No test here calls ``connect()`` on a non-loopback address: each raises the audit event itself
(``sys.audit``) on an unconnected socket, or calls the guard's check, as the issue requires.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from onceflow.testing import network_guard
from onceflow.testing.network_guard import InterceptedConnect, NetworkGuardError, RefusalLog

pytest_plugins = ["pytester"]

REFUSED_CONNECTS = [
    ("93.184.215.14", 80),  # public
    ("10.0.0.1", 5432),  # private ranges
    ("172.16.0.1", 443),
    ("192.168.1.1", 80),
    ("169.254.169.254", 80),  # the cloud metadata server google-auth probes
    ("8.8.8.8", 53),  # a real DNS server
    ("192.0.2.1", 80),
    ("example.com", 80),  # a name the C library would resolve by itself
]


def test_the_guard_is_installed_in_the_pytest_process() -> None:
    assert network_guard.installed()
    assert os.environ[network_guard.ENV_ENABLED] == "1"
    assert os.environ["NO_GCE_CHECK"] == "true"
    assert str(network_guard.SITE_DIR) == os.environ["PYTHONPATH"].split(os.pathsep)[0]


def test_a_connect_beyond_loopback_raises_at_once_naming_the_address_and_the_test(
    network_refusals: RefusalLog,
) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(NetworkGuardError) as info:
            sys.audit("socket.connect", sock, ("192.0.2.1", 80))
    finally:
        sock.close()
    message = str(info.value)
    assert "socket.connect: 192.0.2.1 port 80 refused" in message
    assert "test_a_connect_beyond_loopback_raises_at_once_naming_the_address_and_the_test" in message
    taken = network_refusals.take(lambda r: r.target == "192.0.2.1 port 80")
    assert [(r.pid, r.event) for r in taken] == [(os.getpid(), "socket.connect")]


@pytest.mark.parametrize("address", REFUSED_CONNECTS, ids=[a[0] for a in REFUSED_CONNECTS])
def test_every_address_outside_this_machine_is_refused(
    address: tuple[str, int], network_refusals: RefusalLog
) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(NetworkGuardError, match=re.escape(f"{address[0]} port {address[1]}")):
            network_guard.check("socket.connect", (sock, address))
        with pytest.raises(NetworkGuardError):
            network_guard.check("socket.sendto", (sock, address))
    finally:
        sock.close()
    assert len(network_refusals.take(lambda r: r.target.startswith(f"{address[0]} "))) == 2


def test_ipv6_beyond_loopback_is_refused_and_loopback_is_not(network_refusals: RefusalLog) -> None:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        for host in ("2001:db8::1", "fe80::1%lo", "::ffff:8.8.8.8"):
            with pytest.raises(NetworkGuardError):
                network_guard.check("socket.connect", (sock, (host, 80, 0, 0)))
        for host in ("::1", "::1%lo", "::ffff:127.0.0.1"):
            network_guard.check("socket.connect", (sock, (host, 80, 0, 0)))
    finally:
        sock.close()
    assert len(network_refusals.take(lambda r: r.event == "socket.connect")) == 3


def test_loopback_unix_sockets_and_local_names_pass() -> None:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for address in [("127.0.0.1", 80), ("127.0.0.2", 80), ("127.255.255.254", 1), ("localhost", 80)]:
            network_guard.check("socket.connect", (tcp, address))
        network_guard.check("socket.connect", (unix, "/run/postgresql/.s.PGSQL.5432"))
        network_guard.check("socket.connect", (unix, b"\0abstract"))
    finally:
        tcp.close()
        unix.close()
    for host in (
        "localhost",
        "LOCALHOST.",
        "127.0.0.1",
        "10.0.0.1",
        None,
        socket.gethostname(),
    ):
        network_guard.check("socket.getaddrinfo", (host, 80, 0, 0, 0))


@pytest.mark.parametrize("event", ["socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"])
def test_a_name_lookup_beyond_localhost_is_refused(event: str, network_refusals: RefusalLog) -> None:
    args: tuple[Any, ...] = (
        ("metadata.google.internal", 80, 0, 0, 0)
        if event == "socket.getaddrinfo"
        else ("metadata.google.internal",)
    )
    with pytest.raises(NetworkGuardError, match=re.escape("name lookup of 'metadata.google.internal'")):
        sys.audit(event, *args)
    assert len(network_refusals.take(lambda r: "metadata.google.internal" in r.target)) == 1


def test_a_reverse_lookup_of_a_public_address_is_refused(network_refusals: RefusalLog) -> None:
    with pytest.raises(NetworkGuardError, match=re.escape("reverse lookup of 93.184.215.14")):
        sys.audit("socket.gethostbyaddr", "93.184.215.14")
    with pytest.raises(NetworkGuardError, match=re.escape("reverse lookup of 93.184.215.14")):
        sys.audit("socket.getnameinfo", ("93.184.215.14", 80))
    network_guard.check("socket.gethostbyaddr", ("127.0.0.1",))
    assert len(network_refusals.take(lambda r: "93.184.215.14" in r.target)) == 2


@pytest.fixture
def hosts_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> network_guard.HostsFile:
    """A hosts file like this machine's: localhost on 127.0.0.1 only, one name on ::1."""
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost buildbox # this machine\n::1 ip6-localhost\n")
    hosts = network_guard.read_hosts_file(str(path))
    monkeypatch.setattr(network_guard._state, "hosts", hosts)
    return hosts


def test_a_name_is_local_only_for_the_family_the_hosts_file_lists_it_with(
    hosts_file: network_guard.HostsFile, network_refusals: RefusalLog
) -> None:
    """glibc answers ``localhost`` from the file for IPv4 only: asked for IPv6 (or connected to
    from an IPv6 socket), it sends the query to the DNS server (seen with strace in a network
    namespace of its own)."""
    for name, family in [("localhost", socket.AF_INET), ("localhost", socket.AF_UNSPEC), ("buildbox", 0)]:
        network_guard.check("socket.getaddrinfo", (name, 80, family, 0, 0))
    network_guard.check("socket.getaddrinfo", ("ip6-localhost", 80, socket.AF_INET6, 0, 0))
    refused = [
        ("socket.getaddrinfo", ("localhost", 80, socket.AF_INET6, 0, 0)),
        ("socket.getaddrinfo", ("ip6-localhost", 80, socket.AF_INET, 0, 0)),
        ("socket.gethostbyname", ("ip6-localhost",)),  # gethostbyname(_ex) asks for IPv4
    ]
    for event, args in refused:
        with pytest.raises(NetworkGuardError, match="name lookup of"):
            network_guard.check(event, args)
    v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        with pytest.raises(NetworkGuardError, match=re.escape("localhost port 80 refused")):
            sys.audit("socket.connect", v6, ("localhost", 80))
    finally:
        v6.close()
    assert len(network_refusals.take(lambda r: "localhost" in r.target)) == 4


def test_a_reverse_lookup_goes_only_to_the_hosts_file(
    hosts_file: network_guard.HostsFile, network_refusals: RefusalLog
) -> None:
    """A reverse lookup of a loopback address the file does not list (127.0.0.2, and ``::1`` where
    the file has no ``::1`` line) is a PTR query to the DNS server."""
    network_guard.check("socket.gethostbyaddr", ("127.0.0.1",))
    network_guard.check("socket.gethostbyaddr", ("::1",))
    network_guard.check("socket.getnameinfo", (("127.0.0.1", 80),))
    # ::1 unlisted from here on (the fixture's monkeypatch restores the guard's own at teardown)
    network_guard._state.hosts = network_guard.HostsFile(
        hosts_file.ipv4, frozenset(), frozenset({"127.0.0.1"})
    )
    for event, address in [
        ("socket.gethostbyaddr", ("127.0.0.2",)),
        ("socket.getnameinfo", (("127.0.0.3", 80),)),
        ("socket.getnameinfo", (("::1", 80, 0, 0),)),
    ]:
        with pytest.raises(NetworkGuardError, match="reverse lookup of"):
            sys.audit(event, *address)
    assert len(network_refusals.take(lambda r: "reverse lookup" in r.target)) == 3


def test_checking_a_connect_to_a_name_never_asks_the_resolver_for_an_unlisted_one(
    hosts_file: network_guard.HostsFile, network_refusals: RefusalLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard resolves a name itself only when the hosts file answers it: any other name would
    be a DNS query sent by the guard."""
    asked: list[Any] = []

    def resolver(*args: Any, **kwargs: Any) -> list[Any]:
        asked.append(args)
        return []

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(NetworkGuardError, match=re.escape("news.test port 80 refused")):
            network_guard.check("socket.connect", (sock, ("news.test", 80)))
    finally:
        sock.close()
    assert asked == []
    assert len(network_refusals.take(lambda r: "news.test" in r.target)) == 1


def test_sockets_whose_packets_bypass_the_address_check_are_refused(network_refusals: RefusalLog) -> None:
    """``AF_PACKET`` frames and raw IP sockets (their own IP header) go wherever they say, and a
    bound ``AF_PACKET`` socket's ``send()`` has no audit event: refused when the socket is made."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # stands for the new socket
    try:
        refused: list[tuple[int, int, int]] = [
            (socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
            (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
            (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW),
            (socket.AF_INET, 10, 0x0300),  # SOCK_PACKET (Linux), not in the socket module
        ]
        for family, kind, proto in refused:
            with pytest.raises(NetworkGuardError, match="bypass the address check"):
                sys.audit("socket.__new__", sock, family, kind, proto)
        passing: list[tuple[int, int]] = [
            (socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC),
            (socket.AF_INET6, socket.SOCK_DGRAM),
            (socket.AF_UNIX, socket.SOCK_STREAM),
            (socket.AF_NETLINK, socket.SOCK_RAW),
            (-1, -1),  # socket(fileno=...)
        ]
        for family, kind in passing:
            network_guard.check("socket.__new__", (sock, family, kind, 0))
        packet = type("PacketSocket", (), {"family": socket.AF_PACKET})()
        with pytest.raises(NetworkGuardError, match="family"):
            network_guard.check("socket.sendto", (packet, ("eth0", 0x0800)))
    finally:
        sock.close()
    assert len(network_refusals.take(lambda r: "family" in r.target)) == 5


def test_intercept_connects_records_the_attempt_and_refuses_it_before_any_packet() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with network_guard.intercept_connects() as seen:
            with pytest.raises(InterceptedConnect) as info:
                sys.audit("socket.connect", sock, ("198.51.100.7", 443))
            network_guard.check("socket.connect", (sock, ("127.0.0.1", 443)))  # loopback is not recorded
        assert seen == [("198.51.100.7", 443)]
        assert isinstance(info.value, ConnectionRefusedError)
    finally:
        sock.close()


def test_a_child_python_process_installs_the_guard_through_sitecustomize(
    network_refusals: RefusalLog,
) -> None:
    code = (
        "import socket, sys\n"
        "from onceflow.testing import network_guard\n"
        "assert network_guard.installed(), 'not installed'\n"
        "sys.audit('socket.connect', socket.socket(), ('192.0.2.9', 80))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert (
        "NetworkGuardError: onceflow network guard: socket.connect: 192.0.2.9 port 80 refused" in proc.stderr
    )
    assert "test_a_child_python_process_installs_the_guard_through_sitecustomize" in proc.stderr
    taken = network_refusals.take(lambda r: r.target == "192.0.2.9 port 80")
    assert len(taken) == 1 and taken[0].pid != os.getpid()


def test_a_swallowed_refusal_still_fails_the_test(
    pytester: pytest.Pytester, network_refusals: RefusalLog
) -> None:
    """An inner session: the code under test catches the guard's error and carries on; the
    refusal log still fails that test, and the session exits non-zero."""
    pytester.makeini("[pytest]\nonceflow_network_guard = true\n")
    pytester.makepyfile(
        test_inner=(
            "import socket, sys\n"
            "def test_swallows():\n"
            "    try:\n"
            "        sys.audit('socket.connect', socket.socket(), ('203.0.113.5', 25))\n"
            "    except Exception:\n"
            "        pass\n"
            "def test_clean():\n"
            "    assert True\n"
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*socket.connect: 203.0.113.5 port 25 refused*test_swallows*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # The inner session logs to this session's file (it inherited the guard): taken here on purpose.
    assert len(network_refusals.take(lambda r: r.target == "203.0.113.5 port 25")) == 1


def test_google_auth_is_told_not_to_probe_the_metadata_server() -> None:
    from google.auth.compute_engine import _metadata

    assert _metadata._NO_GCE_CHECK is True
    assert _metadata.is_on_gce(request=None) is False  # no request is ever made


def test_an_xfail_test_that_meets_a_refusal_fails_the_session(
    pytester: pytest.Pytester, network_refusals: RefusalLog
) -> None:
    pytester.makeini("[pytest]\nonceflow_network_guard = true\n")
    pytester.makepyfile(
        test_inner=(
            "import socket, sys, pytest\n"
            "@pytest.mark.xfail(reason='expected to fail for another reason')\n"
            "def test_swallows():\n"
            "    try:\n"
            "        sys.audit('socket.connect', socket.socket(), ('203.0.113.6', 25))\n"
            "    except Exception:\n"
            "        pass\n"
            "    assert False\n"
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert len(network_refusals.take(lambda r: r.target == "203.0.113.6 port 25")) == 1


def test_a_refusal_is_logged_even_after_the_code_under_test_clears_the_environment(
    network_refusals: RefusalLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        monkeypatch.delenv(name)
    sock = socket.socket()
    try:
        with pytest.raises(NetworkGuardError):
            sys.audit("socket.connect", sock, ("198.51.100.9", 80))
    finally:
        sock.close()
    monkeypatch.undo()
    assert len(network_refusals.take(lambda r: r.target == "198.51.100.9 port 80")) == 1


def test_another_threads_connect_inside_intercept_connects_is_refused_and_logged(
    network_refusals: RefusalLog,
) -> None:
    errors: list[BaseException] = []

    def background() -> None:
        sock = socket.socket()
        try:
            sys.audit("socket.connect", sock, ("192.0.2.77", 80))
        except BaseException as exc:
            errors.append(exc)
        finally:
            sock.close()

    with network_guard.intercept_connects() as seen:
        thread = threading.Thread(target=background)
        thread.start()
        thread.join()
    assert seen == []
    assert [type(e) for e in errors] == [NetworkGuardError]
    assert len(network_refusals.take(lambda r: r.target == "192.0.2.77 port 80")) == 1


def test_names_are_local_only_when_the_hosts_file_lists_them(
    tmp_path: Any, network_refusals: RefusalLog
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 buildbox buildbox.lan # this machine\n::1 ip6-lo\n")
    read = network_guard.read_hosts_file(str(hosts))
    assert read.ipv4 == {"localhost", "buildbox", "buildbox.lan"} and read.ipv6 == {"ip6-lo"}
    assert read.addresses == {"127.0.0.1", "::1"}
    # names that nsswitch may send to a DNS server although they look local
    for name in ("api.localhost", "localhost.localdomain", "ip6-localhost"):
        if network_guard.read_hosts_file().answers(name):
            continue
        with pytest.raises(NetworkGuardError):
            network_guard.check("socket.getaddrinfo", (name, 80, 0, 0, 0))
    network_refusals.take(lambda r: r.event == "socket.getaddrinfo")


def test_uvloop_is_kept_out_of_guarded_processes() -> None:
    """uvloop's sockets are libuv's, never audited: uvicorn must fall back to asyncio."""
    with pytest.raises(ImportError):
        import uvloop  # noqa: F401


def test_a_child_of_another_interpreter_without_onceflow_is_guarded(
    tmp_path: Any, network_refusals: RefusalLog
) -> None:
    """A plain venv of its own (no onceflow installed): the sitecustomize loads the guard by path."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    code = "import socket, sys\nsys.audit('socket.connect', socket.socket(), ('192.0.2.10', 80))\n"
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "192.0.2.10 port 80 refused" in proc.stderr, proc.stderr
    assert len(network_refusals.take(lambda r: r.target == "192.0.2.10 port 80")) == 1


def test_sitecustomize_runs_the_next_one_and_never_itself_twice(tmp_path: Any) -> None:
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.ONCEFLOW_OTHER_SITE = True\n")
    copy = tmp_path / "network_guard_site"  # a second copy of the guard's folder (another checkout)
    copy.mkdir()
    (copy / "sitecustomize.py").write_text((network_guard.SITE_DIR / "sitecustomize.py").read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(network_guard.SITE_DIR), str(copy), str(other)])}
    code = "import builtins\nfrom onceflow.testing import network_guard as g\nprint(g.installed(), getattr(builtins, 'ONCEFLOW_OTHER_SITE', False))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"], (proc.stdout, proc.stderr)
    assert "Error in sitecustomize" not in proc.stderr
