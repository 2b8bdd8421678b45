"""A Cloud Translation v3 stand-in on 127.0.0.1, driven by the real ``google-cloud-translate`` client.

It answers ``POST /v3/projects/{project}/locations/{location}:translateText`` (and the
location-less ``/v3/projects/{project}:translateText``) with the JSON the REST API returns, and
models what the article chain depends on:

* **really translates, deterministically**: with ``engine="apertium"`` (or ``"auto"`` when the pair's
  Apertium mode is installed) each text goes through ``apertium -u`` (no unknown-word markers, as
  Google has none); with ``engine="tag"`` (or ``"auto"`` without the mode) a text becomes
  ``"[<target>] <text>"``, which :func:`untag` reverses exactly;
* **limits like Google's**: more than ``max_codepoints`` code points of contents (30,000) or more
  than ``max_segments`` strings (1,024) in one request is a 400 ``INVALID_ARGUMENT``; a missing
  field is a 400; a project other than the stub's is a 403 ``PERMISSION_DENIED``;
* **glossaries**: :meth:`TranslateStub.add_glossary`; a request naming one gets
  ``glossaryTranslations`` in which each term (whole word, any case) became its target term and
  was left alone by the translation; an unknown glossary is a 404;
* **faults**: :meth:`TranslateStub.fail_next` answers the next requests with a 429 (and a
  ``Retry-After``) or a 503 instead; :meth:`TranslateStub.delay_next` answers them late;
* a **request log**: :attr:`TranslateStub.log`, one :class:`StubRequest` per request, in order.

Use it with :func:`serve`::

    with serve() as stub:
        GoogleTranslator("onceflow-test", endpoint=stub.url).translate_chunks(["Hola."], "es", "en")
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

from onceflow.articles.translate.apertium import APERTIUM_CODES

MAX_CODEPOINTS = 30_000
MAX_SEGMENTS = 1_024
_PATH = re.compile(r"^/v3/projects/([^/:]+)(?:/locations/([^/:]+))?:translateText$")
_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def untag(text: str) -> str:
    """Reverse the ``tag`` engine: ``"[en] Hola"`` -> ``"Hola"``."""
    return re.sub(r"^\[[a-z-]+\] ", "", text)


@dataclass(frozen=True)
class StubRequest:
    """One request as received: path, JSON body (``None`` when it was not JSON) and the status sent."""

    path: str
    body: dict[str, Any] | None
    status: int


class _Failure(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


class TranslateStub(ThreadingHTTPServer):
    """The stub server; see the module docstring. ``with TranslateStub() as stub:`` serves it.

    :param project: the only project it answers for.
    :param engine: ``auto``, ``apertium`` or ``tag``.
    :param max_codepoints: contents code points allowed per request.
    :param max_segments: strings allowed per request.
    """

    daemon_threads = True

    def __init__(
        self,
        project: str = "onceflow-test",
        *,
        engine: str = "auto",
        max_codepoints: int = MAX_CODEPOINTS,
        max_segments: int = MAX_SEGMENTS,
    ) -> None:
        if engine not in ("auto", "apertium", "tag"):
            raise ValueError(f"engine must be auto, apertium or tag, not {engine!r}")
        super().__init__(("127.0.0.1", 0), _Handler)
        self.project = project
        self.engine = engine
        self.max_codepoints = max_codepoints
        self.max_segments = max_segments
        self.lock = threading.Lock()
        #: every request, in order.
        self.log: list[StubRequest] = []
        self.glossaries: dict[str, dict[str, str]] = {}
        self._faults: list[tuple[int, float | None]] = []
        self._delays: list[float] = []
        self._closing = threading.Event()
        self._modes: list[str] | None = None

    @property
    def url(self) -> str:
        """Base URL for ``GoogleTranslator(endpoint=...)``."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> TranslateStub:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()  # a delayed answer stops waiting
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (its deadline passed) is expected here; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    # -- test controls ------------------------------------------------------------------------

    def fail_next(self, status: int, *, count: int = 1, retry_after: float | None = None) -> None:
        """Answer the next ``count`` requests with ``status`` (429 or 503), with ``Retry-After`` if given."""
        with self.lock:
            self._faults += [(status, retry_after)] * count

    def delay_next(self, seconds: float, *, count: int = 1) -> None:
        """Answer the next ``count`` requests only after ``seconds`` (a slow or hung backend)."""
        with self.lock:
            self._delays += [seconds] * count

    def add_glossary(self, glossary_id: str, terms: dict[str, str]) -> None:
        """A glossary (source term -> target term) requests may name in ``glossaryConfig``."""
        self.glossaries[glossary_id] = dict(terms)

    # -- the model ----------------------------------------------------------------------------

    def _apertium_mode(self, source: str, target: str) -> str | None:
        if self.engine == "tag" or shutil.which("apertium") is None:
            return None
        if self._modes is None:
            listed = subprocess.run(["apertium", "-l"], capture_output=True, text=True, check=False).stdout
            self._modes = [line.strip() for line in listed.splitlines() if line.strip()]
        mode = f"{APERTIUM_CODES.get(source, source)}-{APERTIUM_CODES.get(target, target)}"
        return mode if mode in self._modes else None

    def _translate(self, text: str, source: str, target: str) -> str:
        mode = self._apertium_mode(source, target)
        if mode is None:
            if self.engine == "apertium":
                raise _Failure(400, f"Unsupported language pair: {source} to {target}")
            return f"[{target}] {text}"
        result = subprocess.run(
            ["apertium", "-u", "-f", "txt", mode], input=text, capture_output=True, text=True, check=True
        )
        return result.stdout.strip()

    def _with_glossary(self, text: str, terms: dict[str, str], source: str, target: str) -> str:
        """Translate with the glossary's terms kept: each term becomes a number the translation
        leaves alone (as Google protects glossary terms), then the number becomes the target term."""
        tokens: dict[str, str] = {}
        for i, term in enumerate(sorted(terms, key=len, reverse=True)):
            token = str(990_001 + i)
            tokens[token] = terms[term]
            text = re.sub(rf"(?<!\w){re.escape(term)}(?!\w)", token, text, flags=re.IGNORECASE)
        translated = self._translate(text, source, target)
        return re.sub(r"\b99\d{4}\b", lambda m: tokens.get(m.group(), m.group()), translated)

    def answer(self, project: str, location: str, body: dict[str, Any]) -> dict[str, Any]:
        """The response body for one request, or :class:`_Failure`."""
        with self.lock:
            fault = self._faults.pop(0) if self._faults else None
            delay = self._delays.pop(0) if self._delays else 0.0
        self._closing.wait(delay)
        if fault is not None:
            status, retry_after = fault
            message = "Quota exceeded" if status == 429 else "The service is currently unavailable."
            raise _Failure(status, message, retry_after)
        if project != self.project:
            raise _Failure(403, f"Permission denied on project {project} (or it may not exist).")
        contents = body.get("contents")
        target = body.get("targetLanguageCode")
        source = body.get("sourceLanguageCode")
        if not isinstance(contents, list) or not contents or not all(isinstance(c, str) for c in contents):
            raise _Failure(400, "contents: a non-empty list of strings is required.")
        if not target:
            raise _Failure(400, "Target language is empty.")
        if not source:
            raise _Failure(400, "This stub needs sourceLanguageCode (it does not detect languages).")
        if len(contents) > self.max_segments:
            raise _Failure(400, f"Too many text segments: {len(contents)} > {self.max_segments}.")
        size = sum(len(c) for c in contents)
        if size > self.max_codepoints:
            raise _Failure(400, f"Text too long: {size} code points > {self.max_codepoints}.")
        translations = [{"translatedText": self._translate(c, source, target)} for c in contents]
        out: dict[str, Any] = {"translations": translations}
        glossary = (body.get("glossaryConfig") or {}).get("glossary")
        if glossary:
            name = glossary.rsplit("/", 1)[-1]
            if name not in self.glossaries:
                raise _Failure(404, f"Glossary not found: {glossary}")
            terms = self.glossaries[name]
            out["glossaryTranslations"] = [
                {
                    "translatedText": self._with_glossary(c, terms, source, target),
                    "glossaryConfig": {"glossary": glossary},
                }
                for c in contents
            ]
        return out


