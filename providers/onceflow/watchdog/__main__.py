"""``onceflow-watchdog --config FILE [--once]`` (also ``python -m onceflow.watchdog``).

Exit codes of ``--once`` (for cron): 0 every check up, 1 something late or down, 2 configuration
error, 3 blind (a check could not be evaluated). The loop runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from onceflow.watchdog.config import ConfigError, load_config
from onceflow.watchdog.runner import EXIT_CONFIG, Watchdog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onceflow-watchdog", description=__doc__)
    parser.add_argument("--config", required=True, help="the watchdog's TOML file")
    parser.add_argument("--once", action="store_true", help="one pass, exit code for cron")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"onceflow-watchdog: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        watchdog = Watchdog(config)
    except OSError as exc:  # the state directory cannot be made or written
        print(f"onceflow-watchdog: configuration error: state_dir: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.once:
        result = watchdog.run_once()
        for name, state in sorted(result.states.items()):
            print(f"{name}: {state}")
        for source, reason in sorted(result.blind.items()):
            print(f"BLIND {source}: {reason}")
        return result.exit_code
    stopping = False

    def _stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        logging.getLogger(__name__).info("signal %d: stopping after this pass", signum)
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    watchdog.run_forever(stop=lambda: stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main())
