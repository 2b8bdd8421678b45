"""``$AIRFLOW_HOME/config/airflow_local_settings.py``: lines onceflow adds to it, each once.

Airflow imports that file in every process before a component starts. A file already there (a
deployment's policies, another of onceflow's additions) keeps its content and gets the lines
appended after it; a second call adds nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def add_once(airflow_home: Path, lines: str, *, marker: str, header: str = "") -> Path:
    """Add ``lines`` to the home's local settings unless ``marker`` is in the file already.

    :param airflow_home: the ``AIRFLOW_HOME`` whose ``config/airflow_local_settings.py`` is written.
    :param lines: the code to add.
    :param marker: text of ``lines`` (the call) whose presence means they were added before.
    :param header: written before ``lines`` only when the file is new (a docstring naming the writer).
    :returns: the file.
    """
    path = airflow_home / "config" / "airflow_local_settings.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(header + lines)
    elif marker not in path.read_text():
        with path.open("a") as f:
            f.write("\n" + lines)
    return path