class _Handler(BaseHTTPRequestHandler):
    server: TranslateStub

    def log_message(self, format: str, *args: Any) -> None:  # quiet; the stub keeps its own log
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        body: dict[str, Any] | None = None
        try:
            match = _PATH.match(self.path.split("?", 1)[0])
            if match is None:
                raise _Failure(404, f"The requested URL {self.path} was not found on this server.")
            try:
                parsed = json.loads(raw or b"{}")
            except ValueError as exc:
                raise _Failure(400, f"Invalid JSON payload received: {exc}") from exc
            if not isinstance(parsed, dict):
                raise _Failure(400, "Invalid JSON payload received: not an object.")
            body = parsed
            status, payload, headers = (
                200,
                self.server.answer(match.group(1), match.group(2) or "global", body),
                {},
            )
        except Exception as exc:  # the stub's own fault (apertium failed, ...): a 500, as Google would
            failure = exc if isinstance(exc, _Failure) else _Failure(500, f"Internal error: {exc!r}")
            status = failure.status
            payload = {
                "error": {
                    "code": status,
                    "message": failure.message,
                    "status": _STATUS.get(status, "UNKNOWN"),
                }
            }
            headers = {} if failure.retry_after is None else {"Retry-After": f"{failure.retry_after:g}"}
        with self.server.lock:
            self.server.log.append(StubRequest(self.path, body, status))
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def serve(
    project: str = "onceflow-test",
    *,
    engine: str = "auto",
    max_codepoints: int = MAX_CODEPOINTS,
    max_segments: int = MAX_SEGMENTS,
) -> Iterator[TranslateStub]:
    """Run a :class:`TranslateStub` on a free 127.0.0.1 port for the ``with`` block."""
    with TranslateStub(
        project, engine=engine, max_codepoints=max_codepoints, max_segments=max_segments
    ) as stub:
        yield stub


__all__ = ["StubRequest", "TranslateStub", "serve", "untag"]
