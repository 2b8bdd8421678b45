"""docker-compose.yaml is safe by default and its logs and login work, checked without Docker.

No Docker engine runs here, so each container is stood in for by a folder: its filesystem root,
where every volume the file mounts is a symlink to one shared folder per source (a bind mount's
path, a named volume's name), and everything else is private to that container. A service's
environment is the file's, interpolated as compose does with an empty shell environment, its
container paths moved under its root. Real Airflow 3.3 then runs in that environment, in a
subprocess per container:

* the api-server's signed request for a task log is accepted by a Celery worker's log server
  (the 403 of a per-container ``[api] secret_key``);
* no secret comes from the file: each one is the file that ``airflow-init`` generated, different
  per installation, and the same in every Airflow container;
* the login the docs describe works: the admin's password read from the file the docs name, POSTed
  to SimpleAuthManager's ``/auth/token``, gives a token the api-server accepts; a wrong one is 401;
* published ports listen on 127.0.0.1 unless ``ONCEFLOW_BIND_ADDRESS`` says otherwise, every
  long-running service has a healthcheck (the emulators' ones run against the real servers), and
  with ``--profile offline`` every Airflow service waits for the bucket.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
AIRFLOW_SERVICES = [n for n, s in SERVICES.items() if "build" in s and n.startswith("airflow-")]
INIT_SECRETS = REPO / "deploy" / "compose" / "init_secrets.py"
DEPLOY_DOC = (REPO / "docs" / "deploy.md").read_text()
IMAGE_AIRFLOW_HOME = "/opt/airflow"  # the official image's AIRFLOW_HOME
SECRET_OPTIONS = [("api_auth", "jwt_secret"), ("api", "secret_key"), ("core", "fernet_key")]

_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, shell: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``${VAR:?error}``."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        current = shell.get(name)
        if op == ":?" and not current:
            raise ValueError(f"compose refuses to start: {name}: {arg}")
        if op == ":-" and not current:
            return arg
        if op == "-" and current is None:
            return arg
        return current or ""

    return _VAR.sub(one, value.replace("$$", "\0")).replace("\0", "$")


class Container:
    """One service of the file, emulated by a folder (see the module docstring)."""

    def __init__(self, name: str, world: Path, shell: dict[str, str] | None = None) -> None:
        self.name = name
        self.service = SERVICES[name]
        self.root = world / "containers" / name
        self.shell = shell or {}
        for volume in self.service.get("volumes", []):
            source, target, *_ = volume.split(":")
            shared = world / ("binds" if source.startswith(".") else "volumes") / source.lstrip("./")
            if source.startswith(".") and (REPO / source).is_file():
                shared = REPO / source  # a file of the repository, mounted as is
            else:
                shared.mkdir(parents=True, exist_ok=True)
            link = self.path(target)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(shared)
        self.path(IMAGE_AIRFLOW_HOME).mkdir(parents=True, exist_ok=True)

    def path(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def environment(self) -> dict[str, str]:
        """The service's variables with its container paths under its root, on top of a clean
        process environment (none of this test session's Airflow settings)."""
        from onceflow.testing import network_guard

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW", "_AIRFLOW", "ONCEFLOW")) and k != "PYTHONPATH"
        }
        if network_guard.ENV_LOG in os.environ:  # the children keep the session's network guard
            env.update(network_guard.child_environment(os.environ[network_guard.ENV_LOG], base={}))
        env["AIRFLOW_HOME"] = str(self.path(IMAGE_AIRFLOW_HOME))
        for key, value in (self.service.get("environment") or {}).items():
            text = interpolate(str(value), self.shell)
            env[key] = re.sub(r"(?<![\w.])(/opt/[\w./-]+)", lambda m: str(self.path(m.group(1))), text)
        return env

    def python(self, code: str, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{self.name}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done.stdout

    def popen(self, code: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=self.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def run_init_secrets(world: Path, shell: dict[str, str] | None = None) -> Container:
    """What airflow-init does first: its init_secrets.py line, in its container."""
    init = Container("airflow-init", world, shell)
    script = str(init.service["command"][1])
    line = next(line for line in script.splitlines() if "init_secrets.py" in line)
    argv = shlex.split(interpolate(line, init.shell))
    assert argv[:2] == ["python", "/opt/onceflow/init_secrets.py"]
    assert argv[3:] == ["--owner", "50000:0"]
    # the script the service mounts, run on the folder it mounts (not as root here: no --owner)
    mounted = init.path(argv[1]).resolve()
    assert mounted == INIT_SECRETS
    subprocess.run(
        [sys.executable, str(mounted), str(init.path(argv[2]))],
        env=init.environment(),
        check=True,
        capture_output=True,
    )
    return init


READ_SECRETS = """
import json, sys
from airflow.configuration import conf
print("SECRETS " + json.dumps({f"{s}.{k}": conf.get(s, k) for s, k in json.loads(sys.argv[1])}))
"""


def _secrets(container: Container) -> dict[str, str]:
    out = container.python(READ_SECRETS, json.dumps(SECRET_OPTIONS))
    return dict(json.loads(next(line for line in out.splitlines() if line.startswith("SECRETS "))[8:]))


# -- no default secret, the same secrets everywhere ---------------------------------------------------


def test_no_secret_is_written_in_the_file_and_each_is_generated_per_installation(tmp_path: Path) -> None:
    text = (REPO / "docker-compose.yaml").read_text()
    assert "change-me" not in text
    for name in AIRFLOW_SERVICES:
        env = SERVICES[name]["environment"]
        for section, key in SECRET_OPTIONS:
            variable = f"AIRFLOW__{section.upper()}__{key.upper()}"
            assert variable not in env, f"{name} sets {variable} in the file"
    installs = []
    for install in ("one", "two"):
        world = tmp_path / install
        init = run_init_secrets(world)
        folder = init.path("/opt/onceflow/secrets")
        # all secrets and the passwords file are private to the user the services run as
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {
            "jwt_secret": "0o600",
            "api_secret_key": "0o600",
            "fernet_key": "0o600",
            "simple_auth_manager_passwords.json": "0o600",
        }
        installs.append(_secrets(Container("airflow-scheduler-1", world)))
    for option, value in installs[0].items():
        assert len(value) >= 32, option
        assert value != installs[1][option], f"{option} is the same in two installations"
        assert value not in text and value not in DEPLOY_DOC


def test_a_second_init_keeps_every_secret(tmp_path: Path) -> None:
    init = run_init_secrets(tmp_path)
    folder = init.path("/opt/onceflow/secrets")
    before = {p.name: p.read_text() for p in folder.iterdir()}
    run_init_secrets(tmp_path, {"ONCEFLOW_ADMIN_PASSWORD": "not-used-the-second-time"})
    assert {p.name: p.read_text() for p in folder.iterdir()} == before


def test_every_airflow_service_reads_the_same_secrets(tmp_path: Path) -> None:
    init = run_init_secrets(tmp_path)
    files = init.path("/opt/onceflow/secrets")
    expected = {
        "api_auth.jwt_secret": (files / "jwt_secret").read_text(),
        "api.secret_key": (files / "api_secret_key").read_text(),
        "core.fernet_key": (files / "fernet_key").read_text(),
    }
    # the api-server, one scheduler and one worker: the three that sign or check these
    for name in ("airflow-apiserver", "airflow-scheduler-1", "airflow-worker-1"):
        assert _secrets(Container(name, tmp_path)) == expected, name


# -- task logs: the api-server's signed request is accepted by a worker's log server -------------------

LOG_SERVER = """
import sys, uvicorn
from airflow.utils.serve_logs.log_server import create_app
uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

FETCH_LOG = """
import sys
from airflow.utils.log.file_task_handler import _fetch_logs_from_service
response = _fetch_logs_from_service(sys.argv[1], sys.argv[2])
print("STATUS", response.status_code, response.text.strip())
"""


def _wait_for_port(port: int, process: subprocess.Popen[str], timeout: float = 60) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port} after {timeout} s")


def test_the_apiserver_reads_a_running_tasks_log_from_a_worker(tmp_path: Path) -> None:
    from onceflow.testing.ports import free_port

    run_init_secrets(tmp_path)
    worker, apiserver = Container("airflow-worker-1", tmp_path), Container("airflow-apiserver", tmp_path)
    relative = "dag_id=daily_sales/run_id=manual__1/task_id=load/attempt=1.log"
    log_file = worker.path(f"{IMAGE_AIRFLOW_HOME}/logs/{relative}")
    log_file.parent.mkdir(parents=True)
    log_file.write_text("loaded 80 rows\n")
    port = free_port()
    server = worker.popen(LOG_SERVER, str(port))
    try:
        _wait_for_port(port, server)
        out = apiserver.python(FETCH_LOG, f"http://127.0.0.1:{port}/log/{relative}", relative)
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert "STATUS 200 loaded 80 rows" in out, out
    # and the api-server sees finished tasks' logs in its own folder: the shared one
    assert apiserver.path(f"{IMAGE_AIRFLOW_HOME}/logs/{relative}").read_text() == "loaded 80 rows\n"


# -- the login the docs describe -----------------------------------------------------------------------

LOGIN = """
import asyncio, json, sys
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_auth_manager
manager = create_auth_manager()
manager.init()
client = TestClient(manager.get_fastapi_app())
good = client.post("/token", json={"username": sys.argv[1], "password": sys.argv[2]})
bad = client.post("/token", json={"username": sys.argv[1], "password": sys.argv[2] + "x"})
user = None
if good.status_code == 201:  # checked as the api-server checks it (less the revocation list: a DB)
    claims = asyncio.run(manager._get_token_validator().avalidated_claims(good.json()["access_token"]))
    user = manager.deserialize_user(claims)
print("LOGIN " + json.dumps({"good": good.status_code, "bad": bad.status_code,
                            "user": getattr(user, "username", None), "role": getattr(user, "role", None)}))
"""


def _documented_password_command() -> list[str]:
    """The ``docker compose exec ... cat <file>`` line of docs/deploy.md's first-login section."""
    section = DEPLOY_DOC.split("### First login", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith("docker compose exec"))
    return shlex.split(line)


@pytest.mark.parametrize("chosen", [None, "an editor's own password"])
def test_the_documented_first_login_works(tmp_path: Path, chosen: str | None) -> None:
    run_init_secrets(tmp_path, {"ONCEFLOW_ADMIN_PASSWORD": chosen} if chosen else None)
    command = _documented_password_command()
    assert command[:3] == ["docker", "compose", "exec"] and command[4] == "cat"
    apiserver = Container(command[3], tmp_path)
    passwords = json.loads(apiserver.path(command[5]).read_text())
    assert "admin" in DEPLOY_DOC.split("### First login", 1)[1][:2000]
    if chosen:
        assert passwords == {"admin": chosen}
    out = apiserver.python(LOGIN, "admin", passwords["admin"])
    result = json.loads(next(line for line in out.splitlines() if line.startswith("LOGIN "))[6:])
    assert result == {"good": 201, "bad": 401, "user": "admin", "role": "admin"}


# -- ports, healthchecks, the bucket -----------------------------------------------------------------


def _published(shell: dict[str, str]) -> dict[str, list[str]]:
    return {
        name: [interpolate(str(p), shell) for p in service.get("ports", [])]
        for name, service in SERVICES.items()
        if service.get("ports")
    }


def test_published_ports_listen_on_loopback_unless_told_otherwise() -> None:
    published = _published({})
    assert set(published) == {"airflow-apiserver", "sheets-emulator", "fake-gcs", "article-site"}
    for name, ports in published.items():
        for port in ports:
            assert port.count(":") == 2 and port.startswith("127.0.0.1:"), f"{name}: {port}"
    opened = _published({"ONCEFLOW_BIND_ADDRESS": "0.0.0.0"})
    assert all(p.startswith("0.0.0.0:") for ports in opened.values() for p in ports)
    assert "ONCEFLOW_BIND_ADDRESS" in DEPLOY_DOC


ONE_SHOT = {"airflow-init", "fake-gcs-init"}


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        if name in ONE_SHOT:
            assert service["restart"] in ("no", "on-failure"), name
            continue
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
        if check["test"][1:3] == ["python", "-c"]:
            compile(check["test"][3], f"{name} healthcheck", "exec")


def _run_healthcheck(name: str, port: int) -> subprocess.CompletedProcess[str]:
    test = SERVICES[name]["healthcheck"]["test"]
    own = int(SERVICES[name]["ports"][0].rsplit(":", 1)[1])
    argv = [a.replace(f"127.0.0.1:{own}/", f"127.0.0.1:{port}/") for a in test[1:]]
    argv[0] = sys.executable if argv[0] == "python" else argv[0]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_the_emulators_healthchecks_pass_against_the_real_servers(
    onceflow_sheets_emulator: Any, onceflow_article_site: Any
) -> None:
    from onceflow.testing.ports import free_port

    assert _run_healthcheck("sheets-emulator", onceflow_sheets_emulator.port).returncode == 0
    assert _run_healthcheck("article-site", onceflow_article_site.port).returncode == 0
    # and they fail when nothing answers
    assert _run_healthcheck("sheets-emulator", free_port()).returncode != 0


def test_with_the_offline_profile_airflow_waits_for_the_bucket() -> None:
    for name in [*AIRFLOW_SERVICES, "onceflow-watchdog"]:
        bucket = SERVICES[name]["depends_on"].get("fake-gcs-init")
        assert bucket == {"condition": "service_completed_successfully", "required": False}, name
    assert SERVICES["fake-gcs-init"]["depends_on"] == {"fake-gcs": {"condition": "service_healthy"}}


def test_logs_and_config_are_shared_by_every_airflow_service() -> None:
    for name in AIRFLOW_SERVICES:
        volumes = SERVICES[name]["volumes"]
        assert "./logs:/opt/airflow/logs" in volumes, name
        assert "./config:/opt/airflow/config" in volumes, name
        assert SERVICES[name]["environment"]["AIRFLOW_CONFIG"] == "/opt/airflow/config/airflow.cfg"
