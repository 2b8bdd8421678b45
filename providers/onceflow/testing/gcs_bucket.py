"""``python -m onceflow.testing.gcs_bucket --endpoint URL --bucket NAME``: make a bucket on a GCS emulator.

fake-gcs-server starts without buckets, and ``onceflow_storage`` writes into an existing one (as
on Google, where buckets are made by whoever owns the project). The compose file's ``offline``
profile runs this once against its fake GCS server; running it again changes nothing.
"""

from __future__ import annotations

import argparse
import sys


def ensure_bucket(endpoint: str, bucket: str, project: str = "onceflow") -> bool:
    """Create ``bucket`` on the emulator at ``endpoint`` unless it exists; ``True`` if created.

    Anonymous, as emulators want; the real google-cloud-storage client speaks to it.
    """
    from google.api_core.exceptions import Conflict
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project=project, credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    if client.lookup_bucket(bucket) is not None:
        return False
    try:
        client.create_bucket(bucket)
    except Conflict:  # made meanwhile by another run
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m onceflow.testing.gcs_bucket", description=__doc__)
    parser.add_argument("--endpoint", required=True, help="the emulator, e.g. http://127.0.0.1:4443")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--project", default="onceflow")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        created = ensure_bucket(args.endpoint, args.bucket, args.project)
    except Exception as exc:  # unreachable emulator, bad name: say which, exit non-zero (compose retries)
        print(f"gcs_bucket: cannot make bucket {args.bucket!r} at {args.endpoint}: {exc}", file=sys.stderr)
        return 1
    print(f"bucket {args.bucket!r} {'created' if created else 'already exists'} at {args.endpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
