"""The operations view: is the business process progressing?

An Airflow plugin (:mod:`onceflow.opsview.plugin`, entry point ``airflow.plugins``) mounts a
FastAPI app under ``/onceflow-ops`` in the api-server: a JSON API (:mod:`~onceflow.opsview.api`)
behind Airflow's auth manager, a server-rendered page (:mod:`~onceflow.opsview.page`, inline SVG
charts, no JavaScript library, nothing fetched from the internet) shown in Airflow's navigation
as an external view, and OpenMetrics text (:mod:`~onceflow.opsview.metrics`).

The figures come from the ledger (:mod:`~onceflow.opsview.questions`: the design's six
operational questions), the warehouse's ``load_audit`` (:mod:`~onceflow.opsview.partitions`),
the sheet (:mod:`~onceflow.opsview.queue`) and the watchdog (:mod:`~onceflow.opsview.watchdog`).
Every reader takes ``now`` as an argument: the figures are a function of the stored state and the
clock, so tests seed a state and compare exact numbers. ``docs/operations-view.md`` is the guide.
"""
