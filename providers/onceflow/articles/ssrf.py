"""The fetch step's SSRF guard: which URLs may be fetched, and the exact address to connect to.

The URL comes from a shared sheet, so anyone who can edit a row can make the worker send a GET.
The guard answers one question per hop (the first URL and every redirect): parse the host the way
the connection will use it, resolve it once, refuse when ANY answer is in a range the worker must
not reach, and hand back the checked addresses. The caller connects to those addresses and never
resolves the name again, so a DNS answer that changes between check and connect (rebinding)
cannot steer the connection elsewhere.

Spellings are normalised before judging: percent-encoding, trailing dots, IDNA, and the
``inet_aton`` forms that resolvers accept (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``);
IPv6 addresses that embed an IPv4 one (mapped, translated, compatible, NAT64, 6to4, Teredo) are judged by
the embedded address too. Userinfo (``http://example.com@127.0.0.1/``) is dropped: the host is
what follows the ``@``, as every HTTP client reads it, and that is what is checked and connected.

An :class:`AllowList` (from the ``onceflow_fetch`` connection) lets named hosts or address
ranges through, optionally on one port only: the local demo site is ``127.0.0.1:8765``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, quote, unquote, urlsplit

from onceflow.articles.errors import PermanentStepError, TransientStepError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses it resolves to; tests inject their own (no public DNS here).
Resolver = Callable[[str, int], list[IPAddress]]

_V4_RULES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.169.254/32", "link-local, cloud metadata"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved (IETF protocol assignments)"),
    ("192.0.2.0/24", "reserved (documentation)"),
    ("192.88.99.0/24", "reserved (6to4 relay)"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "reserved (benchmarking)"),
    ("198.51.100.0/24", "reserved (documentation)"),
    ("203.0.113.0/24", "reserved (documentation)"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
)
_V6_RULES: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "reserved (IPv4-compatible)"),
    ("64:ff9b:1::/48", "private (local-use NAT64)"),
    ("100::/64", "reserved (discard-only)"),
    ("2001:db8::/32", "reserved (documentation)"),
    ("fc00::/7", "private (unique local)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
_RULES: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), why) for net, why in _V4_RULES + _V6_RULES
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIIT = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 IPv4-translated addresses
# RFC 3986 reserved and unreserved characters, and "%" so existing escapes stay as they are
_SAFE = "/%:@!$&'()*+,;=-._~"


def blocked_reason(addr: IPAddress) -> str | None:
    """Why ``addr`` must not be fetched from (``"loopback"``), or ``None`` when it may.

    An IPv6 address that carries an IPv4 one is refused when the IPv4 one is.
    """
    embedded = _embedded_v4(addr)
    if embedded is not None:
        inner = blocked_reason(embedded)
        if inner is not None:
            return f"{inner}, embedded {embedded}"
    for net, why in _RULES:
        if addr.version == net.version and addr in net:
            return why
    if not addr.is_global:  # whatever IANA lists as not globally reachable, beyond the table
        return "reserved"
    return None


def _embedded_v4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(addr, ipaddress.IPv6Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if (
        addr in _NAT64  # NAT64 well-known prefix
        or addr in _SIIT  # IPv4-translated ::ffff:0:a.b.c.d, which SIIT translators map to a.b.c.d
        or (int(addr) >> 32 == 0 and int(addr) > 1)  # IPv4-compatible ::a.b.c.d (:: and ::1 aside)
    ):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as an IPv4 address in any ``inet_aton`` spelling, or ``None`` if it is a name.

    ``2130706433``, ``0177.0.0.1``, ``0x7f.1`` and ``127.1`` all give ``127.0.0.1``: resolvers
    accept these forms, so the guard must read them the same way.

    :raises PermanentStepError: the host looks numeric but is no valid address (``1.2.3.999``).
    """
    parts = host.split(".")
    if not parts[-1] or not _is_number(parts[-1]):
        return None  # WHATWG: a host is an IPv4 address exactly when its last label is numeric
    if len(parts) > 4 or not all(_is_number(p) for p in parts):
        raise PermanentStepError(f"not a valid address: {host}", step="fetch")
    values = [_number(p) for p in parts]
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        raise PermanentStepError(f"not a valid address: {host}", step="fetch")
    packed = 0
    for i, v in enumerate(head):
        packed |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(packed | last)


