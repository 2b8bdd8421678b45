"""A test that needs PostgreSQL fails in CI when the server is missing, and skips elsewhere."""

from __future__ import annotations

import pytest

from onceflow.testing.ports import free_port

pytest_plugins = ["pytester"]

INNER = """
def test_needs_postgres(onceflow_postgres_url):
    assert onceflow_postgres_url.startswith("postgresql")
"""


@pytest.fixture
def dead_server(monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/postgres"
    for var in ("CI", "ONCEFLOW_TEST_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    return url


def test_missing_postgres_fails_in_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dead_server: str
) -> None:
    monkeypatch.setenv("ONCEFLOW_TEST_DATABASE_URL", dead_server)
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # pytest.fail in fixture setup is reported as an error: the run fails, nothing is skipped.
    result.assert_outcomes(errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*PostgreSQL is required here*"])


def test_missing_postgres_skips_on_a_developer_machine(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dead_server: str
) -> None:
    # Simulate a laptop without PostgreSQL: no CI variables, and the default URL points nowhere.
    monkeypatch.setattr("onceflow.testing.postgres.DEFAULT_SERVER_URL", dead_server)
    pytester.makeconftest(f"import onceflow.testing.postgres as p\np.DEFAULT_SERVER_URL = {dead_server!r}\n")
    pytester.makepyfile(INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*PostgreSQL unavailable*"])
