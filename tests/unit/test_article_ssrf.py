"""The SSRF guard's judgement, without a network: every spelling of a blocked host is refused
with the address and the rule in the reason, the resolver is asked once, and the allow-list opens
exactly what it lists. Name lookups go through fake resolvers (no public DNS is reachable here),
except ``localhost``, which the system resolves. The fetch over real sockets, with proof that no
connection is made, is in tests/integration/test_article_fetch.py.
"""

from __future__ import annotations

import ipaddress
from email.utils import formatdate

import pytest

from onceflow.articles.errors import PermanentStepError
from onceflow.articles.fetch import FetchPolicy, parse_retry_after
from onceflow.articles.ssrf import AllowList, IPAddress, blocked_reason, check_target, parse_url


def _resolver(*answers: str) -> tuple[list[str], object]:
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[IPAddress]:
        calls.append(host)
        return [ipaddress.ip_address(a) for a in answers]

    return calls, resolve


def _refusal(url: str, allow: AllowList | None = None, *answers: str) -> str:
    _calls, resolve = _resolver(*answers)
    with pytest.raises(PermanentStepError) as caught:
        check_target(parse_url(url), allow or AllowList(), resolve)  # type: ignore[arg-type]
    assert caught.value.step == "fetch"
    return caught.value.reason


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "blocked: 169.254.169.254 (link-local, cloud metadata)"),
        ("http://[::1]/", "blocked: ::1 (loopback) for host ::1"),
        ("http://0x7f.1/", "blocked: 127.0.0.1 (loopback) for host 0x7f.1"),
        ("http://2130706433/", "blocked: 127.0.0.1 (loopback) for host 2130706433"),
        ("http://0177.0.0.1/", "blocked: 127.0.0.1 (loopback) for host 0177.0.0.1"),
        ("http://127.1/", "blocked: 127.0.0.1 (loopback) for host 127.1"),
        ("http://0x7F000001/", "blocked: 127.0.0.1 (loopback)"),
        ("http://127.0.0.1./", "blocked: 127.0.0.1 (loopback)"),
        ("http://%31%32%37.0.0.1/", "blocked: 127.0.0.1 (loopback)"),
        ("http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11/", "blocked: 127.0.0.1 (loopback)"),
        ("http://[::ffff:127.0.0.1]/", "blocked: ::ffff:7f00:1 (loopback, embedded 127.0.0.1)"),
        ("http://[::ffff:a9fe:a9fe]/", "(link-local, cloud metadata, embedded 169.254.169.254)"),
        ("http://example.com@127.0.0.1/", "blocked: 127.0.0.1 (loopback) for host 127.0.0.1"),
        ("http://user:pw@10.1.2.3:8080/x", "blocked: 10.1.2.3 (private)"),
        ("https://0/", "blocked: 0.0.0.0 (unspecified)"),
        ("http://100.64.0.7/", "blocked: 100.64.0.7 (shared address space (CGNAT))"),
        ("http://192.168.1.1/", "blocked: 192.168.1.1 (private)"),
        ("http://172.31.255.255/", "blocked: 172.31.255.255 (private)"),
        ("http://224.0.0.1/", "blocked: 224.0.0.1 (multicast)"),
        ("http://240.0.0.1/", "blocked: 240.0.0.1 (reserved)"),
        ("http://255.255.255.255/", "(broadcast)"),
        ("http://[::]/", "blocked: :: (unspecified)"),
        ("http://[fd12:3456::1]/", "(private (unique local))"),
        ("http://[fec0::1]/", "(site-local)"),
        ("http://[fe80::1]/", "(link-local)"),
        ("http://[ff02::1]/", "(multicast)"),
        ("http://[2002:a00:1::]/", "(private, embedded 10.0.0.1)"),  # 6to4
        ("http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/", "(private, embedded 10.0.0.1)"),  # Teredo
        ("http://[64:ff9b::7f00:1]/", "(loopback, embedded 127.0.0.1)"),  # NAT64
        ("http://[::127.0.0.1]/", "(loopback, embedded 127.0.0.1)"),  # IPv4-compatible
        ("http://[::ffff:0:7f00:1]/", "(loopback, embedded 127.0.0.1)"),  # IPv4-translated (SIIT)
        ("http://[::ffff:0:a9fe:a9fe]/", "(link-local, cloud metadata, embedded 169.254.169.254)"),
    ],
)
def test_a_blocked_address_in_any_spelling_is_refused_with_address_and_rule(url: str, reason: str) -> None:
    assert reason in _refusal(url)


def test_localhost_by_name_is_refused_after_the_system_resolves_it() -> None:
    with pytest.raises(PermanentStepError) as caught:
        check_target(parse_url("http://localhost:8765/"), AllowList())
    assert caught.value.reason.startswith("blocked: ")
    assert caught.value.reason.endswith("(loopback) for host localhost")


def test_a_name_is_refused_when_any_of_its_addresses_is_blocked() -> None:
    assert _refusal("http://news.test/", None, "93.184.215.14", "10.0.0.9") == (
        "blocked: 10.0.0.9 (private) for host news.test"
    )


