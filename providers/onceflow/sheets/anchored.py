"""Writes that reach a claimed row through its row anchor, wherever the row has moved.

A claim anchors its row with developer metadata ``onceflow.claim = <token>``
(:mod:`onceflow.sheets.anchors`). Reads and writes keyed by that anchor
(``values.batchGetByDataFilter``, ``values.batchUpdateByDataFilter``) are resolved by the server to
the row the anchor is on when the request is applied, so no position is ever computed on the
client. :meth:`AnchoredRows.write_fields` costs 1 read + 1 write; an anchor on a row that lost the
token (cut and paste of cells) is dropped by its ``metadataId``, and a claim without an anchor is
*adopted* (anchored afresh in one guarded batch). :func:`sweep_anchors` removes the anchors of
rows no longer in flight. ``docs/sheet-queue.md`` has the argument.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from onceflow.sheets import anchors
from onceflow.sheets.a1 import a1_sheet
from onceflow.sheets.model import FINAL_STATUSES, IN_FLIGHT_STATUSES, ColumnMap, Row, Snapshot, make_row
from onceflow.sheets.tab import find_replace, occurrences

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from onceflow.sheets.tab import QueueTab

log = logging.getLogger(__name__)


class AnchoredRows:
    """The by-anchor reads and writes of one queue tab.

    :param queue: the :class:`~onceflow.sheets.tab.QueueTab` whose transport, tab and backoff
        these requests use.
    """

    def __init__(self, queue: QueueTab) -> None:
        self.queue = queue

    def _rows_of(self, token: str) -> tuple[ColumnMap | None, list[Row]]:
        """The header and every row anchored to ``token``, in one ``values.batchGetByDataFilter``."""
        columns, rows = self.rows([token])
        return columns, rows.get(token, [])

    def rows(self, tokens: Sequence[str]) -> tuple[ColumnMap | None, dict[str, list[Row]]]:
        """The header and, per token, every row anchored to it: one ``values.batchGetByDataFilter``."""
        header = {"a1Range": f"{a1_sheet(self.queue.sheet)}!1:1"}
        filters = [header, *(anchors.lookup(t) for t in tokens)]
        matched = self.queue.idempotent(lambda: self.queue.transport.read_by_filter(filters))
        columns: ColumnMap | None = None
        found: list[tuple[list[str], int, list[Any]]] = []
        for item in matched:
            value_range = item.get("valueRange", {})
            values = value_range.get("values", [])
            if any("a1Range" in f for f in item.get("dataFilters", [])):
                columns = Snapshot.from_values(values[:1]).columns if values else None
            owners = [
                str(f["developerMetadataLookup"].get("metadataValue", ""))
                for f in item.get("dataFilters", [])
                if "developerMetadataLookup" in f
            ]
            number = anchors.row_number(value_range.get("range", ""))
            if owners and number is not None:
                found.append((owners, number, values[0] if values else []))
        if columns is None:
            return None, {}
        self.queue.remember_columns(columns)
        rows: dict[str, list[Row]] = {}
        for owners, number, raw in found:
            row = make_row(columns, number, raw)
            for token in owners:
                rows.setdefault(token, []).append(row)
        return columns, rows

    def locate(self, token: str) -> Row | None:
        """The row anchored to ``token`` that carries it, read in one small request; falls back
        to a full read for claims made before row anchors existed."""
        _, rows = self._rows_of(token)
        mine = [r for r in rows if r.token == token]
        return mine[0] if mine else self.queue.find(token)

    def write(self, columns: ColumnMap, updates: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
        """One ``values.batchUpdateByDataFilter``: each token's fields into the row its anchor is on.

        RAW, so ``=1+1`` stays text; idempotent, so it is safe to repeat.
        """
        data = []
        for token, fields in updates:
            cells = {columns[k]: v for k, v in fields.items() if columns.has(k)}
            if cells:
                width = max(cells) + 1
                data.append((anchors.lookup(token), [anchors.row_values(width, cells)]))
        if not data:
            return {}
        return self.queue.idempotent(lambda: self.queue.transport.write_by_filter(data))

    def _drop_strays(self, token: str) -> None:
        """Delete ``token``'s anchors on rows that do not carry ``token`` (by metadata id, so rows
        moving meanwhile cannot make us delete the wrong one)."""
        found = self.queue.idempotent(lambda: self.queue.transport.search_metadata([anchors.lookup(token)]))
        ids = [int(m["metadataId"]) for m in found if "metadataId" in m]
        if not ids:
            return
        header = {"a1Range": f"{a1_sheet(self.queue.sheet)}!1:1"}
        matched = self.queue.idempotent(
            lambda: self.queue.transport.read_by_filter([header, *(anchors.by_id(i) for i in ids)])
        )
        columns = None
        for item in matched:
            if any("a1Range" in f for f in item.get("dataFilters", [])):
                columns = Snapshot.from_values(item.get("valueRange", {}).get("values", [])[:1]).columns
        if columns is None:
            return
        doomed = []
        for item in matched:
            values = item.get("valueRange", {}).get("values", [])
            row = make_row(columns, 0, values[0] if values else [])
            for f in item.get("dataFilters", []):
                metadata_id = f.get("developerMetadataLookup", {}).get("metadataId")
                if metadata_id is not None and row.token != token:
                    doomed.append(anchors.delete(anchors.by_id(int(metadata_id))))
        if doomed:
            log.warning("removing %d anchors of %s from rows that do not carry it", len(doomed), token)
            self.queue.cleanup(doomed)

    def _adopt(self, token: str) -> bool:
        """Anchor ``token`` to the row carrying it (a claim made before row anchors existed).

        The anchor and a guard on that row's status cell go in one atomic batch: if the guard
        did not match (rows moved), the new anchor is deleted again by its id.
        """
        snapshot = self.queue.snapshot()
        rows = snapshot.rows_with_token(token)
        if not rows or snapshot.columns is None:
            return False
        row = rows[0]
        guard = find_replace(
            self.queue.cell(row.number, snapshot.columns["status"]), row.status_cell.raw, row.status_cell.raw
        )
        replies = self.queue.backoff.call(
            lambda: self.queue.transport.batch_update(
                [guard, anchors.create(self.queue.sheet_id(), row.number, token)]
            )
        )
        if occurrences(replies[0]) == 1:
            return True
        created = anchors.created_id(replies[1]) if len(replies) > 1 else None
        if created is not None:
            self.queue.cleanup([anchors.delete(anchors.by_id(created))])
        return False

    def write_fields(
        self,
        token: str,
        fields: dict[str, str],
        attempts: int = 3,
        check: Callable[[Row], None] | None = None,
    ) -> Row:
        """Write ``fields`` (column -> text, stored RAW, never as a formula) into the row of ``token``.

        The write goes through the row's anchor (``values.batchUpdateByDataFilter`` on the
        ``onceflow.claim = token`` metadata), so it reaches that row wherever it has moved; one read
        before it (header and row, by the same anchor) checks the row still carries the token and
        skips a write that is already there. Costs 1 read + 1 write.

        :param check: called with the row as read, before anything is written; whatever it raises
            aborts the write (a caller's own check of the row costs no extra read this way).
        :raises LookupError: no row carries the token (e.g. the editor deleted it).
        :raises RuntimeError: the anchor could not be settled in ``attempts`` tries.
        """
        for _ in range(attempts):
            columns, rows = self._rows_of(token)
            if columns is None:
                raise LookupError(f"no row carries claim token {token!r}: the sheet has no header")
            mine = [r for r in rows if r.token == token]
            if len(mine) != len(rows):  # an anchor on a row that lost the token: drop it first
                self._drop_strays(token)
                continue
            if not rows:
                if self._adopt(token):
                    continue
                raise LookupError(f"no row carries claim token {token!r}")
            if check is not None:
                check(mine[0])
            wanted = {k: v for k, v in fields.items() if columns.has(k)}
            if all(mine[0].get(k) == v for k, v in wanted.items()):
                return mine[0]
            reply = self.write(columns, [(token, wanted)])
            written = []
            for response in reply.get("responses", []):
                data = response.get("updatedData", {})
                number = anchors.row_number(data.get("range", response.get("updatedRange", "")))
                values = data.get("values", [])
                written.append(make_row(columns, number or 0, values[0] if values else []))
            if written and all(r.token == token for r in written):
                if written[0].status in FINAL_STATUSES:
                    # a repair of a finished row (reconcile's reason or run_id): it needs no
                    # anchor after this, and an adopted one would otherwise stay for good
                    self.queue.cleanup([anchors.delete(anchors.lookup(token))])
                return written[0]
            log.warning("row of %s changed while writing %s; checking again", token, sorted(fields))
        raise RuntimeError(f"could not write {sorted(fields)} into the row of token {token!r}")


def sweep_anchors(queue: QueueTab, released: Collection[str] = ()) -> int:
    """Delete this tab's claim anchors whose token is on no row in flight (PROCESSING or
    NEEDS_REVIEW); return how many.

    :param released: tokens of PROCESSING rows whose anchors may go too, because nothing will
        write through them any more (``sheet_reconcile`` passes rows whose run has succeeded
        while no article chain finishes rows yet; a later write to such a row, a recheck's, adopts
        a fresh anchor).

    The search comes **before** the read: an anchor is created in the same atomic batch as its
    token's claim, so every anchor found had its token in the sheet before the read, and a token
    the read does not show PROCESSING is final, gone or overwritten, never a claim in flight.
    Deletion is by ``metadataId``, so it removes exactly the entries judged. Costs 2 reads, plus
    1 write when there is something to delete.
    """
    found = queue.search_anchors()
    if not found:
        return 0
    live = {
        token
        for token, rows in queue.snapshot().by_token().items()
        if any(r.status in IN_FLIGHT_STATUSES for r in rows)
    } - set(released)
    sheet_id = queue.sheet_id()
    doomed = [
        int(m["metadataId"])
        for m in found
        if "metadataId" in m
        and m.get("metadataValue") not in live
        and m.get("location", {}).get("dimensionRange", {}).get("sheetId", 0) == sheet_id
    ]
    if doomed:
        log.info("removing %d row anchors of rows no longer in flight", len(doomed))
        queue.cleanup([anchors.delete(anchors.by_id(i)) for i in doomed])
    return len(doomed)
