"""The fetch step's I/O against the real demo article site on 127.0.0.1, over real sockets.

Every refusal is proven twice: by the reason on the :class:`PermanentStepError` and by the site's
own connection counter and access log, which show that nothing reached it. No public DNS or
public address is reachable here, so names other than ``localhost`` resolve through a fake
resolver injected into the policy (``FetchPolicy.resolver``); the sockets, HTTP and servers are
real.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterator
from email.utils import formatdate
from pathlib import Path

import pytest

from onceflow.articles.errors import PermanentStepError, TransientStepError
from onceflow.articles.fetch import FetchedPage, FetchPolicy, fetch_page
from onceflow.articles.ssrf import AllowList, IPAddress
from onceflow.testing import network_guard
from onceflow.testing.article_site import ArticleSite, serve
from onceflow.testing.article_site.server import HUGE_BYTES
from onceflow.testing.ci import unavailable


@pytest.fixture
def site() -> Iterator[ArticleSite]:
    with serve() as running:
        yield running


@pytest.fixture
def other_site() -> Iterator[ArticleSite]:
    """A second site on 127.0.0.1 that no allow-list names."""
    with serve() as running:
        yield running


def _allowing(site: ArticleSite, **limits: float) -> FetchPolicy:
    return FetchPolicy(allow=AllowList.parse([site.address]), **limits)  # type: ignore[arg-type]


def _refused(url: str, policy: FetchPolicy | None = None) -> str:
    with pytest.raises(PermanentStepError) as caught:
        fetch_page(url, policy or FetchPolicy(connect_timeout=2))
    assert caught.value.step == "fetch"
    return caught.value.reason


class FakeResolver:
    """Answers name lookups from a script, one answer list per call (the last one repeats)."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = [[ipaddress.ip_address(a) for a in answer] for answer in answers]
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.calls.append(host)
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


# -- SSRF: refused, and nothing connects --------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "reason"),
    [
        ("localhost", "(loopback) for host localhost"),
        ("0x7f.1", "blocked: 127.0.0.1 (loopback) for host 0x7f.1"),
        ("2130706433", "blocked: 127.0.0.1 (loopback) for host 2130706433"),
        ("0177.0.0.1", "blocked: 127.0.0.1 (loopback) for host 0177.0.0.1"),
        ("127.1", "blocked: 127.0.0.1 (loopback) for host 127.1"),
        ("127.0.0.1.", "blocked: 127.0.0.1 (loopback)"),
        ("[::ffff:127.0.0.1]", "blocked: ::ffff:7f00:1 (loopback, embedded 127.0.0.1)"),
        ("example.com@127.0.0.1", "blocked: 127.0.0.1 (loopback) for host 127.0.0.1"),
    ],
)
def test_every_spelling_of_the_sites_own_address_is_refused_before_connecting(
    site: ArticleSite, spelling: str, reason: str
) -> None:
    reason_given = _refused(f"http://{spelling}:{site.port}/articles/gazpacho.html")
    assert reason in reason_given
    assert site.connections == 0 and site.log == []


def test_ipv6_loopback_is_refused_before_connecting() -> None:
    try:
        six = serve(host="::1")
    except OSError:
        unavailable("no IPv6 loopback here")
    with six:
        assert _refused(six.url("/articles/gazpacho.html")) == "blocked: ::1 (loopback) for host ::1"
        assert six.connections == 0


def test_an_allowed_ipv6_site_is_fetched_over_ipv6() -> None:
    try:
        six = serve(host="::1")
    except OSError:
        unavailable("no IPv6 loopback here")
    with six:
        page = fetch_page(six.url("/articles/mercado-do-bolhao.html"), _allowing(six))
        assert page.address == "::1" and "Mercado do Bolhão" in page.text
        assert [a.host for a in six.log] == [f"[::1]:{six.port}"]


def test_the_cloud_metadata_address_is_refused() -> None:
    reason = _refused("http://169.254.169.254/latest/meta-data/iam/security-credentials/")
    assert reason == "blocked: 169.254.169.254 (link-local, cloud metadata) for host 169.254.169.254"


