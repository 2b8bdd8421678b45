"""The clean task's rules on plain Python rows (``clean_rules``) reject what the pandas reference
(``clean.clean_orders``) rejects, value by value, with the same reject rows.

Each awkward value goes into each text column of an otherwise valid row: every character Python's
``str.strip()`` strips (``\\x1c``-``\\x1f``, ``\\x85``, no-break and em spaces...) and every
Unicode decimal digit, around and inside amounts and ids; NUL and stray bytes (lone surrogates)
in every column; ids of exactly the column width and one more, in characters of one to four UTF-8
bytes; amounts written every way (``+1.00``, ``1.``, ``.5``, ``1e3``, ``00012.30``). The
reference runs pandas' own string methods (pyarrow strings), so a rule restated in Python that
strips, matches or counts otherwise differs here."""

from __future__ import annotations

import datetime as dt
import sys
import unicodedata

import pandas as pd

from onceflow.sales import clean
from onceflow.sales.clean_rules import TEXT_COLUMNS, Row, reject, reject_reason
from onceflow.sales.schema import ID_LENGTH, ORDER_COLUMNS

T = dt.datetime(2024, 10, 27, 12)
CHARS = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
SPACES = [c for c in CHARS if c.isspace() or not c.strip()]
DIGITS = [c for c in CHARS if unicodedata.category(c) == "Nd"]
IDS = [c * n for c in ("O", "é", "€", "😀") for n in (ID_LENGTH, ID_LENGTH + 1)]
AMOUNTS = ["1.00", "+1.00", "1.", ".5", "00012.30", "1e3", "0", "-0.00", "10.001", "10.0100",
           "999999999999.99", "9999999999999", "1_000", "NaN", "Infinity", "", "None", "nan"]  # fmt: skip
ODD = ["\x00", "a\x00", "\udcff", "x\udc80y", "None", "nan", "", " "]


def awkward_values() -> list[str | None]:
    values: list[str | None] = [None, *IDS, *AMOUNTS, *ODD]
    for c in SPACES:
        values += [c, c * 3, f"{c}1.00{c}", f"{c}O1", f"1{c}5"]
    for c in DIGITS:
        values += [c, f"{c}.5{c}", f"1{c}", f"{c * 13}"]
    return values


def rows() -> list[dict[str, object]]:
    valid = {"order_id": "O1", "event_type": "sale", "refund_id": None, "customer_id": "C1",
             "created_at_utc": T, "ingested_at_utc": T, "amount": "1.00", "currency": "EUR"}  # fmt: skip
    out: list[dict[str, object]] = []
    for column in TEXT_COLUMNS:
        for value in awkward_values():
            row = {**valid, column: value}
            if column == "refund_id":
                row["event_type"] = "refund"  # a refund's id is checked; a sale's is not
            out.append({"row_id": len(out) + 1, **row})
    return out


def test_each_awkward_value_in_each_column_is_rejected_as_the_reference_rejects_it() -> None:
    source = rows()
    frame = pd.DataFrame(
        {
            c: pd.Series([r[c] for r in source], dtype=object if c in TEXT_COLUMNS else None)
            for c in ORDER_COLUMNS
        }
    )
    expected = clean._reject_reasons(frame.astype({"row_id": "int64"})).tolist()
    got = [reject_reason(Row(**r)) for r in source]  # type: ignore[arg-type]
    differ = [
        (source[i], want, have)
        for i, (want, have) in enumerate(zip(expected, got, strict=True))
        if want != have
    ]
    assert not differ, f"{len(differ)} rows differ, e.g. {differ[:3]}"
    # every reason the rows can give alone is among them, and valid rows too
    assert set(got) >= {*clean.REJECT_REASONS[:-1], None}

    # the reject rows themselves: the id as stored, the raw row
    reference = clean.clean_orders(frame, partition=T.date()).rejects
    rejects = [reject(Row(**r), why) for r, why in zip(source, got, strict=True) if why is not None]  # type: ignore[arg-type]
    want = [
        [r["source_row_id"], r["order_id"] if isinstance(r["order_id"], str) else None, r["reason"], r["raw"]]
        for r in reference.to_dict("records")  # a frame holds a missing order id as NaN
        if r["reason"] != "conflicting_duplicate"  # (rows of one key: not a rule of one row)
    ]
    assert len(rejects) > 1000
    assert [list(r) for r in rejects] == want
