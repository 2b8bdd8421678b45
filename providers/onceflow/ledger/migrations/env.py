"""Alembic environment of the ledger: runs inside :func:`onceflow.ledger.migrations.migrate`.

``migrate`` opens the transaction, takes the lock and hands its connection over in
``config.attributes["connection"]``; the revisions then run inside that one transaction, so
a failing revision leaves the ledger as it was. There is no offline (``--sql``) mode.
"""

from __future__ import annotations

from alembic import context

from onceflow.ledger.migrations import VERSION_TABLE
from onceflow.ledger.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "the ledger's migrations run through `onceflow ledger upgrade` "
        "(onceflow.ledger.migrations.migrate), which holds the lock that keeps starters apart"
    )
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER a constraint: revisions use batch_alter_table (copy and swap).
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
