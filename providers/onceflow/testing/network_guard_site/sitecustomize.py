"""Installs onceflow's network guard at interpreter start-up in a test suite's child processes.

The onceflow pytest plugin puts this folder first on ``PYTHONPATH`` and sets
``ONCEFLOW_NETWORK_GUARD=1`` (``onceflow.testing.network_guard``). Python imports the first
``sitecustomize`` on ``sys.path``, so this one then runs the next one found, if any, as Python
would have.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("ONCEFLOW_NETWORK_GUARD") == "1":
    try:
        from onceflow.testing import network_guard
    except ImportError as exc:  # a child of another interpreter: say so, never start unguarded silently
        sys.stderr.write(f"onceflow network guard: cannot install in {sys.executable}: {exc}\n")
    else:
        network_guard.install()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


_chain()
