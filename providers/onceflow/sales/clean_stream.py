"""Cleaning a day of any size in bounded memory: :mod:`onceflow.sales.clean`'s rules, bucket by bucket.

:func:`onceflow.sales.clean.clean_orders` holds the whole day in pandas (about 1.5 kB a source
row). :class:`DayCleaner` applies the same rules (:mod:`onceflow.sales.clean_rules`, plain Python:
no pandas in the clean task) to pieces of the day that each hold everything a rule compares,
spilling the rest to local files (Arrow IPC, lz4) in a temporary folder:

1. **Rows, batch by batch** (as the extract's parquet row groups are read): each batch is checked
   with :func:`~onceflow.sales.clean_rules.reject_reason` (a reason depends on the row alone);
   malformed rows become rejects, valid rows are spilled into buckets by a hash of their event key
   (a sale's order id, a refund's refund id), so all rows sharing a key share a bucket.
2. **Dedupe, bucket by bucket**: :func:`~onceflow.sales.clean_rules.dedupe` on one bucket is
   :func:`~onceflow.sales.clean_rules.dedupe` on the day restricted to that bucket's keys (the winner
   of a key, its conflicts and its exact repeats depend only on the rows under that key).
   Conflicts become rejects; winners are spilled again, into buckets by **ranges of order id**
   (boundaries from a sample of order ids taken in step 1).
3. **Net per order, bucket by bucket**: :func:`~onceflow.sales.clean_rules.net_per_order` on one
   bucket holds every event of its orders; the buckets' ranges follow each other, so their outputs
   one after the other are the day's rows sorted by order id.
4. **Rejects**: each batch's malformed rows and each bucket's conflicts are runs sorted by source
   row id, merged into one sorted stream (at most :data:`MERGE_FAN_IN` runs at a time).

A day that fits in one bucket (the extract's row count at most :data:`BUCKET_ROWS`, most days of most
shops) is not spilled at all: its rows are read from Arrow once and stay Python rows through the
steps above, which is the same clean with one bucket (no spill files, one conversion instead of
three, and no ``pyarrow.compute``: 0.06 s of CPU to import in a task process).

Memory holds one read batch, one bucket (about :data:`BUCKET_ROWS` rows, as Python rows) and the order-id sample,
whatever the day's size; the spill files take about the extract's size twice on local disk
(``$TMPDIR``). One key or order with more rows than a bucket is not split (a bucket holds every
row of its keys), so such a day needs that bucket's memory. The output is the same as
:func:`~onceflow.sales.clean.clean_orders`'s (``tests/unit/test_sales_clean_stream.py`` compares
them on generated days), for source row ids that are unique, as the shop's primary key makes them.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import math
import operator
import os
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from onceflow.sales import arrow_values
from onceflow.sales.clean_rules import (
    RATES_TO_EUR,
    TEXT_COLUMNS,
    Reject,
    Row,
    SalesRow,
    dedupe_positions,
    event_key,
    net_per_order,
    reject,
    reject_reason,
)
from onceflow.sales.schema import ORDER_COLUMNS, sales_arrow_schema

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Sequence

    import numpy as np
    import pandas as pd
    import pyarrow as pa

#: rows per bucket: the most a rule holds in Python rows at once (plus one read batch).
BUCKET_ROWS = 50_000
#: spilled rows buffered before they are written out, one record batch per bucket.
FLUSH_ROWS = 200_000
#: runs of rejects merged at once (more runs are merged in passes).
MERGE_FAN_IN = 64
#: rows per record batch of a reject run (a merge holds one batch per run).
RUN_BATCH_ROWS = 4_096
#: order ids sampled per order bucket to place the ranges' boundaries.
SAMPLE_PER_BUCKET = 200

_ROW_ID = operator.attrgetter("row_id")
_SOURCE_ROW_ID = operator.attrgetter("source_row_id")


def extract_frame(table: pa.Table) -> pd.DataFrame:
    """Staged extract rows as the cleaning rules take them: text as ``str`` (stray bytes as lone
    surrogates, as the shop read them) or None, in object columns (for the pandas reference,
    :func:`onceflow.sales.staging.read_extract`; the clean task reads :func:`extract_rows`)."""
    import pandas as pd
    import pyarrow as pa

    frame = table.drop_columns([c for c in TEXT_COLUMNS if c in table.column_names]).to_pandas()
    for col in TEXT_COLUMNS:
        if col not in table.column_names:
            continue
        column = table.column(col)
        try:  # valid UTF-8 (every valid row): decoded by Arrow, as "surrogateescape" decodes it
            values = column.cast(pa.string()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            values = [
                v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v
                for v in column.to_pylist()
            ]
        frame[col] = pd.Series(values, index=frame.index, dtype=object)
    return frame.loc[:, table.column_names]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cycle collector off while rules run: they make hundreds of thousands of small tuples
    (no cycles among them), and its passes over them cost a third of the clean's CPU (1.0 of
    3.0 s at 130,000 rows)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def extract_rows(table: pa.Table) -> list[Row]:
    """Staged extract rows (columns :data:`ORDER_COLUMNS`) as :class:`~onceflow.sales.clean_rules.Row`
    values: text as ``str`` (stray bytes as lone surrogates, as the shop read them) or None."""
    columns: list[list[Any]] = []
    for name in ORDER_COLUMNS:
        column = table.column(name)
        if name in TEXT_COLUMNS:
            columns.append(arrow_values.texts(column))
        elif name.endswith("_utc"):
            columns.append(arrow_values.datetimes(column))
        else:
            columns.append(arrow_values.int64_values(column).tolist())
    return list(map(Row._make, zip(*columns, strict=True)))


def _columns(rows: Sequence[tuple[Any, ...]], fields: Sequence[str]) -> list[list[Any]]:
    """``rows`` as one list per field (as many empty lists as ``fields`` for no rows)."""
    return [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in fields]


def reject_table(rejects: Sequence[Reject]) -> pa.Table:
    """Rejects as an Arrow table of :func:`reject_schema`."""
    import pyarrow as pa

    ids, order_ids, reasons, raws = _columns(rejects, Reject._fields)
    arrays = [
        arrow_values.int64s(ids),
        arrow_values.strings(order_ids),
        arrow_values.strings(reasons),
        arrow_values.strings(raws),
    ]
    return pa.Table.from_arrays(arrays, schema=reject_schema())


def sales_rows_table(rows: Sequence[SalesRow]) -> pa.Table:
    """Sales rows as an Arrow table of :func:`~onceflow.sales.schema.sales_arrow_schema`."""
    import pyarrow as pa

    values = dict(zip(SalesRow._fields, _columns(rows, SalesRow._fields), strict=True))
    arrays = [
        arrow_values.dates(values["partition_date"]),
        arrow_values.strings(values["order_id"]),
        arrow_values.strings(values["customer_id"]),
        arrow_values.strings(values["source_currency"]),
        arrow_values.int64s(values["gross_cents"]),
        arrow_values.int64s(values["refund_cents"]),
        arrow_values.int64s(values["net_cents"]),
        arrow_values.int64s(values["event_count"]),
        arrow_values.timestamps_us(values["first_event_utc"]),
    ]
    return pa.Table.from_arrays(arrays, schema=sales_arrow_schema())


def _row_id_order(table: pa.Table) -> Any:
    """The positions that put ``table``'s rows in row id order (stable), as an Arrow array."""
    import numpy as np

    return arrow_values.indices(np.argsort(arrow_values.int64_values(table.column("row_id")), kind="stable"))


