"""Create docker-compose.yaml's secrets once, in the volume every Airflow service reads them from.

Run by the ``airflow-init`` service (as root, before any Airflow command) with the mounted
secrets folder: ``python /opt/onceflow/init_secrets.py /opt/onceflow/secrets --owner 50000:0``.

* ``jwt_secret``: ``[api_auth] jwt_secret``, which signs the UI's and the workers' tokens;
* ``api_secret_key``: ``[api] secret_key``, which also signs the api-server's requests for task
  logs to the Celery workers' log servers (different keys per container: 403 on every log);
* ``fernet_key``: ``[core] fernet_key``, which encrypts connection passwords in the metadata DB;
* ``simple_auth_manager_passwords.json``: the password of each SimpleAuthManager user (``admin``);
  ``$ONCEFLOW_ADMIN_PASSWORD`` sets the admin's, else a random one is generated.

A file that exists is never rewritten (a second ``docker compose up`` keeps every secret), so
the secrets differ per installation and none ships in the repository. The services read them
through Airflow's ``AIRFLOW__<SECTION>__<KEY>_CMD`` variables (``cat <file>``). Standard
library only: it runs in the image before anything else is set up.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import sys
from pathlib import Path

PASSWORDS_FILE = "simple_auth_manager_passwords.json"
ADMIN_USER = "admin"
ADMIN_PASSWORD_ENV = "ONCEFLOW_ADMIN_PASSWORD"


def _fernet_key() -> str:
    # What cryptography.fernet.Fernet.generate_key() returns: 32 random bytes, urlsafe base64.
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def _passwords() -> str:
    password = os.environ.get(ADMIN_PASSWORD_ENV) or secrets.token_urlsafe(18)
    return json.dumps({ADMIN_USER: password}) + "\n"


GENERATORS = {
    "jwt_secret": lambda: secrets.token_urlsafe(48),
    "api_secret_key": lambda: secrets.token_urlsafe(48),
    "fernet_key": _fernet_key,
    PASSWORDS_FILE: _passwords,
}


def create_missing(folder: Path, owner: tuple[int, int] | None = None) -> list[str]:
    """Write each secret that ``folder`` lacks (mode 0600); return the names written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, generate in GENERATORS.items():
        path = folder / name
        if path.exists() and path.stat().st_size > 0:
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(generate())
        written.append(name)
    for path in [folder, *(folder / name for name in GENERATORS)]:
        if owner is not None:
            os.chown(path, *owner)
        path.chmod(0o700 if path == folder else 0o600)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--owner", help="uid:gid the Airflow services run as (AIRFLOW_UID:0)")
    args = parser.parse_args(argv)
    owner = None
    if args.owner:
        uid, _, gid = args.owner.partition(":")
        owner = (int(uid), int(gid or 0))
    written = create_missing(args.folder, owner)
    kept = sorted(set(GENERATORS) - set(written))
    print(f"secrets in {args.folder}: created {sorted(written) or 'none'}, kept {kept or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
