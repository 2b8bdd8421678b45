"""``onceflow sales ...``: demo data for the daily_sales flow.

The lead's ``onceflow`` console script calls :func:`add_parser` with its sub-parsers::

    onceflow sales generate --url sqlite:///shop.db --start 2024-03-30 --end 2024-04-02 --seed 7
    onceflow sales generate --url postgresql+psycopg2://u@127.0.0.1/shop --start 2024-10-26 \\
        --end 2024-10-28 --ingested-before 2024-10-27T23:00:00Z

``--ingested-before`` leaves out events the shop had not yet received at that instant (the
late-arriving rows), to reproduce the database as the nightly run saw it.
"""

from __future__ import annotations

import argparse
import datetime as dt

from onceflow.sales.generator import DEFAULT_TIMEZONE, GeneratorConfig, generate_orders, write_orders


def _instant(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a UTC offset, e.g. 2024-10-27T23:00:00Z")
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``sales`` (with ``generate``) on the ``onceflow`` command's sub-parsers."""
    sales = subparsers.add_parser("sales", help="daily_sales demo data")
    sales_sub = sales.add_subparsers(dest="sales_command", required=True)
    gen = sales_sub.add_parser("generate", help="write deterministic shop orders into a database")
    gen.add_argument("--url", required=True, help="SQLAlchemy URL of the shop database")
    gen.add_argument(
        "--start", required=True, type=dt.date.fromisoformat, help="first local day (YYYY-MM-DD)"
    )
    gen.add_argument(
        "--end", required=True, type=dt.date.fromisoformat, help="day after the last (exclusive)"
    )
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--timezone", default=DEFAULT_TIMEZONE, help="business timezone (IANA name)")
    gen.add_argument("--orders-per-day", type=int, default=200)
    gen.add_argument("--malformed-per-day", type=int, default=2)
    gen.add_argument("--ingested-before", type=_instant, default=None, help="drop events ingested later")
    gen.set_defaults(func=run_generate)
    return sales


def run_generate(args: argparse.Namespace) -> int:
    """Generate and write the orders described by ``args``; prints a one-line summary."""
    from onceflow.sales.engine import make_engine

    config = GeneratorConfig(
        seed=args.seed,
        timezone=args.timezone,
        orders_per_day=args.orders_per_day,
        malformed_per_day=args.malformed_per_day,
    )
    rows = generate_orders(args.start, args.end, config)
    if args.ingested_before is not None:
        rows = [r for r in rows if r.ingested_at_utc < args.ingested_before]
    engine = make_engine(args.url)
    try:
        written = write_orders(engine, rows)
    finally:
        engine.dispose()
    print(f"wrote {written} order events for {args.start}..{args.end} (exclusive) to {engine.url!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m onceflow.sales.cli sales generate ...``)."""
    parser = argparse.ArgumentParser(prog="onceflow")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
