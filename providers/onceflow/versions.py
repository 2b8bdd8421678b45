"""The processing version this deployment runs: a property of the deployed code, not of a run.

A work item may require a processing version (``add(required_version=)``, a ``new_version``
recheck); only a worker running that version may lease it. What a worker runs must therefore
come from the code it was deployed with, never from the run's ``conf`` or ``params``: the
trigger of a run (a recheck, a user, another DAG) cannot make old code declare the new version.

:data:`PROCESSING_VERSION` is that constant; bump it in the change that makes items worth
processing again. A deployment may pin another value in its Airflow configuration,
``[onceflow] worker_version`` (``AIRFLOW__ONCEFLOW__WORKER_VERSION``), read on the worker when
the task runs: during a rolling deployment old and new workers each report their own.
"""

from __future__ import annotations

#: The processing version of this code.
PROCESSING_VERSION = "v1"

CONFIG_SECTION = "onceflow"
CONFIG_KEY = "worker_version"


def deployed_version() -> str:
    """The version this worker runs: ``[onceflow] worker_version``, else :data:`PROCESSING_VERSION`."""
    from airflow.configuration import conf

    value = conf.get(CONFIG_SECTION, CONFIG_KEY, fallback=None)
    return str(value).strip() if value and str(value).strip() else PROCESSING_VERSION
