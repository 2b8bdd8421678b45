"""``onceflow ledger ...``: schema administration of the work ledger.

::

    onceflow ledger upgrade                       # the ledger of Airflow connection onceflow_ledger
    onceflow ledger upgrade --url postgresql+psycopg2://u@db/ledger
    onceflow ledger current --url sqlite:////var/lib/onceflow/ledger.db

``upgrade`` is what every ``Ledger(...)`` does on start-up, run on purpose: before a rolling
deployment, so the first new worker does not pay for it, or with a database user that may
change the schema while the workers' user may not. Safe to run while workers run.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def add_parser(
    subparsers: argparse._SubParsersAction, url_from_connection: Callable[[str], str]
) -> argparse.ArgumentParser:
    """Register ``ledger`` (``upgrade``, ``current``) on the ``onceflow`` command's sub-parsers.

    :param url_from_connection: turns an Airflow connection id into the ledger's URL (the
        caller owns Airflow; this package does not import it).
    """
    ledger = subparsers.add_parser("ledger", help="work ledger schema: upgrade, current revision")
    sub = ledger.add_subparsers(dest="ledger_command", required=True)
    for name, func, text in (
        ("upgrade", _run_upgrade, "create or upgrade the ledger's tables to this code's revision"),
        ("current", _run_current, "print the ledger's revision and this code's newest"),
    ):
        cmd = sub.add_parser(name, help=text)
        where = cmd.add_mutually_exclusive_group()
        where.add_argument("--url", help="SQLAlchemy URL of the ledger database")
        where.add_argument(
            "--conn-id", default="onceflow_ledger", help="Airflow connection of the ledger (default)"
        )
        if name == "upgrade":
            cmd.add_argument("--to", default="head", help="target revision (default: head)")
        cmd.set_defaults(func=func, url_from_connection=url_from_connection)
    return ledger


def _url(args: argparse.Namespace) -> str:
    return str(args.url or args.url_from_connection(args.conn_id))


def _run_upgrade(args: argparse.Namespace) -> int:
    from alembic.util import CommandError

    from onceflow.ledger.db import create_ledger_engine
    from onceflow.ledger.errors import LedgerSchemaError
    from onceflow.ledger.migrations import migrate

    engine = create_ledger_engine(_url(args))
    try:
        done = migrate(engine, target=args.to)
    except (LedgerSchemaError, CommandError) as exc:  # CommandError: a --to Alembic cannot reach
        print(f"onceflow ledger upgrade: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    if done.created:
        print(f"created the ledger's tables at revision {done.after}")
    elif done.changed:
        print(f"upgraded the ledger from {done.before} to {done.after}")
    else:
        print(f"the ledger is at revision {done.after}; nothing to do")
    return 0


def _run_current(args: argparse.Namespace) -> int:
    from onceflow.ledger.db import create_ledger_engine
    from onceflow.ledger.migrations import current_revision, head

    engine = create_ledger_engine(_url(args))
    try:
        print(f"ledger: {current_revision(engine) or 'empty'}\ncode:   {head()}")
    finally:
        engine.dispose()
    return 0
