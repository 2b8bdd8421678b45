"""The extras named in pyproject.toml are the ones onceflow.extras checks, and they are installed
here (the dev group installs ``[all]``). Their absence is tested against the built wheel in a
plain Airflow (tests/acceptance/test_wheel_install.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onceflow.extras import EXTRAS, MissingExtra, require

if sys.version_info >= (3, 11):
    import tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_every_extra_of_pyproject_is_a_checked_feature() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert set(extras) - {"all"} == set(EXTRAS)
    assert extras["all"] == [f"airflow-provider-onceflow[{','.join(EXTRAS)}]"]


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_an_installed_extra_passes(extra: str) -> None:
    require(extra)


def test_a_missing_module_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXTRAS, "dashboard", ("the sales dashboard's chart", ("no_such_plotting_lib",)))
    with pytest.raises(MissingExtra, match=r"pip install 'airflow-provider-onceflow\[dashboard\]'"):
        require("dashboard")