def test_a_redirect_to_a_private_address_is_refused_and_never_followed(
    site: ArticleSite, other_site: ArticleSite
) -> None:
    reason = _refused(
        site.url(f"/redirect-to?url={other_site.url('/articles/gazpacho.html')}"), _allowing(site)
    )
    assert reason == "blocked: 127.0.0.1 (loopback) for host 127.0.0.1"
    assert [a.path for a in site.log] == [f"/redirect-to?url={other_site.url('/articles/gazpacho.html')}"]
    assert other_site.connections == 0
    assert (
        _refused(site.url("/private-redirect"), _allowing(site))
        == "blocked: 10.0.0.1 (private) for host 10.0.0.1"
    )


def test_the_allow_list_lets_through_only_the_listed_address_and_port(
    site: ArticleSite, other_site: ArticleSite
) -> None:
    page = fetch_page(site.url("/articles/gazpacho.html"), _allowing(site))
    assert page.status == 200 and "Gazpacho de la abuela Remedios" in page.text
    assert page.address == "127.0.0.1"
    assert _refused(other_site.url("/articles/gazpacho.html"), _allowing(site)).startswith(
        "blocked: 127.0.0.1"
    )
    assert other_site.connections == 0
    # a name entry opens that name on that port, not the address behind it
    by_name = FetchPolicy(allow=AllowList.parse([f"localhost:{site.port}"]))
    assert fetch_page(f"http://localhost:{site.port}/articles/gazpacho.html", by_name).status == 200
    assert _refused(site.url("/articles/gazpacho.html"), by_name).startswith("blocked: 127.0.0.1")


def test_dns_rebinding_cannot_move_the_connection_after_the_check(site: ArticleSite) -> None:
    """The resolver answers a public address first, the site's loopback address afterwards: the
    connection goes to the checked public address and never to the loopback one. The attempt is
    observed at the socket (the network guard records and refuses it, as a firewall would): no
    packet leaves this machine."""
    resolver = FakeResolver(["93.184.215.14"], ["127.0.0.1"])
    policy = FetchPolicy(connect_timeout=1, total_timeout=5, resolver=resolver)
    with network_guard.intercept_connects() as attempts, pytest.raises(TransientStepError) as info:
        fetch_page(f"http://news.test:{site.port}/articles/gazpacho.html", policy)
    assert attempts == [("93.184.215.14", site.port)]
    assert f"could not connect to news.test (93.184.215.14 port {site.port}" in info.value.reason
    assert resolver.calls == ["news.test"]
    assert site.connections == 0


def test_the_connection_goes_to_the_checked_address_even_when_dns_changes(site: ArticleSite) -> None:
    """Allowed 127.0.0.1 at the first lookup, 127.0.0.2 (where another server listens on the same
    port) at any later one: the request reaches 127.0.0.1 with the name in the Host header."""
    try:
        rebound = serve(host="127.0.0.2", port=site.port)
    except OSError:
        unavailable("cannot bind 127.0.0.2 here")
    with rebound:
        resolver = FakeResolver(["127.0.0.1"], ["127.0.0.2"])
        policy = FetchPolicy(allow=AllowList.parse([site.address]), resolver=resolver)
        page = fetch_page(f"http://news.test:{site.port}/articles/gazpacho.html", policy)
        assert page.address == "127.0.0.1" and "Gazpacho" in page.text
        assert resolver.calls == ["news.test"]
        assert [(a.path, a.host) for a in site.log] == [("/articles/gazpacho.html", f"news.test:{site.port}")]
        assert rebound.connections == 0


