"""Parse time of each DAG file against an empty DAG, side by side, as ratios.

The dag-processor re-parses every file every few seconds, so parse cost is paid forever. Two
numbers per file, both measured after ``import airflow`` (which every parse pays once per
process anyway):

* cold: a fresh interpreter parses the file once (onceflow imports included), median of N;
* warm: one interpreter parses the file N times (modules cached), median.

Run: ``.venv/bin/python benchmarks/bench_dag_parse.py [--repeat N]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

EMPTY_DAG = textwrap.dedent(
    """
    import pendulum
    from airflow.sdk import dag

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"))
    def empty_dag():
        pass

    empty_dag()
    """
)

# A second reference: the cost of one TaskFlow task (it imports the standard provider's decorators).
ONE_TASK_DAG = textwrap.dedent(
    """
    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"))
    def one_task_dag():
        @task
        def noop() -> None:
            pass

        noop()

    one_task_dag()
    """
)

PROBE = textwrap.dedent(
    """
    import json, sys, time
    import airflow.sdk  # noqa: F401  (paid by every dag-processor once)
    from airflow.dag_processing.dagbag import DagBag
    path, repeat = sys.argv[1], int(sys.argv[2])
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        bag = DagBag(path)
        times.append(time.perf_counter() - t)
        assert not bag.import_errors, bag.import_errors
    print("BENCH " + json.dumps({"times": times, "dags": sorted(bag.dags)}))
    """
)


def _probe(path: Path, repeat: int, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(repeat)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH "))
    return dict(json.loads(line[6:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "AIRFLOW_HOME": tmp, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        empty = Path(tmp) / "empty_dag.py"
        empty.write_text(EMPTY_DAG)
        one_task = Path(tmp) / "one_task_dag.py"
        one_task.write_text(ONE_TASK_DAG)
        files = [empty, one_task, *sorted((REPO / "dags").glob("*.py"))]
        rows = []
        for path in files:
            cold = [float(_probe(path, 1, env)["times"][0]) for _ in range(args.repeat)]  # type: ignore[index]
            warm_all = _probe(path, args.repeat + 1, env)["times"]
            warm = [float(t) for t in warm_all[1:]]  # type: ignore[index]
            rows.append((path.name, statistics.median(cold), statistics.median(warm)))
    base_cold, base_warm = rows[0][1], rows[0][2]
    print(f"DAG parse time, median of {args.repeat} (after `import airflow`), ratio against an empty DAG")
    print(f"{'file':<24}{'cold ms':>10}{'x empty':>9}{'warm ms':>10}{'x empty':>9}")
    for name, cold_s, warm_s in rows:
        print(
            f"{name:<24}{cold_s * 1000:>10.1f}{cold_s / base_cold:>9.2f}{warm_s * 1000:>10.1f}{warm_s / base_warm:>9.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
