"""The published schemas the deployment tests validate against, taken from packages on PyPI.

Nothing of them is committed here. ``make install`` runs ``python tests/unit/published_schemas.py
prepare``, which, with the network, has uv install two pinned wheels (version and sha256 below)
into a scratch folder and keeps only the files the tests read, with their licences, in
``$ONCEFLOW_SCHEMA_CACHE`` (default ``~/.cache/onceflow/schemas``)``/<hash of the pins>/``:

* the Compose Specification's JSON schema, which ``check-jsonschema`` ships unmodified (its
  ``vendor/sha256/compose-spec.sha256`` is the file's hash) with the specification's Apache 2.0
  licence (``tests/unit/test_compose.py``);
* Kubernetes' JSON schemas of a ``Deployment`` (strict: unknown fields refused) for the oldest and
  the newest minor that ``kubernetes-validate`` ships, with its Apache 2.0 licence
  (``tests/unit/test_helm_values.py``, the watchdog's Deployment).

The tests only read that folder (the network guard is on in them); without it they fail, naming
``make install``: never a skip. The official Airflow Helm chart (its ``values.schema.json``) is on
no registry reachable here: docs/deploy.md says what is therefore not checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: distribution -> (version, sha256 of its py3-none-any wheel on PyPI)
WHEELS: dict[str, tuple[str, str]] = {
    "check-jsonschema": ("0.39.0", "14ce5c94871c551268ea948ffe21e9f1464dc48fb20bf9a4c13deeaaf756cf9b"),
    "kubernetes-validate": ("1.37.0", "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9"),
}
#: Kubernetes minors the watchdog's Deployment is checked on: the oldest and newest shipped.
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")
_K8S = "kubernetes_validate/kubernetes-json-schema/v{version}-local-strict/{name}"
#: file kept (relative to the cache folder) -> where it is in the installed wheels
FILES: dict[str, str] = {
    "compose-spec.json": "check_jsonschema/builtin_schemas/vendor/compose-spec.json",
    "compose-spec.sha256": "check_jsonschema/builtin_schemas/vendor/sha256/compose-spec.sha256",
    "LICENSE.compose-spec": "check_jsonschema/builtin_schemas/vendor/licenses/LICENSE.compose-spec",
    "LICENSE.kubernetes-validate": "kubernetes_validate-1.37.0.dist-info/licenses/LICENSE",
    **{
        f"kubernetes/{version}/{name}": _K8S.format(version=version, name=name)
        for version in KUBERNETES_VERSIONS
        for name in ("_definitions.json", "deployment-apps-v1.json")
    },
}
MAKE_INSTALL_HINT = (
    "run `make install`: it fetches the published schemas the deployment tests read "
    "(python tests/unit/published_schemas.py prepare)"
)


def folder() -> Path:
    """Where ``prepare`` keeps the files: one folder per set of pins (wheels and files)."""
    base = Path(os.environ.get("ONCEFLOW_SCHEMA_CACHE") or Path.home() / ".cache" / "onceflow" / "schemas")
    pins = json.dumps([WHEELS, FILES], sort_keys=True).encode()
    return base / hashlib.sha256(pins).hexdigest()[:16]


def path(name: str) -> Path:
    """One prepared file; ``AssertionError`` naming ``make install`` when it is not there."""
    found = folder() / name
    assert (folder() / "SOURCES.json").is_file() and found.is_file(), (
        f"{found} is missing: {MAKE_INSTALL_HINT}"
    )
    return found


def load(name: str) -> Any:
    return json.loads(path(name).read_text())


def prepare() -> Path:
    """Fetch the wheels (online, through uv and its cache) and keep the files; a no-op once done."""
    target = folder()
    if (target / "SOURCES.json").is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="onceflow-schemas-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(
            "".join(f"{name}=={version} --hash=sha256:{sha}\n" for name, (version, sha) in WHEELS.items())
        )
        installed = Path(tmp) / "site"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_OFFLINE", "VIRTUAL_ENV"))}
        done = subprocess.run(
            [sys.executable, "-m", "uv", "pip", "install", "--no-deps", "--require-hashes",
             "--only-binary", ":all:", "--python", sys.executable, "--target", str(installed),
             "-r", str(requirements)],
            capture_output=True, text=True, timeout=1800, env=env,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"uv could not fetch the schema wheels:\n{done.stdout}\n{done.stderr}")
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_ensure(target.parent)))
        staging.chmod(0o755)
        for kept, source in FILES.items():
            (staging / kept).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(installed / source, staging / kept)
        sources = {
            "wheels": {name: {"version": v, "sha256": sha} for name, (v, sha) in WHEELS.items()},
            "files": FILES,
        }
        (staging / "SOURCES.json").write_text(json.dumps(sources, indent=2) + "\n")
        if target.exists():  # a half-made folder of an interrupted run
            shutil.rmtree(target)
        staging.rename(target)
    return target


def _ensure(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


if __name__ == "__main__":
    if sys.argv[1:] != ["prepare"]:
        raise SystemExit("usage: python tests/unit/published_schemas.py prepare")
    print(f"published schemas in {prepare()}")
