"""``make run`` / ``onceflow up``: Airflow on embedded defaults with this repo's DAGs.

Everything lives under one folder (default ``.onceflow/``, ignored by git): ``airflow/`` is
AIRFLOW_HOME with a SQLite metadata DB, ``data/`` holds the shop, warehouse and ledger SQLite
files and the Sheets emulator's state, ``logs/`` the emulator log. Connections are exported as
``AIRFLOW_CONN_*`` variables, so the DAG files are the same ones that run against Google and
PostgreSQL in production.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from onceflow import sqlite_metadata
from onceflow.pools import pools_import_json
from onceflow.shutdown import GracefulShutdown
from onceflow.testing.processes import exit_code_unreaped

DEMO_SPREADSHEET_ID = "onceflow-demo"
#: The demo sheet's rows: articles of the embedded demo site (``onceflow.testing.article_site``),
#: each a path on it. With the demo's threshold (:data:`DEMO_SCORE_THRESHOLD`) three publish at
#: once, one (score 0.90) waits for a reviewer; the Catalan page fails with the reason that no
#: Apertium pair for it is installed, the PDF with "not HTML"; one cell that is not a URL is
#: INVALID at the claim. Those three say so in their ``comment`` cell (:data:`DEMO_COMMENTS`).
DEMO_ARTICLE_PATHS = (
    "/articles/biblioteca-movil.html",
    "/articles/con-script.html",
    "/articles/titulo-formula.html",
    "/articles/huertos-urbanos.html",
    "/articles/festa-major.html",
    "/notes.pdf",
)
#: The demo's publication threshold (the Variable ``onceflow_score_threshold``; 0.7 by default):
#: high enough that one demo article (0.90) goes to a human review.
DEMO_SCORE_THRESHOLD = "0.92"
DEMO_NOT_A_URL = "not a url"
#: The demo sheet's extra ``comment`` column (the queue ignores columns it does not know): the rows
#: that end red on purpose, and why, where a demo user looks first.
DEMO_COMMENTS = {
    "/articles/festa-major.html": "fails on purpose: a Catalan page, and no Apertium pair for Catalan is installed",
    "/notes.pdf": "fails on purpose: a PDF, not an HTML page",
    DEMO_NOT_A_URL: "fails on purpose: not a URL, so the claim marks it INVALID",
}
#: Preferred ports of the demo article site and the watchdog's alert receiver.
SITE_PORT = 8765
RECEIVER_PORT = 8766


def demo_urls(site_port: int) -> list[str]:
    """The demo sheet's ``url`` cells for a site on ``site_port`` (the invalid one last)."""
    return [f"http://127.0.0.1:{site_port}{path}" for path in DEMO_ARTICLE_PATHS] + [DEMO_NOT_A_URL]


@dataclass(frozen=True)
class LocalRunConfig:
    """What ``onceflow up`` (``make run``) starts and where: home, DAG and plugin folders, port, demo days, executor."""

    home: Path
    dags_folder: Path
    plugins_folder: Path
    port: int
    demo_days: int
    exit_when_ready: bool = False
    #: ``local`` (``airflow standalone``) or ``celery`` (two schedulers and two Celery workers).
    executor: str = "local"
    #: The metadata DB for ``celery`` (PostgreSQL); ``ONCEFLOW_UP_DATABASE_URL`` by default.
    database_url: str | None = None

    @classmethod
    def from_args(
        cls,
        *,
        home: str,
        dags_folder: str,
        plugins_folder: str,
        port: int,
        demo_days: int,
        exit_when_ready: bool = False,
        executor: str = "local",
        database_url: str | None = None,
    ) -> LocalRunConfig:
        """Build from the command line's values (paths made absolute)."""
        return cls(
            home=Path(home).resolve(),
            dags_folder=Path(dags_folder).resolve(),
            plugins_folder=Path(plugins_folder).resolve(),
            port=port,
            demo_days=demo_days,
            exit_when_ready=exit_when_ready,
            executor=executor,
            database_url=database_url or os.environ.get(DATABASE_URL_ENV) or None,
        )

    @property
    def airflow_home(self) -> Path:
        """``<home>/airflow``: AIRFLOW_HOME of the run."""
        return self.home / "airflow"

    @property
    def data(self) -> Path:
        """``<home>/data``: the demo databases, the emulator's state and the published pages."""
        return self.home / "data"


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_port(preferred: int) -> int:
    if _port_free(preferred):
        return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sqlite_conn(path: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(path)})


