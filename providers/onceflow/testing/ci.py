"""What a test does when something it needs is missing: skip on a developer machine, fail in CI.

CI (``CI=true``, set by ``.ci/run``) must run every test: a skip there would hide a failure.
"""

from __future__ import annotations

import os
from typing import NoReturn


def in_ci() -> bool:
    """Whether this run is CI (``CI`` is 1, true or yes, as CI services set it)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``; in CI, fail it instead."""
    import pytest  # here, not above: benchmarks use in_ci() through onceflow.testing.postgres

    if in_ci():
        pytest.fail(f"{reason} (CI runs this test; it must not skip)", pytrace=False)
    pytest.skip(reason)
