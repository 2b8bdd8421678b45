"""Google Cloud Translation v3 (``translateText``) through the real ``google-cloud-translate`` client.

REST transport, so a local stub (:mod:`onceflow.testing.translate_stub`) or any HTTP endpoint can
stand in for Google: with ``endpoint`` set the client talks to it with anonymous credentials.

Limits respected (from the v3 ``TranslateTextRequest.contents`` reference: "We recommend the total
content be less than 30k codepoints. The max length of this field is 1024"):

* :data:`MAX_CODEPOINTS_PER_REQUEST` = 30,000 code points of content per request;
* :data:`MAX_SEGMENTS_PER_REQUEST` = 1,024 strings per request;
* :data:`MAX_CHARS` = 5,000 code points per chunk (what the translate hook chunks to), so one
  paragraph is one segment and a request carries several.

Chunks are batched in order into as few requests as those limits allow. The client's own retry is
off (``translate_text`` has none by default, and none is passed): a 429, a 5xx or a timeout
becomes a :class:`~onceflow.articles.errors.TransientStepError` (with the server's ``Retry-After``)
and Airflow's retry repeats the step; a 400, 401, 403 or 404 cannot get better by waiting and
becomes a :class:`~onceflow.articles.errors.PermanentStepError`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from onceflow.articles.errors import PermanentStepError, TransientStepError

MAX_CODEPOINTS_PER_REQUEST = 30_000
MAX_SEGMENTS_PER_REQUEST = 1_024
MAX_CHARS = 5_000

_PERMANENT_STATUS = {400, 401, 403, 404}
_REQUEST_PREFIX = re.compile(r"^[A-Z]+ \S+: ")


def batches(chunks: list[str], *, max_codepoints: int, max_segments: int) -> list[list[str]]:
    """``chunks`` in order, grouped into requests within both limits.

    :raises PermanentStepError: when one chunk alone is over ``max_codepoints``.
    """
    out: list[list[str]] = []
    size = 0
    for i, chunk in enumerate(chunks):
        if len(chunk) > max_codepoints:
            raise PermanentStepError(
                f"translate: chunk {i + 1} has {len(chunk)} code points, over the {max_codepoints} "
                "a request may carry",
                step="translate",
            )
        if not out or size + len(chunk) > max_codepoints or len(out[-1]) >= max_segments:
            out.append([])
            size = 0
        out[-1].append(chunk)
        size += len(chunk)
    return out


def _message(err: Any) -> str:
    """The server's message, without the ``POST <url>: `` the REST transport puts before it."""
    return _REQUEST_PREFIX.sub("", str(err.message or ""))


def _retry_after(err: Any) -> float | None:
    response = getattr(err, "response", None)
    value = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None  # "inf", "nan": unreadable


class GoogleTranslator:
    """:class:`~onceflow.articles.translate.base.Translator` on Cloud Translation v3.

    :param project_id: the Google Cloud project billed.
    :param location: ``global`` or a region (glossaries live in a region, e.g. ``us-central1``).
    :param endpoint: API base URL to use instead of Google's (a stub: ``http://127.0.0.1:PORT``);
        with it, the client sends anonymous credentials.
    :param credentials: ``google.auth`` credentials (default: anonymous with ``endpoint``, else ADC).
    :param glossary: a glossary id in ``project_id``/``location`` to apply.
    :param timeout: seconds per request.
    :param max_codepoints: content code points per request (lower it to test batching).
    :param max_segments: strings per request.
    """

    name = "google"

    def __init__(
        self,
        project_id: str,
        location: str = "global",
        endpoint: str | None = None,
        credentials: Any = None,
        glossary: str | None = None,
        *,
        timeout: float = 60.0,
        max_codepoints: int = MAX_CODEPOINTS_PER_REQUEST,
        max_segments: int = MAX_SEGMENTS_PER_REQUEST,
    ) -> None:
        self.project_id = project_id
        self.location = location
        self.endpoint = endpoint
        self.credentials = credentials
        self.glossary = glossary
        self.timeout = timeout
        self.max_codepoints = max_codepoints
        self.max_segments = max_segments
        self._client: Any = None
        #: requests sent by this translator (each one ``translateText`` call).
        self.requests = 0

    @property
    def parent(self) -> str:
        """The ``projects/<id>/locations/<location>`` resource the requests go to."""
        return f"projects/{self.project_id}/locations/{self.location}"

    def client(self) -> Any:
        """The ``TranslationServiceClient`` (REST transport), built on first use."""
        if self._client is None:
            from google.cloud import translate_v3

            credentials = self.credentials
            options: dict[str, Any] = {}
            if self.endpoint:
                options["api_endpoint"] = self.endpoint
                if credentials is None:
                    from google.auth.credentials import AnonymousCredentials

                    credentials = AnonymousCredentials()
            self._client = translate_v3.TranslationServiceClient(
                credentials=credentials, transport="rest", client_options=options or None
            )
        return self._client

    def _request(self, contents: list[str], source: str, target: str) -> list[str]:
        from google.api_core import exceptions as api

        request: dict[str, Any] = {
            "parent": self.parent,
            "contents": contents,
            "mime_type": "text/plain",
            "source_language_code": source,
            "target_language_code": target,
        }
        if self.glossary:
            request["glossary_config"] = {"glossary": f"{self.parent}/glossaries/{self.glossary}"}
        self.requests += 1
        try:
            response = self.client().translate_text(request=request, timeout=self.timeout)
        except api.GoogleAPICallError as err:
            code = err.code if isinstance(err.code, int) else 0
            if isinstance(err, api.DeadlineExceeded) or code == 429 or code >= 500:
                raise TransientStepError(
                    f"translate: Cloud Translation answered {code or type(err).__name__}: {_message(err)}",
                    step="translate",
                    retry_after=_retry_after(err),
                ) from err
            if code in _PERMANENT_STATUS:
                raise PermanentStepError(
                    f"translate: Cloud Translation refused the request ({code}): {_message(err)}",
                    step="translate",
                ) from err
            raise
        except OSError as err:  # requests' ConnectionError and timeouts are OSErrors
            raise TransientStepError(
                f"translate: Cloud Translation unreachable: {err}", step="translate"
            ) from err
        translations = response.glossary_translations if self.glossary else response.translations
        if len(translations) != len(contents):
            raise TransientStepError(
                f"translate: Cloud Translation returned {len(translations)} translations for {len(contents)} texts",
                step="translate",
            )
        return [t.translated_text for t in translations]

    def translate_chunks(self, chunks: list[str], source: str, target: str) -> list[str]:
        """Translate the chunks in as few requests as the API's code-point and segment limits allow."""
        out: list[str] = []
        for batch in batches(chunks, max_codepoints=self.max_codepoints, max_segments=self.max_segments):
            out += self._request(batch, source, target)
        return out
