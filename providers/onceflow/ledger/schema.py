"""The ledger's tables as they are after the newest migration (used by the Core queries).

``migrations.py`` builds and upgrades real databases; ``tests/unit/test_ledger_migrations.py``
checks that a migrated database has exactly these columns. Times are float seconds since the
epoch (UTC); JSON values are stored as text.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

Time = sa.Double

work_items = sa.Table(
    "work_items",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("work_key", sa.String(512), nullable=False, unique=True),
    sa.Column("kind", sa.String(128), nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("available_at", Time, nullable=False),
    sa.Column("lease_owner", sa.String(256)),
    sa.Column("lease_expires_at", Time),
    sa.Column("fencing_token", sa.Integer, nullable=False, default=0),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("max_attempts", sa.Integer, nullable=False, default=5),
    sa.Column("last_error_class", sa.String(256)),
    sa.Column("last_error", sa.Text),
    sa.Column("reason", sa.Text),
    sa.Column("payload", sa.Text),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("updated_at", Time, nullable=False),
    # v3: versions and rechecks
    sa.Column("required_version", sa.String(64)),
    sa.Column("lane", sa.String(32), nullable=False, server_default="new"),
    sa.Column("recheck_id", sa.Integer),
)

transitions = sa.Table(
    "transitions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("work_key", sa.String(512), nullable=False, index=True),
    sa.Column("event", sa.String(64), nullable=False),
    sa.Column("from_state", sa.String(32)),
    sa.Column("to_state", sa.String(32)),
    sa.Column("actor", sa.String(32), nullable=False),
    sa.Column("owner", sa.String(256)),
    sa.Column("fencing_token", sa.Integer),
    sa.Column("at", Time, nullable=False),
    sa.Column("reason", sa.Text),
)

results = sa.Table(
    "results",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("work_key", sa.String(512), nullable=False),
    sa.Column("step", sa.String(128), nullable=False),
    sa.Column("processing_version", sa.String(64), nullable=False),
    sa.Column("fencing_token", sa.Integer, nullable=False),
    sa.Column("payload", sa.Text),
    sa.Column("committed_by", sa.String(256)),
    sa.Column("committed_at", Time, nullable=False),
    # v2: the follow-ups this result promised (JSON list of outbox dedup keys / work keys)
    sa.Column("follow_ups", sa.Text),
    sa.UniqueConstraint("work_key", "step", "processing_version", name="uq_results_key_step_version"),
)

# v2
outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedup_key", sa.String(512), nullable=False, unique=True),
    sa.Column("work_key", sa.String(512), nullable=False),
    sa.Column("step", sa.String(128), nullable=False),
    sa.Column("target_type", sa.String(32), nullable=False),
    sa.Column("target", sa.String(512), nullable=False),
    sa.Column("payload", sa.Text),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("relayed_at", Time),
)

relay_status = sa.Table(
    "relay_status",
    metadata,
    sa.Column("relay_name", sa.String(128), primary_key=True),
    sa.Column("last_run_at", Time, nullable=False),
    sa.Column("last_relayed", sa.Integer, nullable=False),
)

# v3
rechecks = sa.Table(
    "rechecks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("scope", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("kind", sa.String(128), nullable=False),
    sa.Column("target_version", sa.String(64)),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("max_items", sa.Integer, nullable=False),
    sa.Column("selected", sa.Integer, nullable=False),
    sa.Column("requested_by", sa.String(256)),
    sa.Column("created_at", Time, nullable=False),
)

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.String(256), nullable=False),
    sa.Column("applied_at", Time, nullable=False),
)