def test_a_public_name_passes_and_the_resolver_is_asked_once() -> None:
    calls, resolve = _resolver("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    addresses = check_target(parse_url("https://News.Test./a?b=1"), AllowList(), resolve)  # type: ignore[arg-type]
    assert [str(a) for a in addresses] == ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]
    assert calls == ["news.test"]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/a", "only http and https URLs are fetched, not ftp"),
        ("file:///etc/passwd", "only http and https URLs are fetched, not file"),
        ("javascript:alert(1)", "only http and https URLs are fetched, not javascript"),
        ("gopher://127.0.0.1:6379/_INFO", "only http and https URLs are fetched, not gopher"),
        ("example.com/page", "not a URL without scheme"),
        ("http:///path", "no host in URL"),
        ("http://127.0.0.1:99999/", "not a valid port"),
        ("http://1.2.3.256/", "not a valid address: 1.2.3.256"),
        ("http://08.0.0.1/", "bad octal number 08"),
        ("http://127.0.0.1\\@example.com/", "not a valid URL (space, backslash or control character)"),
        ("http://exa mple.com/", "not a valid URL"),
        ("http://[fe80::1%25eth0]/", "IPv6 zone identifiers are not fetched"),
        ("http://[::1/", "not a valid URL (Invalid IPv6 URL)"),
        ("http://[127.0.0.1]/", "not a valid URL (An IPv4 address cannot be in brackets)"),
        ("http://[::1]x/", "not a valid IPv6 host"),
    ],
)
def test_what_is_not_a_plain_http_url_is_refused(url: str, reason: str) -> None:
    with pytest.raises(PermanentStepError) as caught:
        parse_url(url)
    assert reason in caught.value.reason


def test_the_host_header_keeps_the_name_and_a_non_default_port() -> None:
    assert parse_url("http://Example.COM/").host_header == "example.com"
    assert parse_url("http://example.com:8080/x").host_header == "example.com:8080"
    assert parse_url("https://[2606:4700::1111]:8443/").host_header == "[2606:4700::1111]:8443"
    assert parse_url("http://a.test/p/q?r=1#frag").request_target == "/p/q?r=1"


def test_the_allow_list_opens_only_the_listed_address_and_port() -> None:
    allow = AllowList.parse(["127.0.0.1:8765"])
    assert check_target(parse_url("http://127.0.0.1:8765/"), allow) == [ipaddress.ip_address("127.0.0.1")]
    assert "blocked: 127.0.0.1 (loopback)" in _refusal("http://127.0.0.1:8766/", allow)
    assert "blocked: 127.0.0.2 (loopback)" in _refusal("http://127.0.0.2:8765/", allow)
    # a name that resolves to the listed address and port is let through too: the address is what counts
    _calls, resolve = _resolver("127.0.0.1")
    assert check_target(parse_url("http://demo.test:8765/"), allow, resolve)  # type: ignore[arg-type]


def test_an_allowed_range_and_an_allowed_name() -> None:
    allow = AllowList.parse(["10.0.0.0/8", "Intranet.Test:8080", "[::1]:9000"])
    assert check_target(parse_url("http://10.20.30.40:1234/"), allow)
    assert "(private)" in _refusal("http://192.168.0.1/", allow)
    _calls, resolve = _resolver("192.168.7.7")
    assert check_target(parse_url("http://intranet.test:8080/"), allow, resolve)  # type: ignore[arg-type]
    assert "192.168.7.7 (private) for host intranet.test" in _refusal(
        "http://intranet.test:8081/", allow, "192.168.7.7"
    )
    assert check_target(parse_url("http://[::1]:9000/"), allow)
    assert "(loopback)" in _refusal("http://[::1]:9001/", allow)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("", "non-empty string"),
        ("10.0.0.0/33", "not a host name"),
        ("host:0", "bad port"),
        ("a/b", "not a host"),
    ],
)
def test_a_bad_allow_entry_is_named(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AllowList.parse([entry])


def test_public_addresses_pass_and_the_table_covers_the_ranges() -> None:
    for public in ("8.8.8.8", "93.184.215.14", "2606:4700::1111", "2002:808:808::"):
        assert blocked_reason(ipaddress.ip_address(public)) is None, public
    assert blocked_reason(ipaddress.ip_address("198.18.0.1")) == "reserved (benchmarking)"
    assert blocked_reason(ipaddress.ip_address("2001:db8::1")) == "reserved (documentation)"


def test_policy_from_connection_extras() -> None:
    policy = FetchPolicy.from_extras(
        {
            "allow": ["127.0.0.1:8765", "10.0.0.0/8"],
            "max_bytes": "1000000",
            "max_redirects": 0,
            "connect_timeout": 2,
            "read_timeout": "7.5",
            "total_timeout": 30,
            "user_agent": "test-agent",
        }
    )
    assert policy.max_bytes == 1_000_000 and policy.max_redirects == 0
    assert (policy.connect_timeout, policy.read_timeout, policy.total_timeout) == (2.0, 7.5, 30.0)
    assert policy.allow.entries == ("127.0.0.1:8765", "10.0.0.0/8")
    assert FetchPolicy.from_extras({"allow": "127.0.0.1:8765, demo.test"}).allow.entries == (
        "127.0.0.1:8765",
        "demo.test",
    )
    assert FetchPolicy.from_extras({}) == FetchPolicy()


def test_bad_extras_name_every_bad_key_and_value() -> None:
    with pytest.raises(ValueError) as caught:
        FetchPolicy.from_extras(
            {"alow": ["x"], "max_bytes": -1, "total_timeout": "soon", "max_redirects": True, "allow": ["a/b"]}
        )
    message = str(caught.value)
    assert "unknown key 'alow'" in message
    assert "max_bytes: expected an integer >= 1, got -1" in message
    assert "total_timeout: expected a positive number of seconds, got 'soon'" in message
    assert "max_redirects: expected a number, got True" in message
    assert "allow: allow entry 'a/b'" in message


def test_retry_after_in_seconds_and_as_an_http_date() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(formatdate(1_000_090, usegmt=True), now=1_000_000) == 90.0
    assert parse_retry_after(formatdate(999_000, usegmt=True), now=1_000_000) == 0.0
    assert parse_retry_after("next tuesday") is None
    assert parse_retry_after(None) is None
    # a delay too long for a float (or for any timedelta the retry is scheduled with) is unreadable
    assert parse_retry_after("9" * 400) is None