def _bucket_of_keys(keys: Sequence[str], buckets: int) -> np.ndarray:
    """A bucket per event key (a stable hash: the same key, the same bucket, in every process)."""
    import numpy as np

    return np.fromiter(
        (zlib.crc32(k.encode("utf-8", "surrogatepass")) % buckets for k in keys),
        dtype=np.int64,
        count=len(keys),
    )


def reject_schema() -> pa.Schema:
    """The Arrow schema of staged rejects."""
    import pyarrow as pa

    return pa.schema(
        [
            ("source_row_id", pa.int64()),
            ("order_id", pa.string()),
            ("reason", pa.string()),
            ("raw", pa.string()),
        ]
    )


class _Spill:
    """Record batches appended to one Arrow IPC file (lz4) and read back by number."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        import pyarrow as pa

        self.path = path
        self.schema = schema.remove_metadata()
        options = pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None)
        self._sink = pa.OSFile(path, "wb")
        self._writer: Any = pa.ipc.new_file(self._sink, self.schema, options=options)
        self._reader: Any = None
        self._source: Any = None
        self.batches = 0

    def write(self, table: pa.Table, max_rows: int | None = None) -> list[int]:
        """Append ``table``; returns the numbers of the record batches it became."""
        numbers = []
        for batch in table.cast(self.schema).combine_chunks().to_batches(max_chunksize=max_rows):
            self._writer.write_batch(batch)
            numbers.append(self.batches)
            self.batches += 1
        return numbers

    def read(self, number: int) -> pa.RecordBatch:
        """Record batch ``number`` (the file is closed for writing at the first read)."""
        import pyarrow as pa

        if self._reader is None:
            self._writer.close()
            self._sink.close()
            self._source = pa.OSFile(self.path, "rb")  # plain reads: no mapped pages in the RSS
            self._reader = pa.ipc.open_file(self._source)
        return self._reader.get_batch(number)

    def table(self, numbers: list[int]) -> pa.Table:
        """Record batches ``numbers`` as one table (of the spill's schema when there are none)."""
        import pyarrow as pa

        return pa.Table.from_batches([self.read(n) for n in numbers], schema=self.schema)

    def close(self) -> None:
        """Close and delete the file."""
        if self._reader is None:
            self._writer.close()
            self._sink.close()
        else:
            self._source.close()
        os.unlink(self.path)


class _Buckets:
    """Rows spilled into ``count`` buckets, each read back whole (:meth:`read`)."""

    def __init__(self, path: str, count: int, schema: pa.Schema) -> None:
        self.count = count
        self._spill = _Spill(path, schema)
        self._pending: list[list[pa.Table]] = [[] for _ in range(count)]
        self._pending_rows = 0
        self._numbers: list[list[int]] = [[] for _ in range(count)]
        self.sizes = [0] * count

    def add(self, table: pa.Table, bucket: np.ndarray) -> None:
        """Add row ``i`` of ``table`` to bucket ``bucket[i]`` (each bucket keeps the rows' order)."""
        import numpy as np

        if not len(table):
            return
        order = np.argsort(bucket, kind="stable")
        ids = bucket[order]
        table = table.take(arrow_values.indices(order))
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            b = int(ids[start])
            self._pending[b].append(table.slice(start, end - start))
            self.sizes[b] += end - start
        self._pending_rows += len(table)
        if self._pending_rows >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        for b, pieces in enumerate(self._pending):
            if pieces:
                self._numbers[b] += self._spill.write(pa.concat_tables(pieces))
                pieces.clear()
        self._pending_rows = 0

    def read(self, b: int) -> pa.Table:
        """Every row of bucket ``b``, in the order added."""
        if self._pending_rows:
            self._flush()
        return self._spill.table(self._numbers[b])

    def close(self) -> None:
        """Delete the spill file."""
        self._spill.close()


class _Runs:
    """Reject rows as runs sorted by source row id, merged into one sorted stream (:meth:`merged`)."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._spill = _Spill(os.path.join(folder, "rejects.arrow"), reject_schema())
        self._runs: list[list[int]] = []
        self._open_run_last: int | None = None  # the last key of the run a batch may extend

    def add(self, rejects: pa.Table, *, extend: bool) -> None:
        """Add ``rejects`` (sorted by source row id) as a run, or onto the last run when ``extend``
        and they follow it (the malformed rows of an extract read in row-id order form one run)."""
        if not len(rejects):
            return
        keys = arrow_values.int64_values(rejects.column("source_row_id"))
        if (keys[1:] < keys[:-1]).any():
            raise ValueError("a run of rejects must be sorted by source row id")
        numbers = self._spill.write(rejects, RUN_BATCH_ROWS)
        if extend and self._open_run_last is not None and keys[0] >= self._open_run_last:
            self._runs[-1] += numbers
        else:
            self._runs.append(numbers)
        self._open_run_last = int(keys[-1]) if extend else None

    def merged(self) -> Iterator[pa.Table]:
        """Every reject, sorted by source row id (ties: in the order added), in tables of a few thousand."""
        spill, runs, passes = self._spill, self._runs, 0
        while len(runs) > MERGE_FAN_IN:  # merge in passes: memory holds MERGE_FAN_IN batches
            passes += 1
            target = _Spill(os.path.join(self._folder, f"rejects.{passes}.arrow"), reject_schema())
            merged_runs = []
            for i in range(0, len(runs), MERGE_FAN_IN):
                numbers: list[int] = []
                for table in _merge(spill, runs[i : i + MERGE_FAN_IN]):
                    numbers += target.write(table, RUN_BATCH_ROWS)
                merged_runs.append(numbers)
            if spill is not self._spill:
                spill.close()
            spill, runs = target, merged_runs
        yield from _merge(spill, runs)
        if spill is not self._spill:
            spill.close()

    def close(self) -> None:
        """Delete the spill file."""
        self._spill.close()


def _merge(spill: _Spill, runs: list[list[int]]) -> Iterator[pa.Table]:
    """The rows of sorted ``runs`` in one sorted stream (stable: ties in run order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    cursors = [iter(run) for run in runs]
    heads: list[pa.Table | None] = [None] * len(runs)

    def refill(i: int) -> None:
        number = next(cursors[i], None)
        heads[i] = None if number is None else pa.Table.from_batches([spill.read(number)])

    for i in range(len(runs)):
        refill(i)
    while True:
        live = [i for i, head in enumerate(heads) if head is not None]
        if not live:
            return
        keys = {i: arrow_values.int64_values(heads[i].column("source_row_id")) for i in live}  # type: ignore[union-attr]
        # Every row at or below the smallest last key of the heads: no later batch holds a smaller one.
        threshold = min(int(k[-1]) for k in keys.values())
        taken = []
        for i in live:
            head = heads[i]
            assert head is not None
            cut = int(np.searchsorted(keys[i], threshold, side="right"))
            taken.append(head.slice(0, cut))
            if cut == len(head):
                refill(i)
            else:
                heads[i] = head.slice(cut)
        table = pa.concat_tables(taken)
        if not len(table):  # cannot happen with sorted runs: the head ending at the threshold moves
            raise RuntimeError("merging rejects made no progress: a run is not sorted")
        yield table.take(pc.sort_indices(table, [("source_row_id", "ascending")]))


class DayCleaner:
    """One day's source rows in, :func:`~onceflow.sales.clean.clean_orders`'s result out, in
    bounded memory (see the module docstring).

    Use: :meth:`add` each batch of source rows, :meth:`dedupe` once, then :meth:`rows` and
    :meth:`rejects` (each once: a second call raises), and :meth:`close` (or use it as a context
    manager; closing again does nothing).

    :param partition: the business-local day, written into every output row.
    :param expected_rows: the day's source row count (sizes the buckets; a wrong guess costs
        memory or files, never correctness).
    :param workdir: an existing folder for the spill files (a temporary one, deleted by the caller).
    :param bucket_rows: rows per bucket (tests make it small to get many buckets).
    """

    def __init__(
        self,
        *,
        partition: dt.date,
        expected_rows: int,
        workdir: str,
        reporting_currency: str = "EUR",
        bucket_rows: int = BUCKET_ROWS,
    ) -> None:
        if reporting_currency not in RATES_TO_EUR:
            raise ValueError(
                f"unknown reporting currency {reporting_currency!r}; known: {sorted(RATES_TO_EUR)}"
            )
        self.partition = partition
        self.reporting_currency = reporting_currency
        self._workdir = workdir
        self._buckets = max(1, math.ceil(expected_rows / bucket_rows))
        self._events: _Buckets | None = None
        self._orders: _Buckets | None = None
        # One bucket: the day stays in memory as Python rows (valid rows, then the winners; rejects).
        self._in_memory = self._buckets == 1
        self._valid: list[Row] = []
        self._winners: list[Row] = []
        self._memory_rejects: list[Reject] = []
        self._rejects: _Runs | None = None if self._in_memory else _Runs(workdir)
        self._sample: list[str] = []
        self._stride = max(1, expected_rows // (self._buckets * SAMPLE_PER_BUCKET))
        self._valid_seen = 0
        self._deduped = False
        self._read: set[str] = set()  # of "rows" and "rejects": each is read once
        #: source rows read, exact repeats dropped, rejects by reason, output rows.
        self.source_rows = 0
        self.duplicates_dropped = 0
        self.reasons: collections.Counter[str] = collections.Counter()
        self.row_count = 0

    def __enter__(self) -> DayCleaner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_once(self, step: str) -> None:
        """Refuse a step before :meth:`dedupe` or a second time: the one-bucket path hands its rows
        over as it yields them and would yield nothing again, the spilled one everything twice."""
        if not self._deduped:
            raise RuntimeError(f"{step}() before dedupe()")
        if step in self._read:
            raise RuntimeError(f"{step}() runs once")
        self._read.add(step)

    @property
    def reject_count(self) -> int:
        """Rejected source rows so far (malformed, and conflicting once :meth:`dedupe` ran)."""
        return sum(self.reasons.values())

    @_gc_paused()
    def add(self, batch: pa.Table | pa.RecordBatch) -> None:
        """Step 1 for one batch of source rows (columns of ``orders``, as the extract stages them)."""
        import pyarrow as pa

        if self._deduped:
            raise RuntimeError("add() after dedupe()")
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        table = table.select(list(ORDER_COLUMNS))
        if not len(table):
            return
        if self._in_memory:  # sorted by row id once, in dedupe()
            self._add_in_memory(extract_rows(table))
            return
        assert self._rejects is not None
        table = table.take(_row_id_order(table))
        rows = extract_rows(table)
        positions, bad = self._sort_out(rows)
        if bad:
            self._rejects.add(reject_table(bad), extend=True)
        if not positions:
            return
        valid = [rows[i] for i in positions]
        if self._events is None:
            path = os.path.join(self._workdir, "events.arrow")
            self._events = _Buckets(path, self._buckets, table.schema)
        keys = [event_key(r) for r in valid]
        self._events.add(table.take(arrow_values.indices(positions)), _bucket_of_keys(keys, self._buckets))
        first = (-self._valid_seen) % self._stride  # the sample takes every stride-th valid row of the day
        self._sample += [str(r.order_id) for r in valid[first :: self._stride]]
        self._valid_seen += len(valid)

    @_gc_paused()
    def add_rows(self, rows: list[Row]) -> None:
        """Step 1 for source rows already read as Python rows (a day staged as text), on a day held
        in memory; a spilled day takes Arrow batches (:meth:`add`)."""
        if self._deduped:
            raise RuntimeError("add_rows() after dedupe()")
        if not self._in_memory:
            raise RuntimeError("add_rows() on a day that spills: add Arrow batches with add()")
        self._add_in_memory(rows)

    def _add_in_memory(self, rows: list[Row]) -> None:
        positions, bad = self._sort_out(rows)
        self._valid += [rows[i] for i in positions]
        self._memory_rejects += bad

    def _sort_out(self, rows: list[Row]) -> tuple[list[int], list[Reject]]:
        """Step 1's rule on source ``rows``, counted: ``(positions of the valid rows, rejects)``."""
        self.source_rows += len(rows)
        reasons = [reject_reason(row) for row in rows]
        bad = [reject(row, why) for row, why in zip(rows, reasons, strict=True) if why is not None]
        self.reasons.update(r.reason for r in bad)
        return [i for i, why in enumerate(reasons) if why is None], bad

    def _dedupe_bucket(self, valid: list[Row]) -> tuple[list[int], list[Reject]]:
        """Step 2's rule on one bucket's ``valid`` rows (row id order), counted: ``(positions of
        the winners, rejects of the conflicting rows)``; a reason is counted only with a reject."""
        winners, conflicting, repeats = dedupe_positions(valid)
        self.duplicates_dropped += repeats
        conflicts = [reject(valid[i], "conflicting_duplicate") for i in conflicting]
        if conflicts:
            self.reasons["conflicting_duplicate"] += len(conflicts)
        return winners, conflicts

    def _net_rows(self, events: list[Row]) -> list[SalesRow]:
        """Step 3's rule on every event of some orders, counted: their sales rows."""
        with _gc_paused():
            rows = net_per_order(events, self.partition, self.reporting_currency)
            self.row_count += len(rows)
            return rows

    def _net_table(self, events: list[Row]) -> pa.Table:
        """:meth:`_net_rows` as Arrow."""
        return sales_rows_table(self._net_rows(events))

    @_gc_paused()
    def dedupe(self) -> None:
        """Step 2: every bucket of events deduplicated; conflicts to the rejects, winners by order range."""
        if self._deduped:
            raise RuntimeError("dedupe() runs once")
        self._deduped = True
        if self._in_memory:
            # Row id order (stable), as the one bucket is read back sorted in the spilled path.
            valid = sorted(self._valid, key=_ROW_ID)
            self._valid = []
            winners, conflicts = self._dedupe_bucket(valid)
            self._memory_rejects += conflicts
            self._winners = [valid[i] for i in winners]
            return
        if self._events is None:
            return
        import numpy as np

        assert self._rejects is not None
        sample = sorted(set(self._sample))
        self._sample = []
        count = min(self._buckets, max(1, len(sample)))
        boundaries = np.array(
            [sample[len(sample) * i // count] for i in range(1, count)], dtype=object
        )  # sorted; equal neighbours only make an empty bucket
        self._orders = _Buckets(
            os.path.join(self._workdir, "orders.arrow"), count, self._events._spill.schema
        )
        for b in range(self._events.count):
            table = self._events.read(b)
            if not len(table):
                continue
            table = table.take(_row_id_order(table))
            valid = extract_rows(table)
            winners, conflicts = self._dedupe_bucket(valid)
            if conflicts:
                self._rejects.add(reject_table(conflicts), extend=False)
            order_ids = np.array([valid[i].order_id for i in winners], dtype=object)
            bucket = np.searchsorted(boundaries, order_ids, side="right").astype(np.int64)
            self._orders.add(table.take(arrow_values.indices(winners)), bucket)
        self._events.close()
        self._events = None

    def rows(self) -> Iterator[pa.Table]:
        """Step 3: the day's rows (an Arrow table of
        :func:`~onceflow.sales.schema.sales_arrow_schema`), sorted by order id, one table per
        non-empty bucket."""
        if self._in_memory:
            rows = self.sales_rows()
            if rows:
                yield sales_rows_table(rows)
            return
        self._read_once("rows")
        if self._orders is None:
            return
        for b in range(self._orders.count):
            table = self._orders.read(b)
            if len(table):
                yield self._net_table(extract_rows(table))

    def rejects(self) -> Iterator[pa.Table]:
        """Step 4: every reject (columns :data:`REJECT_COLUMNS`), sorted by source row id."""
        if self._in_memory:
            rejects = self.reject_rows()
            for start in range(0, len(rejects), RUN_BATCH_ROWS):
                yield reject_table(rejects[start : start + RUN_BATCH_ROWS])
            return
        self._read_once("rejects")
        assert self._rejects is not None
        yield from self._rejects.merged()

    @property
    def in_memory(self) -> bool:
        """Whether the day is held in memory (one bucket): :meth:`sales_rows` and :meth:`reject_rows` then serve."""
        return self._in_memory

    def sales_rows(self) -> list[SalesRow]:
        """:meth:`rows` of a day held in memory as Python rows (what a day staged as text writes)."""
        if not self._in_memory:
            raise RuntimeError("sales_rows() on a day that spilled: read rows() instead")
        self._read_once("rows")
        winners, self._winners = self._winners, []
        return self._net_rows(winners) if winners else []

    def reject_rows(self) -> list[Reject]:
        """:meth:`rejects` of a day held in memory as Python rows, sorted by source row id."""
        if not self._in_memory:
            raise RuntimeError("reject_rows() on a day that spilled: read rejects() instead")
        self._read_once("rejects")
        # Source row ids are unique (the shop's key): a stable sort is the spilled path's merge.
        rejects, self._memory_rejects = sorted(self._memory_rejects, key=_SOURCE_ROW_ID), []
        return rejects

    def close(self) -> None:
        """Delete the spill files (the caller deletes ``workdir``)."""
        for spill in (self._events, self._orders, self._rejects):
            if spill is not None:
                spill.close()
        self._events = self._orders = self._rejects = None