def _sticky_port(cfg: LocalRunConfig, name: str, preferred: int) -> int:
    """A port chosen once per home and kept: the demo sheet's URLs and the allow-list name it."""
    record = cfg.data / f"{name}.port"
    if record.exists():
        port = int(record.read_text().strip())
        if not _port_free(port):
            raise RuntimeError(
                f"port {port} (the {name} of {cfg.home}, named in its demo sheet) is taken; free it, "
                "or pass another --home"
            )
        return port
    port = _pick_port(preferred)
    record.write_text(str(port))
    return port


def login(cfg: LocalRunConfig) -> tuple[str, str]:
    """The UI's user (this machine's login name, an admin) and its password, made once per home.

    The simple auth manager reads passwords from ``$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated``
    and generates only those missing, so writing it first gives a password the banner can print.
    A named user is also who the review's answer names ("Anonymous" in all-admins mode).
    """
    import getpass
    import secrets

    user = getpass.getuser() or "onceflow"
    path = cfg.airflow_home / "simple_auth_manager_passwords.json.generated"
    passwords: dict[str, str] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            passwords = dict(json.loads(path.read_text() or "{}"))
    if not passwords.get(user):
        passwords[user] = secrets.token_urlsafe(12)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.write_text(json.dumps(passwords))
    return user, passwords[user]


def environment(
    cfg: LocalRunConfig, api_port: int, emulator_port: int, site_port: int = SITE_PORT, user: str = "onceflow"
) -> dict[str, str]:
    """The environment every Airflow process of the local run shares (``user``: the UI's admin)."""
    sheets_conn = {
        "conn_type": "google_cloud_platform",
        "extra": {
            "is_anonymous": True,
            "api_endpoint": f"http://127.0.0.1:{emulator_port}/",
            "spreadsheet_id": DEMO_SPREADSHEET_ID,
        },
    }
    from onceflow.local_api_guard import ALLOWED_HOSTS_ENV, UI_TIMEZONE_ENV, loopback_hosts
    from onceflow.sales.config import SalesConfig

    business_tz = SalesConfig.from_env().timezone
    return {
        **os.environ,
        # `airflow standalone` starts its components as `airflow ...` from PATH.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "AIRFLOW_HOME": str(cfg.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(cfg.dags_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(cfg.plugins_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The demo shows the queue working without a click: DAGs start unpaused when first parsed
        # into a fresh home. Only at creation, so a DAG the user pauses stays paused on restart.
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # 8 LocalExecutor workers, not 32: plenty for the demo, and a laptop (or a 2-core CI box)
        # keeps its memory and stops them quickly on Ctrl-C.
        "AIRFLOW__CORE__PARALLELISM": "8",
        # a login (password in the banner), not all-admins: a named reviewer, and a page that
        # reaches the API still needs the password
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{user}:admin",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{cfg.airflow_home / 'airflow.db'}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__BASE_URL": f"http://localhost:{api_port}",
        # all-admins with no login: only this machine's own names may drive the API (DNS
        # rebinding), and no other site's page may post to it (onceflow.local_api_guard)
        ALLOWED_HOSTS_ENV: ",".join(loopback_hosts(api_port)),
        # daily_sales's days start at business midnight: the UI's pickers and run times start in
        # that zone, and the CLI reads a date without an offset in it (backfill without off-by-one)
        UI_TIMEZONE_ENV: business_tz,
        "AIRFLOW__CORE__DEFAULT_TIMEZONE": business_tz,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": json.dumps(sheets_conn),
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": _sqlite_conn(cfg.data / "shop.db"),
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": _sqlite_conn(cfg.data / "warehouse.db"),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": _sqlite_conn(cfg.data / "ledger.db"),
        # the article chain: step outputs and published pages as local files, the pages served
        # by the demo site under /published/; fetches may reach the demo site and nothing else
        # local; translation is Apertium (no onceflow_translate connection: the embedded default)
        "AIRFLOW_CONN_ONCEFLOW_STORAGE": json.dumps(
            {
                "conn_type": "generic",
                "extra": {
                    "base": (cfg.data / "storage").as_uri(),
                    "publish_base": (cfg.data / "published").as_uri(),
                    "public_url": f"http://127.0.0.1:{site_port}/published",
                },
            }
        ),
        "AIRFLOW_VAR_ONCEFLOW_SCORE_THRESHOLD": DEMO_SCORE_THRESHOLD,
        # sales_dashboard draws here; the demo site serves it under /dashboard/
        "ONCEFLOW_DASHBOARD_DIR": str(cfg.data / "dashboard"),
        "AIRFLOW_CONN_ONCEFLOW_FETCH": json.dumps(
            {"conn_type": "generic", "extra": {"allow": [f"127.0.0.1:{site_port}"]}}
        ),
    }


