"""The ``onceflow`` console script: run the local stack, emulators, demo data and admin commands.

Subcommands import what they need when they run, so ``onceflow --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_up(args: argparse.Namespace) -> int:
    from onceflow.local_run import LocalRunConfig, run

    return run(
        LocalRunConfig.from_args(
            home=args.home,
            dags_folder=args.dags_folder,
            plugins_folder=args.plugins_folder,
            port=args.port,
            demo_days=args.demo_days,
            exit_when_ready=args.exit_when_ready,
            executor=args.executor,
            database_url=args.database_url,
        )
    )


def _cmd_sheets_emulator(args: argparse.Namespace) -> int:
    from onceflow.testing.sheets_emulator import main

    return main(list(args.emulator_args))


def _cmd_pools(args: argparse.Namespace) -> int:
    from onceflow.pools import pools_import_json

    print(pools_import_json())
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    from onceflow import __version__

    print(__version__)
    return 0


def _ledger_url(conn_id: str) -> str:
    from onceflow.hooks.ledger import LedgerHook

    return LedgerHook(conn_id).get_url()


def build_parser() -> argparse.ArgumentParser:
    """The ``onceflow`` argument parser with every subcommand (the reference's command-line page shows its help)."""
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start Airflow on embedded defaults with this repo's DAGs (`make run`)")
    up.add_argument("--home", default=".onceflow", help="folder for AIRFLOW_HOME, data and logs")
    up.add_argument("--dags-folder", default="dags")
    up.add_argument("--plugins-folder", default="plugins")
    up.add_argument("--port", type=int, default=8080, help="api-server/UI port (a free one if taken)")
    up.add_argument("--demo-days", type=int, default=14, help="days of demo orders to generate")
    up.add_argument("--exit-when-ready", action="store_true", help="stop once everything is up (smoke test)")
    up.add_argument(
        "--executor",
        choices=("local", "celery"),
        default="local",
        help="local: airflow standalone; celery: 2 schedulers + 2 Celery workers on Redis 127.0.0.1:6379",
    )
    up.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL metadata DB for --executor celery (default $ONCEFLOW_UP_DATABASE_URL)",
    )
    up.set_defaults(func=_cmd_up)

    emu = sub.add_parser("sheets-emulator", help="the Google Sheets API v4 emulator", add_help=False)
    emu.add_argument("emulator_args", nargs=argparse.REMAINDER)
    emu.set_defaults(func=_cmd_sheets_emulator)

    pools = sub.add_parser("pools", help="print onceflow's pools as `airflow pools import` JSON")
    pools.set_defaults(func=_cmd_pools)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)

    from onceflow.ledger.cli import add_parser as add_ledger
    from onceflow.sales.cli import add_parser as add_sales

    add_ledger(sub, _ledger_url)
    add_sales(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``onceflow`` console script; returns the exit code."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    if argv[:1] == ["sheets-emulator"]:
        # Every option after the name is the emulator's: argparse's REMAINDER would refuse one
        # that starts with "-" (`onceflow sheets-emulator --port 8090` failed), so hand them over.
        return _cmd_sheets_emulator(argparse.Namespace(emulator_args=argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
