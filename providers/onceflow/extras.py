"""The provider's optional features, the pip extra that installs each, and a clear error when
one is missing.

The runtime dependencies are what every deployment needs (Airflow, SQLAlchemy, Alembic: all of
them already installed by Airflow). A feature that needs more checks for it where it starts, so
the task log says which extra to install instead of a bare ``No module named 'matplotlib'``.
"""

from __future__ import annotations

import importlib.util

PACKAGE = "airflow-provider-onceflow"

# extra -> (the feature, modules it imports). pyproject.toml's [project.optional-dependencies]
# has the same keys (tests/unit/test_extras.py checks it).
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sheets": ("the Sheet queue (Airflow's GSheetsHook)", ("airflow.providers.google", "googleapiclient")),
    "sales": ("daily_sales (cleaning and partition loads)", ("pandas", "pyarrow")),
    "bigquery": (
        "daily_sales into BigQuery",
        ("airflow.providers.google", "google.cloud.bigquery", "pandas"),
    ),
    "dashboard": ("the sales dashboard's chart", ("matplotlib",)),
    "postgres": ("a PostgreSQL database through psycopg2", ("psycopg2",)),
    "articles": (
        "the article chain (extraction, language detection, HTML sanitising)",
        ("trafilatura", "lingua", "nh3", "google.cloud.translate_v3"),
    ),
}


class MissingExtra(ImportError):
    """A feature's optional dependencies are not installed; the message names the extra."""

    def __init__(self, extra: str, module: str) -> None:
        feature = EXTRAS[extra][0]
        self.extra = extra
        super().__init__(
            f"{feature} needs {module!r}, which is not installed: pip install '{PACKAGE}[{extra}]'",
            name=module,
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def require(extra: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` can be imported."""
    for module in EXTRAS[extra][1]:
        if not _importable(module):
            raise MissingExtra(extra, module)