def sqlite_metadata_settings(env: dict[str, str]) -> bool:
    """When ``env``'s metadata database is SQLite, give its connections a longer lock wait
    (:mod:`onceflow.sqlite_metadata`: a backfill created in the UI must not meet "database is
    locked"); whether it is SQLite."""
    if not env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite"):
        return False
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = sqlite_metadata.CONNECT_ARGS_PATH
    return True


def _airflow(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "airflow", *args], env=env, check=True, stdout=subprocess.DEVNULL)


def _write_local_settings(cfg: LocalRunConfig) -> None:
    """``airflow_local_settings.py`` of this home: the log servers listen on 127.0.0.1 only."""
    _write_local_settings_into(cfg.airflow_home)


def _write_local_settings_into(airflow_home: Path) -> None:
    from onceflow.loopback_logs import write_local_settings

    write_local_settings(airflow_home)


def _demo_sheet(path: Path, site_port: int) -> Path:
    from onceflow.sheets.model import REQUIRED_COLUMNS
    from onceflow.sheets.protocol import AUDIT_HEADER

    header = [*REQUIRED_COLUMNS, "comment"]
    paths = [*DEMO_ARTICLE_PATHS, DEMO_NOT_A_URL]
    cells = {"status": "NEW"}
    rows = [header]
    for url, demo_path in zip(demo_urls(site_port), paths, strict=True):
        row = {**cells, "url": url, "comment": DEMO_COMMENTS.get(demo_path, "")}
        rows.append([row.get(c, "") for c in header])
    path.write_text(
        json.dumps(
            {
                "spreadsheetId": DEMO_SPREADSHEET_ID,
                "title": "onceflow demo queue",
                # the polish step's glossary: source word -> the translation editors want
                "sheets": {
                    "queue": rows,
                    "audit": [AUDIT_HEADER],
                    "glossary": [
                        ["source", "target"],
                        ["huerto", "allotment"],
                        ["bibliobús", "mobile library"],
                        # the quickstart's row (tren-nocturno) publishes once these apply: 0.91 -> 0.94
                        ["reclinables", "reclining"],
                        ["deficitarios", "loss-making"],
                        ["rodante", "rolling"],
                        ["resume", "sums up"],
                    ],
                },
            }
        )
    )
    return path


