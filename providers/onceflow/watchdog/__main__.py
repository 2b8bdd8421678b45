"""``onceflow-watchdog [run|status] --config FILE [--once]`` (also ``python -m onceflow.watchdog``).

``run`` (the default) loops until SIGTERM/SIGINT; with ``--once`` it makes one pass and exits
for cron: 0 every check up, 1 something late or down, 2 configuration error (also a bad
command line), 3 blind (a check could not be evaluated, or the pass overran its budget).
``status`` prints the status JSON (each check's state, since when, last beat, open incidents,
recent flips) and exits with the same codes as ``--once`` would for the stored states.
Nothing printed holds a secret: errors are redacted (:mod:`onceflow.redact`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

from onceflow.redact import RedactingFilter, register_secret
from onceflow.watchdog.config import ConfigError, WatchdogConfig, load_config
from onceflow.watchdog.runner import EXIT_BLIND, EXIT_CONFIG, PassMonitor, StateFileError, Watchdog

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow-watchdog", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="run", choices=("run", "status"))
    parser.add_argument("--config", required=True, help="the watchdog's TOML file")
    parser.add_argument("--once", action="store_true", help="one pass, exit code for cron")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``onceflow-watchdog``; returns the exit code (see the module's docstring)."""
    args = _parser().parse_args(argv)  # a bad command line exits 2 with argparse's usage line
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())  # the net under redaction at the source
    logging.basicConfig(level=args.log_level, handlers=[handler], force=True)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"onceflow-watchdog: configuration error in {args.config}:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    _register_secrets(config)
    try:
        watchdog = Watchdog(config)
    except (OSError, StateFileError) as exc:  # the state directory cannot be made or written
        print(f"onceflow-watchdog: configuration error: state_dir: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "status":
        from onceflow.watchdog.status import collect, exit_code

        report = collect(watchdog)
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
        return exit_code(report)
    if args.once:
        return _once(watchdog)
    return _loop(watchdog, argv)


def _register_secrets(config: WatchdogConfig) -> None:
    for url in (config.alerts.webhook_url, config.alerts.smtp_url, config.self_heartbeat_url):
        register_secret(url)
    for url in (config.ledger_url, config.warehouse_url):
        if url and "@" in url:
            register_secret(url)


def _once(watchdog: Watchdog) -> int:
    def stuck(seconds: float) -> None:
        print(f"BLIND pass: stuck for {seconds:.0f} s", flush=True)
        os._exit(EXIT_BLIND)

    monitor = PassMonitor(watchdog, on_stuck=stuck)
    monitor.start()
    result = watchdog.run_once()
    monitor.stop()
    for name, state in sorted(result.states.items()):
        print(f"{name}: {state}")
    for source, reason in sorted(result.blind.items()):
        print(f"BLIND {source}: {reason}")
    return result.exit_code


def _loop(watchdog: Watchdog, argv: list[str] | None) -> int:
    stopping = False

    def _stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        logging.getLogger(__name__).info("signal %d: stopping after this pass", signum)
        stopping = True

    def _restart(seconds: float) -> None:
        # A call no deadline bounded has held the pass for three budgets: start afresh (new
        # connections, new pool). The blindness alert already went out from the monitor.
        logging.getLogger(__name__).critical("pass stuck for %.0f s: re-executing the watchdog", seconds)
        logging.shutdown()
        args = sys.argv[1:] if argv is None else argv
        os.execv(sys.executable, [sys.executable, "-m", "onceflow.watchdog", *args])

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    if watchdog.config.status_port:
        from onceflow.watchdog.status import serve

        server = serve(watchdog, watchdog.config.status_port)
    try:
        watchdog.run_forever(stop=lambda: stopping, on_stuck=_restart)
    finally:
        if server is not None:
            server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
