"""Command line: ``python -m onceflow.testing.sheets_emulator --port PORT --state FILE``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from onceflow.testing.serving import serve_until_signalled
from onceflow.testing.sheets_emulator.limits import METADATA_LIMIT
from onceflow.testing.sheets_emulator.quota import Quota
from onceflow.testing.sheets_emulator.server import SheetsEmulatorServer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m onceflow.testing.sheets_emulator",
        description="Google Sheets API v4 emulator on 127.0.0.1 (for tests and local runs).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8090, help="TCP port, 0 for any free port (default 8090)")
    parser.add_argument(
        "--state", default=None, help="JSON state file; loaded at start, rewritten after every write"
    )
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="FILE",
        help='JSON file {"spreadsheetId", "title", "sheets": {"Queue": [[...], ...]}} to create at start '
        "(skipped when the state already has that spreadsheetId)",
    )
    parser.add_argument(
        "--quota",
        nargs=2,
        type=int,
        metavar=("READS", "WRITES"),
        default=None,
        help="enforce Google-like per-minute quotas, e.g. --quota 60 60 (default: no quota)",
    )
    parser.add_argument(
        "--metadata-limit",
        type=int,
        default=METADATA_LIMIT,
        metavar="CHARS",
        help="developer metadata cap per spreadsheet and per sheet, in characters (default Google's "
        f"{METADATA_LIMIT}; 0 or less turns it off)",
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the emulator until SIGINT or SIGTERM; print the endpoint once listening.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: process exit code.
    """
    args = build_parser().parse_args(argv)
    limit = args.metadata_limit if args.metadata_limit > 0 else None
    server = SheetsEmulatorServer(
        args.host, args.port, args.state, verbose=args.verbose, metadata_limit=limit
    )
    if args.quota:
        server.quota = Quota(reads_per_minute=args.quota[0], writes_per_minute=args.quota[1])
    for path in args.seed:
        with open(path, encoding="utf-8") as f:
            spec: dict[str, Any] = json.load(f)
        if spec.get("spreadsheetId") not in server.store.spreadsheets:
            book = server.seed(spec)
            # stderr: the first line on stdout is always the endpoint, for callers using --port 0.
            print(f"seeded spreadsheet {book['spreadsheetId']} from {path}", file=sys.stderr, flush=True)
    print(f"Sheets API emulator listening on {server.endpoint}", flush=True)
    serve_until_signalled(server.serve_forever, server.stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
