"""Installs onceflow's network guard at interpreter start-up in a test suite's child processes.

The onceflow pytest plugin puts this folder first on ``PYTHONPATH`` and sets
``ONCEFLOW_NETWORK_GUARD=1`` (``onceflow.testing.network_guard``). The guard module uses only
the standard library, so it is loaded by its file path: a child running another interpreter or a
venv without onceflow is guarded too. Python imports the first ``sitecustomize`` on ``sys.path``;
this one then runs the next one after its own folder, if any, as Python would have.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_GUARD = os.path.join(os.path.dirname(_HERE), "network_guard.py")


def _install() -> None:
    module = sys.modules.get("onceflow.testing.network_guard")
    if module is None:
        spec = importlib.util.spec_from_file_location("onceflow.testing.network_guard", _GUARD)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {_GUARD}")
        module = importlib.util.module_from_spec(spec)
        # Registered under its package name, so a later `from onceflow.testing import
        # network_guard` finds this instance (and its state) instead of a second copy.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    module.install()


def _report_unguarded(exc: BaseException) -> None:
    """Never run unguarded silently: the refusal log gets a line, which fails the test."""
    message = f"onceflow network guard: cannot install in {sys.executable} {sys.argv[:2]}: {exc!r}"
    sys.stderr.write(message + "\n")
    path = os.environ.get("ONCEFLOW_NETWORK_GUARD_LOG")
    if path:
        line = {
            "pid": os.getpid(),
            "argv": sys.argv[:3],
            "test": os.environ.get("PYTEST_CURRENT_TEST"),
            "event": "unguarded",
            "target": sys.executable,
            "message": message,
        }
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        except OSError:
            pass


def _chain() -> None:
    """Run the next ``sitecustomize`` after this folder on ``sys.path`` (never this one again)."""
    entries = [os.path.abspath(e or os.curdir) for e in sys.path]
    ours = [i for i, e in enumerate(entries) if os.path.isdir(e) and _same(e, _HERE)]
    for entry in entries[(ours[-1] + 1 if ours else 0) :]:
        if os.path.isfile(os.path.join(entry, "sitecustomize.py")) and (
            _same(entry, _HERE) or os.path.basename(entry) == os.path.basename(_HERE)
        ):
            continue  # another copy of this guard's folder (an outer checkout, a wheel)
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


if os.environ.get("ONCEFLOW_NETWORK_GUARD") == "1":
    try:
        _install()
    except Exception as exc:  # a syntax error in a future Python, say: report, do not hide it
        _report_unguarded(exc)
_chain()
