"""``python -m onceflow.sqlite_cli <airflow arguments>``: the ``airflow`` CLI for a SQLite metadata DB.

The same command, with every transaction holding SQLite's write lock from its start
(:func:`onceflow.sqlite_metadata.write_lock_at_begin`): ``backfill create`` then makes its runs in
one transaction that a running scheduler cannot interleave with, instead of committing them one
by one and deleting them again when "database is locked" interrupts it.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``airflow`` CLI on ``sys.argv`` with every SQLite transaction begun ``IMMEDIATE``."""
    from sqlalchemy.engine import Engine

    from onceflow.sqlite_metadata import write_lock_at_begin

    write_lock_at_begin(Engine)  # before Airflow makes its engine
    from airflow.__main__ import main as airflow_main

    sys.argv[0] = "airflow"
    airflow_main()


if __name__ == "__main__":
    main()