def _demo_orders(cfg: LocalRunConfig) -> None:
    """Generate the demo shop database once.

    Generation writes ``shop.db.partial`` and renames it to ``shop.db`` only when complete, so an
    existing ``shop.db`` always holds the whole demo; a run killed half-way leaves only the
    partial file, which the next run deletes and generates again.
    """
    shop = cfg.data / "shop.db"
    if shop.exists():
        return
    from onceflow.cli import main as onceflow_main

    partial = shop.with_name(shop.name + ".partial")
    partial.unlink(missing_ok=True)
    end = dt.date.today()
    start = end - dt.timedelta(days=cfg.demo_days)
    rc = onceflow_main(
        [
            "sales",
            "generate",
            "--url",
            f"sqlite:///{partial}",
            "--start",
            start.isoformat(),
            "--end",
            end.isoformat(),
        ]
    )
    if rc != 0:
        raise RuntimeError(f"generating the demo orders into {partial} failed (exit code {rc})")
    os.replace(partial, shop)


def _all_running(children: list[subprocess.Popen[bytes]]) -> bool:
    """Whether every child still runs, checked without reaping (see the note in :func:`_run`)."""
    return all(exit_code_unreaped(c) is None for c in children)


def _wait_http(
    url: str, timeout: float, children: list[subprocess.Popen[bytes]], stop: GracefulShutdown
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.requested and _all_running(children):
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


#: Environment variable that marks every process of one ``onceflow up``.
RUN_MARKER = "ONCEFLOW_UP_RUN"
DATABASE_URL_ENV = "ONCEFLOW_UP_DATABASE_URL"


def _celery_problem(cfg: LocalRunConfig) -> str | None:
    """Why ``--executor celery`` cannot start with this configuration, or None."""
    if cfg.executor == "local":
        return None
    if cfg.executor != "celery":
        return f"--executor must be local or celery, not {cfg.executor!r}"
    if not (cfg.database_url or "").startswith("postgresql"):
        return (
            "--executor celery needs a PostgreSQL metadata database (two schedulers lock rows): "
            f"pass --database-url or set {DATABASE_URL_ENV}, e.g. "
            "postgresql+psycopg2://postgres@127.0.0.1:5432/onceflow (an existing, empty database)"
        )
    return None


def run(cfg: LocalRunConfig) -> int:
    """Prepare the folder, start the emulator and ``airflow standalone``, wait for Ctrl-C.

    SIGTERM and SIGINT only set a flag (:class:`~onceflow.shutdown.GracefulShutdown`) that the
    waits poll, so no number of them can cut the clean-up short: ``make`` forwards the SIGTERM
    its process group already got, and a raising handler hit by that second one inside the
    ``finally`` left the whole of Airflow running.
    """
    if problem := _celery_problem(cfg):
        print(f"onceflow: {problem}", file=sys.stderr)
        return 2
    cfg.home.mkdir(parents=True, exist_ok=True)
    with (cfg.home / "up.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # A second scheduler on the same SQLite metadata DB would fight the first one.
            lock.seek(0)
            print(
                f"onceflow: another `onceflow up` (pid {lock.read().strip() or '?'}) is running on "
                f"{cfg.home}; stop it first, or pass another --home",
                file=sys.stderr,
            )
            return 1
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        stop = GracefulShutdown()
        with stop.installed((signal.SIGTERM, signal.SIGINT)):
            return _run(cfg, stop)


def _run(cfg: LocalRunConfig, stop: GracefulShutdown) -> int:
    for folder in (cfg.airflow_home, cfg.data, cfg.home / "logs"):
        folder.mkdir(parents=True, exist_ok=True)
    api_port = _pick_port(cfg.port)
    emulator_port = _pick_port(8090)
    site_port = _sticky_port(cfg, "article-site", SITE_PORT)
    receiver_port = _pick_port(RECEIVER_PORT)
    user, password = login(cfg)
    env = environment(cfg, api_port, emulator_port, site_port, user=user)
    # the log servers' default ports are fixed (8793, 8794): a second copy, or any other Airflow
    # on this machine, would leave this run without them
    env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(_pick_port(8793))
    env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] = str(_pick_port(8794))
    if cfg.executor == "celery" and cfg.database_url:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = cfg.database_url
    metadata_on_sqlite = sqlite_metadata_settings(env)
    # Every process started from here inherits this marker, which is how _stop finds them all
    # (AIRFLOW_HOME would also match a user's shell that exported the same home).
    marker = f"{os.getpid()}-{time.time_ns()}"
    env[RUN_MARKER] = marker

    print(f"onceflow: preparing {cfg.home} (metadata DB, pools, demo data)", flush=True)
    _write_local_settings(cfg)
    _airflow(env, "db", "migrate")
    if metadata_on_sqlite:
        sqlite_metadata.use_write_ahead_log(cfg.airflow_home / "airflow.db")
    pools_file = cfg.airflow_home / "onceflow_pools.json"
    pools_file.write_text(pools_import_json())
    _airflow(env, "pools", "import", str(pools_file))
    # the ledger's tables before anything reads them (the watchdog's article-queue check does)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.cli",
            "ledger",
            "upgrade",
            "--url",
            f"sqlite:///{cfg.data / 'ledger.db'}",
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    _demo_orders(cfg)
    if stop.requested:  # stopped while preparing: nothing runs in the background yet
        return 0

    # Watched with exit_code_unreaped, never Popen.poll: a child that dies stays a zombie until
    # _stop has swept its session, so the session id still names its orphaned processes (the
    # scheduler and workers overwrite the marker in their environment).
    children: list[subprocess.Popen[bytes]] = []
    cluster: Any = None
    ui = f"http://localhost:{api_port}"
    logs = cfg.home / "logs"
    # Both launches inside the try: if the second fails, the first is still stopped.
    try:
        with (logs / "sheets-emulator.log").open("ab") as log:
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "onceflow.testing.sheets_emulator",
                        "--port",
                        str(emulator_port),
                        "--state",
                        str(cfg.data / "sheets-state.json"),
                        "--seed",
                        str(_demo_sheet(cfg.data / "demo-sheet.json", site_port)),
                    ],
                    env={**os.environ, RUN_MARKER: marker},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        (cfg.data / "published").mkdir(exist_ok=True)
        (cfg.data / "dashboard").mkdir(exist_ok=True)
        with (logs / "article-site.log").open("ab") as log:
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "onceflow.testing.article_site",
                        "--port",
                        str(site_port),
                        "--published-dir",
                        str(cfg.data / "published"),
                        "--dashboard-dir",
                        str(cfg.data / "dashboard"),
                    ],
                    env={**os.environ, RUN_MARKER: marker},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        children += _start_watchdog(cfg, marker, receiver_port)
        if cfg.executor == "celery":
            cluster = _start_celery(cfg, env, api_port)
        else:
            with (logs / "airflow-standalone.log").open("ab") as log:
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "airflow", "standalone"],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        if not _wait_http(f"http://127.0.0.1:{api_port}/api/v2/monitor/health", 420, children, stop):
            if stop.requested:
                return 0
            print(f"onceflow: Airflow did not answer on {ui}; see {logs}", file=sys.stderr)
            return 1
        print(_banner(cfg, ui, emulator_port, site_port, (user, password)), flush=True)
        if cfg.exit_when_ready:
            return 0
        while not stop.requested and _all_running(children) and _cluster_running(cluster):
            time.sleep(0.5)
        if stop.requested:
            return 0
        print("onceflow: a component stopped; see the logs above", file=sys.stderr)
        return 1
    finally:
        if stop.requested:
            print("onceflow: stopping (up to 30 s)", file=sys.stderr, flush=True)
        if cluster is not None:
            cluster.stop()
        _stop(children, marker)