def _is_number(part: str) -> bool:
    low = part.lower()
    if low.startswith("0x"):
        return all(c in "0123456789abcdef" for c in low[2:])
    return part.isascii() and part.isdigit()


def _number(part: str) -> int:
    low = part.lower()
    if low.startswith("0x"):
        return int(low[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not all(c in "01234567" for c in part):
            raise PermanentStepError(f"not a valid address: bad octal number {part}", step="fetch")
        return int(part, 8)
    return int(part)


@dataclass(frozen=True)
class Target:
    """One URL, parsed the way the connection will use it.

    :ivar host: the normalised host name or address text (lower case, no brackets, no trailing dot).
    :ivar literal: the address when the host is an IP literal, else ``None``.
    :ivar request_target: path and query to send (``/a/b?c``), never empty, ASCII only: other
        characters are percent-encoded as UTF-8 (``/España`` is sent as ``/Espa%C3%B1a``).
    :ivar written_host: the host as the URL spells it (``0x7f.1``), for reasons.
    """

    url: str
    scheme: str
    host: str
    port: int
    literal: IPAddress | None
    request_target: str
    written_host: str

    @property
    def host_header(self) -> str:
        """The ``Host`` header: the host as written in the URL, port only when not the default."""
        host = f"[{self.host}]" if isinstance(self.literal, ipaddress.IPv6Address) else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_url(url: str) -> Target:
    """Parse and normalise ``url``; refuse what is not a plain http(s) URL.

    :raises PermanentStepError: not http(s), no host, a bad port, or a malformed host.
    """
    text = url.strip()
    if any(ord(c) < 0x21 or c in "\\\x7f" for c in text):
        raise PermanentStepError(
            f"not a valid URL (space, backslash or control character): {url!r}", step="fetch"
        )
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise PermanentStepError(f"not a valid URL ({exc}): {url}", step="fetch") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise PermanentStepError(
            f"only http and https URLs are fetched, not {scheme or 'a URL without scheme'}: {url}",
            step="fetch",
        )
    host, literal = _parse_host(parts, url)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise PermanentStepError(f"not a valid port in URL: {url}", step="fetch")
    port = port or (443 if scheme == "https" else 80)
    target = quote(parts.path or "/", safe=_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_SAFE + "?")
    return Target(
        url=text,
        scheme=scheme,
        host=host,
        port=port,
        literal=literal,
        request_target=target,
        written_host=parts.hostname or host,
    )


def _parse_host(parts: SplitResult, url: str) -> tuple[str, IPAddress | None]:
    raw = parts.hostname  # userinfo dropped, brackets stripped, lower-cased
    if not raw:
        raise PermanentStepError(f"no host in URL: {url}", step="fetch")
    hostport = parts.netloc.rpartition("@")[2]
    if "[" in hostport:
        if not re.fullmatch(r"\[[^\[\]]+\](:\d*)?", hostport):
            raise PermanentStepError(f"not a valid IPv6 host in URL: {url}", step="fetch")
        try:
            v6 = ipaddress.IPv6Address(unquote(raw))
        except ValueError:
            raise PermanentStepError(f"not a valid IPv6 address in URL: {url}", step="fetch") from None
        if v6.scope_id:
            raise PermanentStepError(f"IPv6 zone identifiers are not fetched: {url}", step="fetch")
        return v6.compressed, v6
    host = unquote(raw).rstrip(".")
    if not host or any(c in host for c in "/?#@[]:%") or any(ord(c) < 0x21 for c in host):
        raise PermanentStepError(f"not a valid host in URL: {url}", step="fetch")
    if not host.isascii():
        try:  # IDNA maps full-width digits and dots to ASCII: they spell 127.0.0.1 too
            host = host.encode("idna").decode("ascii").rstrip(".").lower()
        except UnicodeError:
            raise PermanentStepError(f"not a valid host name in URL: {url}", step="fetch") from None
    v4 = parse_ipv4(host)
    if v4 is not None:
        return str(v4), v4
    return host, None


@dataclass(frozen=True)
class AllowList:
    """Hosts and address ranges the guard lets through, each optionally on one port only.

    Entries: ``"127.0.0.1:8765"``, ``"10.0.0.0/8"``, ``"[::1]:8765"``, ``"demo.local"``,
    ``"demo.local:8765"``. An address entry matches the resolved address; a name entry matches
    the URL's host name (whatever it resolves to: list only names you control).
    """

    networks: tuple[tuple[IPNetwork, int | None], ...] = ()
    names: tuple[tuple[str, int | None], ...] = ()
    entries: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """Build from connection entries.

        :raises ValueError: an entry that is neither a host, an address nor a range, or a bad port.
        """
        networks: list[tuple[IPNetwork, int | None]] = []
        names: list[tuple[str, int | None]] = []
        kept: list[str] = []
        for entry in entries:
            if not isinstance(entry, str) or not entry.strip():
                raise ValueError(f"allow entry must be a non-empty string, got {entry!r}")
            text = entry.strip().lower()
            kept.append(text)
            host, port = _split_port(text, entry)
            try:
                networks.append((ipaddress.ip_network(host, strict=False), port))
                continue
            except ValueError:
                pass
            if not host or any(c in host for c in "/@[] "):
                raise ValueError(f"allow entry {entry!r} is not a host name, address or CIDR range")
            v4 = parse_ipv4(host) if _looks_numeric(host) else None
            if v4 is not None:
                networks.append((ipaddress.ip_network(v4), port))
            else:
                names.append((host.rstrip("."), port))
        return cls(networks=tuple(networks), names=tuple(names), entries=tuple(kept))

    def allows_host(self, host: str, port: int) -> bool:
        """The URL's host name (not an address) is listed for ``port``."""
        return any(name == host and p in (None, port) for name, p in self.names)

    def allows_address(self, addr: IPAddress, port: int) -> bool:
        """``addr`` lies in a listed range that is open for ``port``."""
        return any(
            addr.version == net.version and addr in net and p in (None, port) for net, p in self.networks
        )


def _looks_numeric(host: str) -> bool:
    return _is_number(host.split(".")[-1])


def _split_port(text: str, entry: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"allow entry {entry!r}: expected [address]:port")
        port_text = rest[1:] if rest else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""  # a bare IPv6 address or range, or no port
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"allow entry {entry!r}: bad port {port_text!r}")
    return host, int(port_text)


def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Resolve with ``getaddrinfo`` (TCP), in the order the system prefers.

    :raises PermanentStepError: the name does not exist.
    :raises TransientStepError: any other resolver failure (DNS down, try again).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise PermanentStepError(f"no such host: {host}", step="fetch") from exc
        raise TransientStepError(f"DNS lookup failed for {host}: {exc}", step="fetch") from exc
    seen: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if addr not in seen:
            seen.append(addr)
    return seen


def check_target(target: Target, allow: AllowList, resolver: Resolver = system_resolver) -> list[IPAddress]:
    """The addresses to connect to for ``target``, each one checked; refuse if any is blocked.

    The resolver is called at most once; connect only to what this returns.

    :raises PermanentStepError: ``"blocked: 127.0.0.1 (loopback) for host localhost"``.
    """
    if target.literal is not None:
        addresses: list[IPAddress] = [target.literal]
    else:
        addresses = resolver(target.host, target.port)
        if not addresses:
            raise PermanentStepError(f"no address for host {target.host}", step="fetch")
    if target.literal is None and allow.allows_host(target.host, target.port):
        return addresses
    for addr in addresses:
        why = blocked_reason(addr)
        if why is not None and not allow.allows_address(addr, target.port):
            raise PermanentStepError(f"blocked: {addr} ({why}) for host {target.written_host}", step="fetch")
    return addresses
