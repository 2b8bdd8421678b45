"""Command line: ``python -m onceflow.testing.article_site --port 8765 [--published-dir DIR] [--dashboard-dir DIR]``."""

from __future__ import annotations

import argparse

from onceflow.testing.article_site.server import ArticleSite
from onceflow.testing.serving import serve_until_signalled

DEFAULT_PORT = 8765


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m onceflow.testing.article_site",
        description="The onceflow demo article site on 127.0.0.1 (for tests and make run).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"TCP port, 0 for any free port (default {DEFAULT_PORT})",
    )
    parser.add_argument("--published-dir", default=None, help="directory served under /published/")
    parser.add_argument("--dashboard-dir", default=None, help="directory served under /dashboard/")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM; the first line on stdout is the base URL.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: process exit code.
    """
    args = build_parser().parse_args(argv)
    site = ArticleSite(
        args.host,
        args.port,
        published_dir=args.published_dir,
        dashboard_dir=args.dashboard_dir,
        verbose=args.verbose,
    )
    print(f"article site: {site.base_url}/", flush=True)
    serve_until_signalled(site.serve_forever, site.stop)
    return 0
