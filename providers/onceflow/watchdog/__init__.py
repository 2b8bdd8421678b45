"""onceflow-watchdog: the dead-man's switch that runs outside Airflow (see ``docs/watchdog.md``).

Nothing in this package imports Airflow: the watchdog must keep working when the scheduler, the
metadata database or the api-server is what has failed.
"""
