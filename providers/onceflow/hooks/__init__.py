"""Hooks: every connection and all I/O of onceflow (sheets, ledger, warehouse, fetch, translate, storage, heartbeat)."""