def test_proxies_in_the_environment_are_not_used(
    site: ArticleSite, other_site: ArticleSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy resolves and connects by itself, around the checked address: the fetch must go
    straight to the address it checked, whatever the environment names (a guard: a switch to a
    client that honours these variables, such as requests or urllib, would fail here)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, other_site.url("/"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    page = fetch_page(site.url("/articles/gazpacho.html"), _allowing(site))

    assert page.address == "127.0.0.1" and "Gazpacho" in page.text
    assert [a.path for a in site.log] == ["/articles/gazpacho.html"]
    assert other_site.connections == 0


# -- redirects ----------------------------------------------------------------------------------


def test_a_redirect_chain_is_followed_and_recorded(site: ArticleSite) -> None:
    page = fetch_page(site.url("/redirect/3?to=/articles/tren-nocturno.html"), _allowing(site))
    assert page.redirects == [
        site.url("/redirect/2?to=/articles/tren-nocturno.html"),
        site.url("/redirect/1?to=/articles/tren-nocturno.html"),
        site.url("/articles/tren-nocturno.html"),
    ]
    assert page.final_url == site.url("/articles/tren-nocturno.html")
    assert "Vuelve el tren nocturno" in page.text
    assert len(site.log) == 4


@pytest.mark.parametrize("location", ["file:///etc/passwd", "gopher://127.0.0.1:6379/_INFO", "//10.0.0.1/x"])
def test_a_redirect_off_http_or_to_a_private_host_is_refused(site: ArticleSite, location: str) -> None:
    reason = _refused(site.url(f"/redirect-to?url={location}"), _allowing(site))
    assert reason.startswith(("only http and https URLs are fetched", "blocked: 10.0.0.1 (private)"))


def test_a_url_with_accents_is_sent_percent_encoded(site: ArticleSite) -> None:
    page = fetch_page(site.url("/articles/gazpacho.html?ref=campaña"), _allowing(site))
    assert "Gazpacho" in page.text
    moved = fetch_page(
        site.url("/redirect-to?url=/articles/gazpacho.html%3Fref%3Dni%C3%B1os"), _allowing(site)
    )
    assert moved.final_url == site.url("/articles/gazpacho.html?ref=niños")
    assert [a.path for a in site.log][::2] == [
        "/articles/gazpacho.html?ref=campa%C3%B1a",
        "/articles/gazpacho.html?ref=ni%C3%B1os",
    ]


def test_an_over_long_redirect_chain_is_refused(site: ArticleSite) -> None:
    reason = _refused(site.url("/redirect/6"), _allowing(site))
    assert reason == f"too many redirects (more than 5) from {site.url('/redirect/6')}"
    assert [a.path for a in site.log] == [f"/redirect/{n}" for n in range(6, 0, -1)]  # the 6th hop not taken
    assert fetch_page(site.url("/redirect/5"), _allowing(site)).status == 200


# -- size, time, type, encoding -----------------------------------------------------------------


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/self/status")


def test_a_50_mb_response_is_cut_at_the_cap_without_buffering_it(site: ArticleSite) -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to the current RSS
        peak = "VmHWM"
    except OSError:  # not allowed in this container: compare the RSS after instead of the peak
        peak = "VmRSS"
    before = _rss_kib("VmRSS")
    reason = _refused(site.url("/huge"), _allowing(site))
    peak_growth_mib = (_rss_kib(peak) - before) / 1024
    assert reason == "too large: more than 5000000 bytes"
    assert peak_growth_mib < 25, f"peak RSS grew {peak_growth_mib:.0f} MiB for a 5 MB cap"
    site.stop()  # waits for the sender: its log entry says how much it managed to send
    (huge,) = site.requests_to("/huge")
    assert huge.bytes_sent < HUGE_BYTES / 2


def test_a_declared_length_over_the_cap_is_refused_before_reading(site: ArticleSite) -> None:
    assert _refused(site.url("/huge?declare=1"), _allowing(site)) == (
        f"too large: Content-Length {HUGE_BYTES} bytes, limit 5000000"
    )


def _in_thread(call: Callable[[], FetchedPage]) -> BaseException | FetchedPage | None:
    """Run ``call`` on a thread; ``None`` if it is still running after a minute (a hang)."""
    outcome: list[BaseException | FetchedPage] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    return outcome[0] if outcome else None


@pytest.mark.parametrize("path", ["/slow?interval=0.2", "/slow-headers?interval=0.2"])
def test_an_endless_slow_response_is_ended_by_the_total_timeout(site: ArticleSite, path: str) -> None:
    """A byte every 0.2 s, in the body or inside a header line, never trips the 10 s read timeout;
    only the total timeout ends it."""
    policy = _allowing(site, read_timeout=10, total_timeout=2)
    outcome = _in_thread(lambda: fetch_page(site.url(path), policy))
    assert isinstance(outcome, PermanentStepError), f"the fetch did not end as too slow: {outcome!r}"
    assert outcome.reason == "too slow: no complete response within 2 seconds"


def test_a_server_that_goes_quiet_is_a_transient_read_timeout(site: ArticleSite) -> None:
    policy = _allowing(site, read_timeout=1, total_timeout=30)
    with pytest.raises(TransientStepError) as caught:
        fetch_page(site.url("/slow?interval=20"), policy)
    assert caught.value.reason == "read timeout: no data for 1 seconds"


@pytest.mark.parametrize(
    ("path", "media"), [("/notes.pdf", "application/pdf"), ("/data/precios.csv", "text/csv")]
)
def test_a_non_html_file_is_refused(site: ArticleSite, path: str, media: str) -> None:
    assert _refused(site.url(path), _allowing(site)) == f"not HTML: {media}"


def test_latin1_bytes_declared_utf8_give_correct_spanish_text(site: ArticleSite) -> None:
    page = fetch_page(site.url("/articles/codificacion-erronea.html"), _allowing(site))
    assert page.declared_charset == "utf-8"
    assert page.charset == "cp1252" and page.charset_source in ("detected", "fallback")
    for words in (
        "<title>Año nuevo en la montaña</title>",
        "¿Dónde se recibe",
        "Íñigo Ibáñez",
        "¡Feliz año!",
    ):
        assert words in page.text
    assert "\ufffd" not in page.text


def test_utf8_bytes_declared_latin1_give_correct_spanish_text(site: ArticleSite) -> None:
    page = fetch_page(site.url("/articles/declarado-latin1.html"), _allowing(site))
    assert (page.declared_charset, page.charset, page.charset_source) == ("iso-8859-1", "utf-8", "utf-8")
    assert "<h1>¿Qué pasó con el puente?</h1>" in page.text and "Conchi Núñez" in page.text
    assert "Ã" not in page.text


# -- statuses -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("/status/404", "HTTP 404 Not Found"),
        ("/no-such-page.html", "HTTP 404 Not Found"),
        ("/status/410", "HTTP 410 Gone"),
        ("/status/403", "HTTP 403 Forbidden"),
        ("/status/451", "HTTP 451 Unavailable For Legal Reasons"),
    ],
)
def test_a_missing_or_forbidden_page_is_permanent(site: ArticleSite, path: str, what: str) -> None:
    assert _refused(site.url(path), _allowing(site)) == f"{what}: {site.url(path)}"


