"""Apertium: offline rule-based translation through the ``apertium`` command (the embedded default).

Debian packages ``apertium`` (the pipeline) and a language pair such as ``apertium-eng-spa`` (modes
``spa-eng`` and ``eng-spa``). Each chunk is one ``apertium -f txt <mode>`` process (about 0.1 s to
start; chunks are large, so an article is a few calls). ``-z`` (null-flush) would batch chunks in
one process, but the ``apertium`` wrapper of Debian's 3.8 drops the separators, so it is not used.

Unknown words keep Apertium's ``*`` marker by default (``*palabra``): the score step counts them
and the polish step replaces them from the glossary; :func:`strip_markers` removes them for the
published text. A ``*`` already in the source text before a word is indistinguishable from a
marker and is removed too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from functools import lru_cache

from onceflow.articles.errors import PermanentStepError, TransientStepError

#: ISO 639-1 -> the ISO 639-3 codes Apertium names its modes with.
APERTIUM_CODES: dict[str, str] = {
    "ca": "cat",
    "de": "deu",
    "en": "eng",
    "es": "spa",
    "eu": "eus",
    "fr": "fra",
    "gl": "glg",
    "it": "ita",
    "nl": "nld",
    "oc": "oci",
    "pt": "por",
    "ro": "ron",
}
PACKAGES_HINT = "Debian packages 'apertium' and a language pair such as 'apertium-eng-spa'"
_MODE = re.compile(r"^([a-z]{2,3})-([a-z]{2,3})(?:_[A-Za-z0-9_]+)?$")
_MARKER = re.compile(r"(?<![\w*])\*(?=\w)")
# characters Apertium's stream reads as control: NUL (its flush) glues the words around it into
# one unknown word, U+FFFF silently ends the output there; a space keeps the words apart
_STREAM_BREAKERS = {0x0: " ", 0xFFFF: " "}


def strip_markers(text: str) -> str:
    """``text`` without Apertium's unknown-word markers (``*palabra`` -> ``palabra``)."""
    return _MARKER.sub("", text)


def apertium_code(code: str) -> str:
    """``es`` -> ``spa``; a three-letter code is returned as is.

    :raises PermanentStepError: for a language Apertium has no code for here.
    """
    if len(code) == 3:
        return code
    try:
        return APERTIUM_CODES[code]
    except KeyError:
        raise PermanentStepError(
            f"translate: no Apertium language code for {code!r} (known: {', '.join(sorted(APERTIUM_CODES))})",
            step="translate",
        ) from None


def mode_pair(mode: str) -> tuple[str, str]:
    """``spa-eng_US`` -> ``("spa", "eng")``.

    :raises ValueError: for a string that is not a mode name.
    """
    match = _MODE.match(mode)
    if match is None:
        raise ValueError(f"not an Apertium mode name: {mode!r} (expected e.g. 'spa-eng')")
    return match.group(1), match.group(2)


@lru_cache(maxsize=4)
def _installed_modes(command: str) -> tuple[str, ...]:
    result = subprocess.run([command, "-l"], capture_output=True, text=True, timeout=60, check=False)
    return tuple(sorted(line.strip() for line in result.stdout.splitlines() if line.strip()))


class ApertiumTranslator:
    """:class:`~onceflow.articles.translate.base.Translator` running ``apertium`` locally.

    :param mode: the translation direction (``apertium -l`` lists them), e.g. ``spa-eng``.
    :param mark_unknown: keep the ``*`` before unknown words (default; the score step uses it).
    :param timeout: seconds one chunk may take before the attempt counts as failed (transient).
    :param binary: the ``apertium`` command, looked up on ``PATH``.
    """

    name = "apertium"

    def __init__(
        self,
        mode: str = "spa-eng",
        *,
        mark_unknown: bool = True,
        timeout: float = 120.0,
        binary: str = "apertium",
    ) -> None:
        self.pair = mode_pair(mode)
        self.mode = mode
        self.mark_unknown = mark_unknown
        self.timeout = timeout
        self.binary = binary

    @classmethod
    def for_languages(
        cls,
        source: str,
        target: str,
        *,
        mark_unknown: bool = True,
        timeout: float = 120.0,
        binary: str = "apertium",
    ) -> ApertiumTranslator:
        """The translator for ``source`` -> ``target`` (ISO 639-1), mode ``<src3>-<tgt3>``."""
        mode = f"{apertium_code(source)}-{apertium_code(target)}"
        return cls(mode, mark_unknown=mark_unknown, timeout=timeout, binary=binary)

    def _command(self) -> str:
        path = shutil.which(self.binary)
        if path is None:
            raise PermanentStepError(
                f"translate: the {self.binary!r} command is not on PATH; install the {PACKAGES_HINT}",
                step="translate",
            )
        return path

    def installed_modes(self) -> list[str]:
        """The modes ``apertium -l`` lists, sorted (asked once per process and command)."""
        return list(_installed_modes(self._command()))

    def _check(self, source: str, target: str) -> str:
        wanted = (apertium_code(source), apertium_code(target))
        installed = self.installed_modes()
        if wanted != self.pair:
            raise PermanentStepError(
                f"translate: Apertium mode {self.mode} translates {'-'.join(self.pair)}, not "
                f"{source}->{target}; installed modes: {', '.join(installed) or 'none'}",
                step="translate",
            )
        if self.mode not in installed:
            raise PermanentStepError(
                f"translate: Apertium mode {self.mode} is not installed (installed: "
                f"{', '.join(installed) or 'none'}); install the Debian package of that pair (the "
                f"{PACKAGES_HINT})",
                step="translate",
            )
        return self._command()

    def translate_chunks(self, chunks: list[str], source: str, target: str) -> list[str]:
        """Translate each chunk with the ``apertium`` command of the installed pair, one process per chunk."""
        command = self._check(source, target)
        args = [command, "-f", "txt", *([] if self.mark_unknown else ["-u"]), self.mode]
        out: list[str] = []
        for i, chunk in enumerate(chunks):
            where = f"chunk {i + 1} of {len(chunks)}"
            returncode, stdout, stderr = self._run(args, chunk, where)
            if returncode != 0:
                raise PermanentStepError(
                    f"translate: apertium {self.mode} failed on {where} "
                    f"(exit {returncode}): {stderr.decode('utf-8', 'replace').strip()[:300]}",
                    step="translate",
                )
            try:
                text = stdout.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PermanentStepError(
                    f"translate: apertium {self.mode} wrote invalid UTF-8 for {where} ({exc.reason} "
                    f"at byte {exc.start})",
                    step="translate",
                ) from exc
            out.append(text.strip())
        return out

    def _run(self, args: list[str], chunk: str, where: str) -> tuple[int, bytes, bytes]:
        """One ``apertium`` run over ``chunk``: (exit status, stdout, stderr).

        ``apertium`` is a shell script running a pipeline of programs: on a timeout, killing the
        script alone would leave the pipeline running, orphaned, so it runs in a session of its
        own and the whole process group is killed.
        """
        with subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(
                    chunk.translate(_STREAM_BREAKERS).encode("utf-8"), timeout=self.timeout
                )
            except subprocess.TimeoutExpired as exc:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise TransientStepError(
                    f"translate: apertium {self.mode} took over {self.timeout:g} s on {where} "
                    f"({len(chunk)} characters)",
                    step="translate",
                ) from exc
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                raise
        return process.returncode, stdout, stderr