def _start_celery(cfg: LocalRunConfig, env: dict[str, str], api_port: int) -> Any:
    """The Celery topology (``onceflow.testing.celery_cluster``): api-server on ``api_port``, two
    schedulers, two Celery workers on Redis (127.0.0.1:6379), dag-processor and triggerer.

    It stops what it started if it fails to come up; its logs go to ``<home>/logs/celery``.
    """
    from onceflow.testing.celery_cluster import CeleryCluster

    # Each worker's own AIRFLOW_HOME gets the loopback local settings from CeleryCluster itself.
    cluster = CeleryCluster(env, cfg.home / "logs" / "celery", api_port=api_port, parallelism=8)
    print(f"onceflow: starting the Celery topology (logs in {cluster.workdir})", flush=True)
    return cluster.start(timeout=420)


def _cluster_running(cluster: Any) -> bool:
    if cluster is None:
        return True
    from onceflow.testing.airflow_cluster import ClusterError

    try:
        cluster._check_alive()
    except ClusterError as exc:
        print(f"onceflow: {str(exc).splitlines()[0]}", file=sys.stderr)
        return False
    return True


def _start_watchdog(cfg: LocalRunConfig, marker: str, receiver_port: int) -> list[subprocess.Popen[bytes]]:
    """The dead-man's switch beside Airflow: a local webhook receiver and ``onceflow-watchdog``
    watching the heartbeat DAG's beats and the article queue in the ledger (outside Airflow's
    metadata DB, as in production)."""
    from onceflow.watchdog.local import start_beside, start_receiver

    os.environ[RUN_MARKER] = marker  # both inherit it, so _stop finds them with the rest
    try:
        receiver = start_receiver(cfg.home, receiver_port)
        watchdog = start_beside(cfg.home, f"sqlite:///{cfg.data / 'ledger.db'}", receiver_port)
    finally:
        del os.environ[RUN_MARKER]
    return [receiver, watchdog]


