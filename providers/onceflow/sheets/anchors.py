"""Row anchors: developer metadata ``onceflow.claim = <token>`` on the row a claim took.

Google keeps row-anchored developer metadata on its row when rows are inserted, deleted or sorted,
and deletes it with the row. A ``values.batchUpdateByDataFilter`` keyed by a
``developerMetadataLookup`` therefore writes into the row the claim took, wherever that row is when
the write is applied: no position is ever computed on the client. These helpers build the
requests and read the replies; :mod:`onceflow.sheets.protocol` decides when to use them.
"""

from __future__ import annotations

import re
from typing import Any

#: metadata key of a claim's row anchor; the value is the claim token
CLAIM_KEY = "onceflow.claim"

_ROW_RE = re.compile(r"![A-Z]*(\d+)")


def lookup(token: str) -> dict[str, Any]:
    """The DataFilter selecting the row anchored to ``token`` (wherever it is now)."""
    return {"developerMetadataLookup": {"metadataKey": CLAIM_KEY, "metadataValue": token}}


def by_id(metadata_id: int) -> dict[str, Any]:
    """The DataFilter selecting the one metadata entry (and its row) with that id."""
    return {"developerMetadataLookup": {"metadataId": metadata_id}}


def create(sheet_id: int, row_number: int, token: str) -> dict[str, Any]:
    """A ``createDeveloperMetadata`` request anchoring ``token`` to 1-based ``row_number``.

    Put it in the same ``batchUpdate`` as the ``findReplace`` aimed at the same row: the batch is
    applied atomically and in order, so both reach the same row, whichever row is there then.
    """
    return {
        "createDeveloperMetadata": {
            "developerMetadata": {
                "metadataKey": CLAIM_KEY,
                "metadataValue": token,
                "location": {
                    "dimensionRange": {
                        "sheetId": sheet_id,
                        "dimension": "ROWS",
                        "startIndex": row_number - 1,
                        "endIndex": row_number,
                    }
                },
                "visibility": "DOCUMENT",
            }
        }
    }


def delete(data_filter: dict[str, Any]) -> dict[str, Any]:
    """A ``deleteDeveloperMetadata`` request (deleting what is already gone is not an error)."""
    return {"deleteDeveloperMetadata": {"dataFilter": data_filter}}


def created_id(reply: dict[str, Any]) -> int | None:
    """The metadataId in a ``createDeveloperMetadata`` reply."""
    meta = reply.get("createDeveloperMetadata", {}).get("developerMetadata", {})
    return int(meta["metadataId"]) if "metadataId" in meta else None


def row_number(a1: str) -> int | None:
    """1-based first row of an A1 range such as ``queue!A5:Z5`` or ``'My tab'!A5:Z5``."""
    match = _ROW_RE.search("!" + a1.rsplit("!", 1)[-1])
    return int(match.group(1)) if match else None


def row_values(columns_width: int, fields: dict[int, str]) -> list[Any]:
    """One row segment from column A: our values at their columns, ``None`` (skip) elsewhere.

    A DataFilter on a row metadata selects the whole row and the write starts at its first cell;
    ``null`` cells are skipped (Google: "Null values will be skipped"), so the editor's cells and
    every other cell of the row stay as they are.
    """
    out: list[Any] = [None] * columns_width
    for index, value in fields.items():
        out[index] = value
    return out
