"""What the onceflow pytest plugin costs a project that does not use it: ``pytest --co`` side by side.

The provider's wheel registers its pytest plugin by entry point (``pytest11``), so every pytest
session of every project in an environment where onceflow is installed loads it. This makes a
small foreign project (its own tests, no onceflow configuration, nothing onceflow in it) in a
temporary folder and runs ``python -m pytest --co -q`` there with the plugin and with ``-p
no:onceflow``, side by side (``sidebyside.py``: one untimed warm-up of each, then ``--repeat``
runs of each in alternating order); it prints every run's wall and CPU time (user + system of the
child) with the load average, the medians of both, their difference and the modules the plugin
adds. No assertion: timings on a shared machine are for reading.

The difference sought (tens of ms in a session of one to two seconds) is smaller than what a
loaded 2-core machine adds to a single run, so ``--instructions`` also runs each side once under
``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``) and prints the instructions each executed:
a count that repeats to within a thousand of 6.5 billion whatever the load, and the difference
as a share of the baseline, which times the baseline's median CPU gives the plugin's CPU cost.
Needs valgrind (Debian's package); a few minutes per side.

    .venv/bin/python benchmarks/bench_pytest_plugin_import.py --repeat 10 [--instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside import Result, load_average, measure_sides, print_table

FOREIGN_TEST = """
import pytest

@pytest.fixture
def numbers():
    return [3, 1, 2]

@pytest.mark.parametrize("n", range(20))
def test_sorted(numbers, n):
    assert sorted(numbers + [n])[0] == min(numbers + [n])
"""

COUNT_MODULES = """
import sys, json
import pytest

class Count:
    def pytest_collection_finish(self, session):
        print("MODULES " + json.dumps(sorted(sys.modules)))

sys.exit(pytest.main(["--co", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Count()]))
"""


def _run(folder: Path, extra: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *extra],
        cwd=folder,
        capture_output=True,
        text=True,
        env=_env(),
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"pytest --co failed:\n{done.stdout}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _env() -> dict[str, str]:
    # a foreign project's session: none of this repository's settings
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "ONCEFLOW", "PYTEST")) and k != "PYTHONPATH"
    }


def _modules(folder: Path, extra: list[str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", COUNT_MODULES, *extra], cwd=folder, capture_output=True, text=True, env=_env()
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES "))
    return set(json.loads(line[8:]))


def _instructions(folder: Path, extra: list[str]) -> int:
    """Instructions one ``pytest --co`` executes, counted by callgrind."""
    with tempfile.TemporaryDirectory(prefix="callgrind-") as out:
        counts = Path(out) / "callgrind.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}", sys.executable,
             "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *extra],
            cwd=folder, capture_output=True, text=True, env={**_env(), "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"callgrind of pytest --co failed:\n{done.stdout}\n{done.stderr}")
        summary = next(line for line in counts.read_text().splitlines() if line.startswith("summary:"))
        return int(summary.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--instructions", action="store_true", help="also count each side's instructions (valgrind)"
    )
    args = parser.parse_args()
    counted: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="foreign-project-") as tmp:
        folder = Path(tmp)
        (folder / "test_foreign.py").write_text(FOREIGN_TEST)
        (folder / "pyproject.toml").write_text('[project]\nname = "foreign"\nversion = "0"\n')

        def side(extra: list[str]) -> Any:
            def run(_rep: int) -> Result:
                wall, cpu = _run(folder, extra)
                return Result(cpu, {"wall": wall})

            return run

        samples = measure_sides(
            {"-p no:onceflow": side(["-p", "no:onceflow"]), "with onceflow": side([])}, args.repeat
        )
        added = _modules(folder, []) - _modules(folder, ["-p", "no:onceflow"])
        if args.instructions:
            for side, extra in (("-p no:onceflow", ["-p", "no:onceflow"]), ("with onceflow", [])):
                print(f"  callgrind: {side}, load average {load_average()}", flush=True)
                counted[side] = _instructions(folder, extra)
    print(f"pytest --co of a foreign project, {args.repeat} runs each after a warm-up, alternated")
    print_table(samples, baseline="-p no:onceflow", unit="CPU s of the child", fmt="{:.3f}")
    timed = [s for s in samples if s.rep > 0]
    runs = {
        side: [(s.detail["wall"], s.value) for s in timed if s.side == side]
        for side in ("with onceflow", "-p no:onceflow")
    }
    with_plugin, without = runs["with onceflow"], runs["-p no:onceflow"]
    wall_with, wall_without = (statistics.median(w for w, _ in r) for r in (with_plugin, without))
    cpu_with, cpu_without = (statistics.median(c for _, c in r) for r in (with_plugin, without))
    print(
        f"  wall: with onceflow {wall_with * 1000:.0f} ms, -p no:onceflow {wall_without * 1000:.0f} ms, "
        f"added {(wall_with - wall_without) * 1000:+.0f} ms ({wall_with / wall_without:.2f}x)"
    )
    print(
        f"  CPU:  with onceflow {cpu_with * 1000:.0f} ms, -p no:onceflow {cpu_without * 1000:.0f} ms, "
        f"added {(cpu_with - cpu_without) * 1000:+.0f} ms ({cpu_with / cpu_without:.2f}x)"
    )
    print(f"  modules the plugin adds: {len(added)}: {', '.join(sorted(added)[:40])}")
    if counted:
        base, plugin = counted["-p no:onceflow"], counted["with onceflow"]
        share = (plugin - base) / base
        print(
            f"  instructions (callgrind): with onceflow {plugin:,}, -p no:onceflow {base:,}, added "
            f"{plugin - base:+,} ({share:+.2%}); x the median CPU without it: {share * cpu_without * 1000:+.1f} ms"
        )


if __name__ == "__main__":
    main()