def _stop(children: list[subprocess.Popen[bytes]], marker: str) -> None:
    """SIGTERM everything started here, SIGKILL what is left after 30 s, then reap.

    ``airflow standalone``'s own children outlive it when it dies first, and task processes move to
    process groups of their own, so a ``killpg`` misses some: everything is found by the run's
    marker variable and by session instead (:mod:`onceflow.testing.processes`). The children are
    reaped only after the sweep, so their PIDs still pin the session ids it matches.
    """
    from onceflow.testing.processes import start_ticks, terminate_marked

    sessions = {c.pid: ticks for c in children if (ticks := start_ticks(c.pid)) is not None}
    killed = terminate_marked(RUN_MARKER, marker, grace=30.0, sessions=sessions)
    if killed:
        print(
            f"onceflow: {len(killed)} process(es) ignored SIGTERM for 30 s and were killed", file=sys.stderr
        )
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=10)  # bounded: never hang the shell on a stuck child


def _topology(cfg: LocalRunConfig) -> str:
    if cfg.executor == "celery":
        from onceflow.redact import redact_url

        # passwords stay out of the banner (it lands in terminals and CI logs): the user-info's
        # and a ?password=... in the query
        db = redact_url(cfg.database_url or "")
        return f"PostgreSQL metadata DB {db}; CeleryExecutor: 2 schedulers, 2 workers on Redis"
    return "SQLite metadata DB, LocalExecutor"


