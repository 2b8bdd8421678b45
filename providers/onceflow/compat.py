"""Airflow APIs that differ between the Airflow versions onceflow supports, behind one name each.

As the official providers' ``common.compat``: try the current API, fall back to the older one,
so the rest of the package (and the DAG files) never test versions themselves. Supported: 3.2
and 3.3 (``docs/deploy.md`` says why not 3.1). Keep this module light: DAG files import it.
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

from airflow.sdk.definitions.deadline import DeadlineAlert

#: The oldest Airflow minor onceflow works on; ``apache-airflow>=`` in pyproject.toml must say the
#: same (a test checks). 3.1 cannot: its Task SDK gives a task no way to read another run's conf
#: (``GetDagRun`` came in 3.2), which the sheet claim needs to tell whose claim a run carries, and
#: it evaluates no custom deadline reference (``BusinessTimeDeadline``). See docs/deploy.md.
OLDEST_SUPPORTED_AIRFLOW = "3.2"

#: Airflow 3.3 added ``name`` to ``DeadlineAlert`` (shown in the UI and the deadline's record);
#: 3.2 has no such parameter and refuses the keyword.
DEADLINE_ALERT_HAS_NAME = "name" in inspect.signature(DeadlineAlert.__init__).parameters


def deadline_alert(*, reference: Any, interval: timedelta, callback: Any, name: str) -> DeadlineAlert:
    """A ``DeadlineAlert``, named where the installed Airflow can name one (3.3+).

    On 3.2 the name is dropped from the alert itself; callers that need it later pass it to their
    callback too (``MissedDeadlineNotifier`` records it as ``alert``).
    """
    if DEADLINE_ALERT_HAS_NAME:
        return DeadlineAlert(reference=reference, interval=interval, callback=callback, name=name)
    return DeadlineAlert(reference=reference, interval=interval, callback=callback)
