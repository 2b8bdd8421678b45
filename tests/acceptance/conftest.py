"""The wheel tests' shared wheel: built once per session (``uv build``, offline) for the three
modules that install it (test_wheel_install, test_airflow_versions, test_install_keeps_airflow)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from wheel_env import build_wheel, require_prepared

    require_prepared()  # a machine that skipped `make install` fails here, never goes online
    return build_wheel(tmp_path_factory.mktemp("dist"))