def _banner(
    cfg: LocalRunConfig, ui: str, emulator_port: int, site_port: int, credentials: tuple[str, str] = ("", "")
) -> str:
    from onceflow.sales.config import SalesConfig

    airflow_home = cfg.airflow_home
    tz = SalesConfig.from_env().timezone
    # yesterday is loaded by the scheduled run: a backfill over it would make one run fewer
    last = dt.date.today() - dt.timedelta(days=2)
    first = dt.date.today() - dt.timedelta(days=cfg.demo_days)
    # The CLI line below runs outside make run's environment, where [core] default_timezone is
    # UTC: a bare date would be 01:00 local and skip the first day. Local midnight with its offset.
    zone = ZoneInfo(tz)
    first_at, last_at = (dt.datetime.combine(d, dt.time(), zone).isoformat() for d in (first, last))
    sheet = f"http://127.0.0.1:{emulator_port}/view/{DEMO_SPREADSHEET_ID}"
    site = f"http://127.0.0.1:{site_port}"
    return f"""
onceflow is running on embedded defaults.

  Airflow UI        {ui}   user {credentials[0]!r}, password {credentials[1]!r} (kept in
                    {cfg.airflow_home / "simple_auth_manager_passwords.json.generated"}); it answers only this
                    machine's own names and refuses other sites' writes; times in {tz}
  Operations view   {ui.rstrip("/")}/onceflow-ops/   (in the UI: Browse -> onceflow operations)
  The demo sheet    {sheet}   (read-only view, refreshes itself)
  Published pages   {site}/published/
  Sales dashboard   {site}/dashboard/   (drawn after each daily_sales load)
  DAGs folder       {cfg.dags_folder}
  AIRFLOW_HOME      {cfg.airflow_home}   ({_topology(cfg)})
  Shop / warehouse  {cfg.data / "shop.db"} / {cfg.data / "warehouse.db"}  ({cfg.demo_days} days of demo orders)
  Logs              {cfg.home / "logs"}

What runs now, with no step of yours: every DAG starts unpaused in a fresh home. sheet_claim's
first run starts as soon as the DAGs are parsed (a minute or two): it claims the demo sheet's
article rows and starts one article_pipeline run per row (the run's note names the row's URL,
and the article's title once the run ends):
fetch from the demo site, extract, translate with Apertium (Spanish to English), score, polish
with the sheet's glossary tab, publish, write DONE, the score and the link back to the row. One
article scores 0.90, under the demo's threshold {DEMO_SCORE_THRESHOLD} (Variable onceflow_score_threshold),
and waits for a reviewer (row NEEDS_REVIEW): Browse -> Required Actions, or the run's `review`
task; Approve needs no note, a rejection's note goes on the row.

Red on purpose (each says so in the sheet's comment column): the article_pipeline runs of
festa-major.html (Catalan: no Apertium pair for it is installed) and notes.pdf (a PDF, not HTML)
fail with their reason on the row, and the "not a url" row becomes INVALID at the claim.
daily_sales loads the latest day of orders; sales_dashboard redraws after each load;
sheet_reconcile repairs orphaned claims; heartbeat beats every minute.

  Article site      {site}/   (the demo pages)
  Watchdog          log {cfg.home / "onceflow" / "watchdog.log"}, config {cfg.home / "onceflow" / "watchdog.toml"}
  Watchdog alerts   {cfg.home / "onceflow" / "alerts.jsonl"}   (what its webhook receiver got)

Add a row (any page of the demo site, or your own allowed URL) and sheet_claim takes it within
a minute; this one, not in the demo queue, is polished by the demo glossary and publishes (DONE):
  curl -s -X POST -H 'Content-Type: application/json' \\
      'http://127.0.0.1:{emulator_port}/v4/spreadsheets/{DEMO_SPREADSHEET_ID}/values/queue!A1:append?valueInputOption=RAW' \\
      -d '{{"values": [["{site}/articles/tren-nocturno.html", "NEW"]]}}'

A DAG shown as paused (you paused it, or this home was made before DAGs started unpaused) stays
paused across restarts; unpause it with, e.g.:
  AIRFLOW_HOME={airflow_home} .venv/bin/airflow dags unpause sheet_claim

Load the earlier demo days (the scheduled run loads yesterday): in the UI, daily_sales ->
Trigger -> Backfill, from {first} 00:00 to {last} 00:00 (the UI is in {tz}, as the sales days
are; both days included: one run per day), or:
  AIRFLOW_HOME={airflow_home} .venv/bin/airflow backfill create --dag-id daily_sales \\
      --from-date {first_at} --to-date {last_at}
Backfilled days record no missed deadline: their 07:00 passed before they ran.

Ctrl-C stops everything.
"""
