"""Parse a DAG folder the way the dag-processor does, and report anything it must not do.

``python -m onceflow.testing.parse_guard DAGS_FOLDER`` fills a DagBag with an audit hook
installed and prints one JSON document: the DAG ids found, import errors, warnings raised while
parsing, and *violations*: network access (``socket.connect``, ``socket.getaddrinfo``),
subprocesses, and files opened for writing. DAG files run at every parse, on every
dag-processor, every few seconds, so any of these is a bug. Run it inside ``unshare --net`` to
have the kernel refuse the network too.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

_NETWORK_EVENTS = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "urllib.Request"}
_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn"}


#: Prefix of the line the guarded parse prints its JSON report on (not an environment variable).
REPORT_PREFIX = "ONCEFLOW_PARSE_REPORT "


def read_report(stdout: str) -> dict[str, Any]:
    """The report from the output of ``python -m onceflow.testing.parse_guard``."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(REPORT_PREFIX):
            return dict(json.loads(line[len(REPORT_PREFIX) :]))
    raise ValueError("no parse report in output:\n" + stdout[-2000:])


class _Recorder:
    def __init__(self) -> None:
        self.enabled = False
        self.violations: list[dict[str, str]] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.enabled:
            return
        if event in _NETWORK_EVENTS or event in _PROCESS_EVENTS:
            self._record(event, repr(args)[:200])
        elif (
            event == "open"
            and len(args) >= 2
            and isinstance(args[1], str)
            and any(m in args[1] for m in "wax+")
        ):
            path = str(args[0])
            # Python's own bytecode cache is not the DAG's doing.
            if not path.endswith((".pyc", ".pyc.tmp")) and "__pycache__" not in path:
                self._record(event, f"{path} mode={args[1]}")

    def _record(self, event: str, detail: str) -> None:
        frames: list[str] = []
        frame = sys._getframe(2)
        while frame is not None and len(frames) < 12:
            frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            frame = frame.f_back  # type: ignore[assignment]
        self.violations.append({"event": event, "detail": detail, "stack": " <- ".join(frames)})


def parse(dags_folder: str) -> dict[str, Any]:
    """Import Airflow first (its own start-up may legitimately touch files), then parse with the hook on."""
    from airflow.dag_processing.dagbag import DagBag

    recorder = _Recorder()
    sys.addaudithook(recorder)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder.enabled = True
        bag = DagBag(dags_folder)
        recorder.enabled = False
    elapsed = time.perf_counter() - started
    dags: dict[str, dict[str, Any]] = {}
    for dag_id, dag in bag.dags.items():
        retries = [int(task.retries or 0) for task in dag.tasks]
        dags[dag_id] = {
            "fileloc": dag.fileloc,
            "owners": sorted({task.owner for task in dag.tasks}),
            "tags": sorted(dag.tags or []),
            "doc_md": bool(dag.doc_md and dag.doc_md.strip()),
            "min_retries": min(retries) if retries else None,
            "tasks": len(dag.tasks),
        }
    return {
        "dags": dags,
        "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
        "warnings": [
            {
                "category": w.category.__name__,
                "message": str(w.message),
                "filename": w.filename,
                "lineno": w.lineno,
            }
            for w in caught
        ],
        "violations": recorder.violations,
        "seconds": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = args[0] if args else "dags"
    if not Path(folder).exists():
        print(json.dumps({"error": f"no such folder: {folder}"}))
        return 2
    report = parse(folder)
    # Airflow logs to stdout too, so the report is one prefixed line.
    print(REPORT_PREFIX + json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
