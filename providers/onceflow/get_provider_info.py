"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``).

Keep it a plain literal: Airflow imports this in every process, so it must stay cheap.
Each helper that adds a hook, operator, sensor, trigger, connection type or plugin lists it here;
``tests/integration/test_provider_registration.py`` fails when a module of the package is missing.
"""

from __future__ import annotations

from typing import Any

from onceflow import __version__
from onceflow.connection_types import CONNECTION_TYPES
from onceflow.versions import CONFIG_KEY, CONFIG_SECTION, PROCESSING_VERSION


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata for Airflow's ProvidersManager: hooks, operators, sensors, triggers, connection types, plugin, notifier and the ``[onceflow]`` options."""
    return {
        "package-name": "airflow-provider-onceflow",
        "name": "onceflow",
        "description": (
            "Exactly-once side effects for Apache Airflow 3: claim-first Google Sheet queues, "
            "leases with fencing tokens, idempotent partition-overwrite loads and a dead-man's switch."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "onceflow",
                "external-doc-url": "https://pypi.org/project/airflow-provider-onceflow/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "onceflow",
                "python-modules": [
                    "onceflow.hooks.warehouse",
                    "onceflow.hooks.sheets",
                    "onceflow.hooks.ledger",
                    "onceflow.hooks.translate",
                    "onceflow.hooks.fetch",
                    "onceflow.hooks.storage",
                    "onceflow.hooks.heartbeat",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "onceflow",
                "python-modules": [
                    "onceflow.operators.partition",
                    "onceflow.operators.dashboard",
                    "onceflow.operators.sheets",
                    "onceflow.operators.ledger",
                    "onceflow.operators.article_step",
                    "onceflow.operators.articles",
                    "onceflow.operators.article_batch",
                ],
            }
        ],
        "sensors": [{"integration-name": "onceflow", "python-modules": ["onceflow.sensors.sheets"]}],
        "triggers": [{"integration-name": "onceflow", "python-modules": ["onceflow.triggers.sheets"]}],
        # onceflow_fetch, onceflow_storage, onceflow_translate, onceflow_ledger, with their form fields
        "connection-types": CONNECTION_TYPES,
        "plugins": [
            {"name": "onceflow_priority", "plugin-class": "onceflow.priority.OnceflowPriorityPlugin"}
        ],
        "notifications": ["onceflow.notifications.deadline.MissedDeadlineNotifier"],
        "config": {
            CONFIG_SECTION: {
                "description": "Settings of the onceflow provider on the machines that run its tasks.",
                "options": {
                    CONFIG_KEY: {
                        "description": (
                            "Processing version this worker runs (onceflow.versions): it leases only "
                            "ledger items that require no version or this one, and stores its results "
                            "under it. Defaults to the version of the installed code; never taken from "
                            "a run's conf or params."
                        ),
                        "version_added": None,
                        "type": "string",
                        "example": "v2",
                        "default": PROCESSING_VERSION,
                    }
                },
            }
        },
    }
