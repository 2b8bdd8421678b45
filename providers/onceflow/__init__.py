"""onceflow: exactly-once side effects for Apache Airflow 3."""

from __future__ import annotations

__version__ = "0.1.0"