def test_503_with_retry_after_seconds_is_transient(site: ArticleSite) -> None:
    with pytest.raises(TransientStepError) as caught:
        fetch_page(site.url("/status/503?retry_after=30"), _allowing(site))
    assert caught.value.retry_after == 30.0
    assert caught.value.reason.startswith("HTTP 503 Service Unavailable, retry after 30 s")


def test_429_with_retry_after_as_a_date_is_transient(site: ArticleSite) -> None:
    when = formatdate(_now() + 3600, usegmt=True).replace(" ", "%20")
    with pytest.raises(TransientStepError) as caught:
        fetch_page(site.url(f"/status/429?retry_after={when}"), _allowing(site))
    assert caught.value.retry_after is not None and 3000 < caught.value.retry_after <= 3600


def test_a_refused_connection_is_transient(site: ArticleSite) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = FetchPolicy(allow=AllowList.parse([f"127.0.0.1:{port}"]))
    with pytest.raises(TransientStepError) as caught:
        fetch_page(f"http://127.0.0.1:{port}/", policy)
    assert "could not connect to 127.0.0.1" in caught.value.reason and "refused" in caught.value.reason


def _now() -> float:
    import time

    return time.time()


# -- TLS: connect to the checked address, verify the certificate for the URL's name ----------------


def _self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A certificate for ``name`` and its key, written as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def test_https_connects_to_the_checked_address_with_sni_and_verifies_the_name(tmp_path: Path) -> None:
    import ssl

    cert_file, key_file = _self_signed(tmp_path, "news.test")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert_file, key_file)
    sni: list[str | None] = []
    server_tls.sni_callback = lambda sock, name, ctx: sni.append(name)  # type: ignore[assignment,misc,return-value]
    client_tls = ssl.create_default_context(cafile=str(cert_file))
    with serve(tls=server_tls) as tls_site:
        resolver = FakeResolver(["127.0.0.1"])
        policy = FetchPolicy(
            allow=AllowList.parse([tls_site.address]), resolver=resolver, ssl_context=client_tls
        )
        page = fetch_page(f"https://news.test:{tls_site.port}/articles/gazpacho.html", policy)
        assert page.address == "127.0.0.1" and "Gazpacho" in page.text
        assert sni == ["news.test"]
        assert [a.host for a in tls_site.log] == [f"news.test:{tls_site.port}"]
        # the same address under a name the certificate does not carry: refused, no request sent
        reason = _refused(f"https://other.test:{tls_site.port}/articles/gazpacho.html", policy)
        assert reason.startswith("TLS certificate not valid for other.test")
        assert len(tls_site.log) == 1
