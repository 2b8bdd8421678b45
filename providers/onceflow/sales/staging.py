"""Staging files between the extract, clean and load tasks of one daily_sales run.

Layout: ``<base>/<dag_id>/<partition>/<run key>/`` with ``extract.parquet``, ``rows.parquet``,
``rejects.parquet`` and ``manifest.json`` (written last: the folder is complete). The run key is
the run id made path-safe plus a short hash, so two runs of the same partition never share
files, and a retry of a task rewrites its own files.

**A small day is staged as text** (``extract.tsv``, ``rows.tsv``, ``rejects.tsv``;
:mod:`onceflow.sales.text_staging`, which says why): the extract picks the format once it has read
past the shop's first batch, clean writes text for a day held in memory within the limit, and the
manifest's ``format`` tells the load which files to read. Everything said below of the parquet
files' facts holds for the text files' header line.

**Where.** Folders are ``ObjectStoragePath`` objects on connection ``onceflow_storage``
(:meth:`onceflow.hooks.storage.StorageHook.sales_staging`), local files or ``gs://``, so Celery
workers on several hosts share no disk. The base is ``$ONCEFLOW_SALES_STAGING_DIR`` (an absolute
path, a ``file:///`` or a ``gs://`` URI; :func:`base_uri`), else ``<onceflow_storage base>/sales-staging``
(by default ``$AIRFLOW_HOME/onceflow/storage/sales-staging``). XCom carries the folder's URI
(:func:`folder_uri`); a plain path from an older XCom is still read as a local folder.

**What the load needs travels inside the parquet files** (key-value metadata under
:data:`METADATA_KEY`) and is read in the same read as the rows: the extract's **source
watermark** (when it read the shop) and its id in ``extract.parquet``; those plus the partition,
the source row count and the processing version in ``rows.parquet`` and ``rejects.parquet``. Two
tries of one task may overlap on the same folder (a zombie and its retry); each file is replaced
whole (:func:`onceflow.objects.write_object`: locally a temp file of the writer's own, fsync,
rename; on GCS one upload of the parquet bytes, visible only once complete), so a reader gets one
try's rows together with that same try's watermark, never one try's rows with another's. A
writer killed mid-write leaves the previous file or object. ``extract.parquet`` is written batch by
batch (:func:`write_extract_stream`) into a temporary file renamed into place, with the same effect. Rows and rejects from different
extracts are refused (:class:`StagingMismatchError`). The manifest is a summary for people; the
load reads only its ``format`` from it (one it does not know is refused, :class:`StagingFormatError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.files import fsync_dir
from onceflow.objects import (
    StorageUriError,
    is_local,
    parse_storage_uri,
    read_object,
    storage_path,
    uri_of,
    write_object,
)
from onceflow.sales import arrow_values, text_staging
from onceflow.sales.partitions import partition_key, validate_partition
from onceflow.sales.schema import (
    ORDER_COLUMNS,
    ORDER_TEXT_COLUMNS,
    REJECT_COLUMNS,
    SALES_COLUMNS,
    sales_arrow_schema,
)
from onceflow.sales.text_staging import EXTRACT_KINDS, REJECT_KINDS, SALES_KINDS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    import pandas as pd
    from airflow.sdk import ObjectStoragePath

    from onceflow.sales.clean import CleanResult
    from onceflow.sales.shop_query import OrderColumns

    #: a staging folder: an ``ObjectStoragePath`` (from ``StorageHook.path``), or a local path.
    Folder = ObjectStoragePath | Path | str

STAGING_ENV = "ONCEFLOW_SALES_STAGING_DIR"
#: the staging base under ``onceflow_storage``'s ``base`` when :data:`STAGING_ENV` is not set.
STORAGE_SUBFOLDER = "sales-staging"
#: parquet key-value metadata key holding the staged file's JSON facts.
METADATA_KEY = b"onceflow.staging"
#: rows per batch when staged rows stream (parquet row groups, COPY chunks).
BATCH_ROWS = 100_000
#: rows per Arrow batch the load formats and sends as one COPY chunk (about 4 MB of COPY text).
COPY_BATCH_ROWS = 50_000
#: staged rejects per batch the load reads and inserts (each about 1 kB as rows to insert).
REJECT_BATCH_ROWS = 10_000
#: extract rows per batch cleaning reads (the extract's row groups hold 50,000).
EXTRACT_READ_ROWS = 50_000

#: the staged files' names (a day staged as text, :mod:`onceflow.sales.text_staging`, or as parquet).
EXTRACT_TEXT, EXTRACT_PARQUET = "extract.tsv", "extract.parquet"
ROWS_TEXT, REJECTS_TEXT = "rows.tsv", "rejects.tsv"
#: a staged clean's manifest ``format``: its rows and rejects as text or as parquet (the default
#: of a manifest without one, written before text staging).
TEXT_FORMAT, PARQUET_FORMAT = "text", "parquet"


class StagingConfigError(StorageUriError):
    """``ONCEFLOW_SALES_STAGING_DIR`` is not usable; the message names it."""


class StagingMismatchError(RuntimeError):
    """The staged rows and rejects come from different extracts (overlapping tries): re-run clean."""


class StagingFormatError(ValueError):
    """The manifest names a staging format this version does not read (another version cleaned)."""


def _clean_format(folder: ObjectStoragePath, manifest: dict[str, Any]) -> str:
    """The manifest's ``format``: :data:`TEXT_FORMAT`, or :data:`PARQUET_FORMAT` (also when absent,
    a manifest written before text staging).

    :raises StagingFormatError: any other format: the files it names are not read as parquet,
        which an earlier try may have left beside them.
    """
    staged = manifest.get("format", PARQUET_FORMAT)
    if staged not in (TEXT_FORMAT, PARQUET_FORMAT):
        raise StagingFormatError(
            f"{folder}/manifest.json names staging format {staged!r}, which this version does not "
            f"read ({TEXT_FORMAT!r}, {PARQUET_FORMAT!r}): load with the version that cleaned, or "
            "clear the run's clean task"
        )
    return str(staged)


def base_uri(storage_base: Callable[[], str]) -> str:
    """The staging base as a URI: ``$ONCEFLOW_SALES_STAGING_DIR``, else ``<storage_base()>/sales-staging``.

    :param storage_base: ``onceflow_storage``'s ``base`` (called only when the variable is unset).
    :raises StagingConfigError: the variable is neither an absolute path nor a ``file:///`` or
        ``gs://`` URI (a relative path would name a different folder in each worker).
    """
    configured = os.environ.get(STAGING_ENV, "").strip()
    if not configured:
        return f"{storage_base().rstrip('/')}/{STORAGE_SUBFOLDER}"
    if "://" not in configured:
        path = os.path.expanduser(configured)
        if not os.path.isabs(path):
            raise StagingConfigError(
                f"{STAGING_ENV} must be an absolute path or a file:///abs/path or gs://bucket/prefix "
                f"URI, got the relative path {configured!r}"
            )
        return Path(os.path.normpath(path)).as_uri()  # percent-encoded: "%41" stays a literal
    return parse_storage_uri(configured, STAGING_ENV, StagingConfigError)


def run_dir(base: Folder, dag_id: str, partition: dt.date, run_id: str) -> ObjectStoragePath:
    """The staging folder of one run of one partition."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    dag = re.sub(r"[^A-Za-z0-9_.-]", "_", dag_id)
    return storage_path(base) / dag / partition_key(partition) / f"{safe}-{digest}"


def folder_uri(folder: Folder) -> str:
    """The URI naming ``folder`` (``file:///...`` or ``gs://...``): what XCom carries."""
    return uri_of(storage_path(folder))


def _write_parquet(df: pd.DataFrame, path: ObjectStoragePath, facts: dict[str, Any]) -> None:
    """``df`` with ``facts`` in the file's own metadata, serialised in memory, stored whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    metadata = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(facts, sort_keys=True).encode()}
    sink = pa.BufferOutputStream()
    # Row groups of BATCH_ROWS: a streaming reader holds one group, not the day.
    pq.write_table(table.replace_schema_metadata(metadata), sink, row_group_size=BATCH_ROWS)
    write_object(path, sink.getvalue().to_pybytes())


def _read_parquet(path: ObjectStoragePath) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """Rows and facts of a staged file from one read (None: a file staged before the facts)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(read_object(path)))
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    return table.to_pandas(), None if raw is None else json.loads(raw)


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat(sep=" ")


def _parse(value: str | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


@dataclasses.dataclass(frozen=True)
class StagedExtract:
    """The extracted source rows and, from the same file, when that extract read the shop."""

    frame: pd.DataFrame
    #: the shop's clock when the read began (naive UTC); None for a file staged without it.
    source_watermark_utc: dt.datetime | None
    #: unique per extract try: pairs clean output with the extract it came from.
    extract_id: str | None


def write_extract(
    folder: Folder, frame: pd.DataFrame, *, source_watermark_utc: dt.datetime | None = None
) -> ObjectStoragePath:
    """Store the extracted source rows (columns of ``orders``) with when they were read.

    :param source_watermark_utc: the shop's clock when the read began (naive UTC), from
        :meth:`onceflow.hooks.warehouse.ShopDbHook.read_interval_snapshot`. The load refuses to
        replace a partition with an extract older than the one it holds.
    """
    path, _rows = write_extract_stream(folder, [frame], source_watermark_utc=source_watermark_utc)
    return path


def _extract_schema(facts: dict[str, Any]) -> Any:
    import pyarrow as pa

    fields = [
        pa.field(
            c, pa.int64() if c == "row_id" else pa.timestamp("us") if c.endswith("_utc") else pa.binary()
        )
        for c in ORDER_COLUMNS
    ]
    return pa.schema(fields, metadata={METADATA_KEY: json.dumps(facts, sort_keys=True).encode()})


def _extract_batch(batch: OrderColumns | pd.DataFrame, schema: Any) -> Any:
    """One batch of extracted rows (the shop query's columns, or a frame) as an Arrow table of
    the staged schema. The columns go to Arrow directly: the extract task never imports pandas."""
    import pyarrow as pa

    columns = []
    for col in ORDER_COLUMNS:
        values = batch[col]
        if col in ORDER_TEXT_COLUMNS:
            # Stored as bytes (surrogateescape): a byte that is not UTF-8 reaches cleaning unchanged
            # (parquet strings must be UTF-8), where the row is rejected with its raw value.
            columns.append(arrow_values.binaries([_text_bytes(col, v) for v in values]))
        elif isinstance(values, list):  # the shop query's columns: to Arrow without pandas
            try:
                column = (
                    arrow_values.int64s(values) if col == "row_id" else arrow_values.timestamps_us(values)
                )
            except TypeError as exc:
                raise TypeError(f"extract column {col}: {exc}; refusing to stage it") from exc
            except OverflowError as exc:  # a row id past 64 bits (a SQLite shop's text id)
                raise ValueError(f"extract column {col}: {exc}; refusing to stage it") from exc
            if col == "row_id" and column.null_count:
                raise ValueError("extract column row_id holds NULL: every shop order needs its row id")
            columns.append(column)
        elif col == "row_id":
            columns.append(pa.array(values.astype("int64"), type=pa.int64()))
        else:
            import pandas as pd

            columns.append(pa.array(pd.to_datetime(values).astype("datetime64[us]"), type=pa.timestamp("us")))
    return pa.Table.from_arrays(columns, schema=schema)


def write_extract_stream(
    folder: Folder,
    batches: Iterable[OrderColumns | pd.DataFrame],
    *,
    source_watermark_utc: dt.datetime | None = None,
) -> tuple[ObjectStoragePath, int]:
    """:func:`write_extract` for rows that arrive batch by batch: each batch becomes parquet row
    groups as it comes, so memory holds one batch, not the day. Returns the path and the row count.

    A day that comes as one batch of the shop query's columns (not a frame) of at most
    :func:`~onceflow.sales.text_staging.text_rows_limit` rows, every value a plain one
    (:func:`_plain`), is staged as text instead (``extract.tsv``): the extract task then never
    imports Arrow. Whether a second batch follows is known once the shop's cursor has been read
    past the first.

    Locally the file is written beside its final name and renamed into place once complete (a
    killed writer leaves the previous file); on ``gs://`` the finished file is uploaded whole, so
    memory then holds the compressed file (6.5 MB per 100,000 rows) for the upload.
    """
    facts = {"source_watermark_utc": _iso(source_watermark_utc), "extract_id": uuid.uuid4().hex}
    stream = iter(batches)
    first = next(stream, None)
    limit = text_staging.text_rows_limit()
    if limit and first is None:
        return _write_extract_text(storage_path(folder), None, facts)
    if limit and isinstance(first, dict) and len(first["row_id"]) <= limit and _plain(first):
        second = next(stream, None)  # the shop's cursor is read to its end before the format is chosen
        if second is None:
            return _write_extract_text(storage_path(folder), first, facts)
        stream = itertools.chain([first, second], stream)
    elif first is not None:
        stream = itertools.chain([first], stream)
    return _write_extract_parquet(storage_path(folder), stream, facts)


def _write_extract_text(
    folder: ObjectStoragePath, batch: OrderColumns | None, facts: dict[str, Any]
) -> tuple[ObjectStoragePath, int]:
    """A day of one small batch (of :func:`_plain` values) as ``extract.tsv`` (no Arrow in the extract task)."""
    rows = list(zip(*(batch[c] for c in ORDER_COLUMNS), strict=True)) if batch else []
    path = folder / EXTRACT_TEXT
    write_object(path, text_staging.encode(rows, ORDER_COLUMNS, EXTRACT_KINDS, facts))
    return path, len(rows)


def _plain(batch: OrderColumns) -> bool:
    """Whether every value of the shop query's batch is what its column holds when all is well:
    text or NULL, a 64-bit integer row id, a naive datetime or NULL. Anything else (a NaN, a number
    in a text column, a NULL row id or one past 64 bits, an aware or pandas time) goes the parquet way, which converts or
    refuses it with its own errors, so both formats accept and refuse the same values."""
    for col in ORDER_COLUMNS:
        kinds = set(map(type, batch[col]))
        if col in ORDER_TEXT_COLUMNS:
            if not kinds <= {str, type(None)}:
                return False
        elif col == "row_id":
            # In the 64-bit range too: parquet refuses a larger id, so text must not stage it.
            if not kinds <= {int} or not all(map(arrow_values.is_int64, batch[col])):
                return False
        elif not kinds <= {dt.datetime, type(None)} or any(
            v is not None and v.tzinfo is not None for v in batch[col]
        ):
            return False
    return True


def _write_extract_parquet(
    folder: ObjectStoragePath, batches: Iterable[OrderColumns | pd.DataFrame], facts: dict[str, Any]
) -> tuple[ObjectStoragePath, int]:
    import pyarrow.parquet as pq

    path = folder / EXTRACT_PARQUET
    schema = _extract_schema(facts)
    rows = 0
    with _staged_file(path) as sink, pq.ParquetWriter(sink, schema) as writer:
        for batch in batches:
            table = _extract_batch(batch, schema)
            writer.write_table(table, row_group_size=BATCH_ROWS)
            rows += table.num_rows
    return path, rows


def rename_into_place(temp: str, path: ObjectStoragePath) -> None:
    """Publish a complete local ``temp`` file as ``path`` (one rename; the folder is synced)."""
    os.replace(temp, path.path)
    fsync_dir(os.path.dirname(path.path))


@contextlib.contextmanager
def _staged_file(path: ObjectStoragePath) -> Iterator[Any]:
    """A binary file that becomes ``path`` whole when the block ends without an error."""
    if is_local(path):
        final = path.path
        os.makedirs(os.path.dirname(final), exist_ok=True)
        temp = (
            f"{os.path.dirname(final)}/.{os.path.basename(final)}.{os.getpid()}.{uuid.uuid4().hex[:16]}.tmp"
        )
        try:
            with open(temp, "xb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            rename_into_place(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
    else:
        with tempfile.TemporaryFile() as handle:
            yield handle
            handle.seek(0)
            write_object(path, handle.read())


def _text_bytes(column: str, value: object) -> bytes | None:
    """A text value as staged bytes; anything but text or NULL is refused, never staged as NULL."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if value is None or _is_missing(value):
        return None
    raise TypeError(
        f"extract column {column} holds a {type(value).__name__} ({value!r:.60}), not text: the shop "
        "query must convert it (onceflow.sales.shop_query); refusing to stage it as NULL"
    )


def _is_missing(value: object) -> bool:
    """NaN, or pandas' NA when pandas is loaded (a frame's missing text; never in the shop's columns)."""
    if isinstance(value, float):
        return value != value
    pandas = sys.modules.get("pandas")
    return pandas is not None and value is pandas.NA


def read_extract(folder: Folder) -> StagedExtract:
    """The rows :func:`write_extract` stored, with the watermark from the same file and read."""
    folder = storage_path(folder)
    data = _text_extract(folder)
    if data is not None:
        from onceflow.sales.shop_query import columns_frame, rows_columns

        facts, rows = text_staging.decode(data, EXTRACT_TEXT, ORDER_COLUMNS, EXTRACT_KINDS)
        frame = columns_frame(rows_columns(rows))
        return StagedExtract(frame, _parse(facts.get("source_watermark_utc")), facts.get("extract_id"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    from onceflow.sales.clean_stream import extract_frame

    table = pq.read_table(pa.BufferReader(read_object(folder / EXTRACT_PARQUET)))
    facts = json.loads((table.schema.metadata or {}).get(METADATA_KEY) or "{}")
    frame = extract_frame(table)
    return StagedExtract(frame, _parse(facts.get("source_watermark_utc")), facts.get("extract_id"))


def _text_extract(folder: ObjectStoragePath) -> bytes | None:
    """The folder's ``extract.tsv`` if that is the extract to clean, else None (``extract.parquet``).

    One try stages one of the two; a folder holds both only when tries staged the day in different
    formats (the day's size crossed :func:`~onceflow.sales.text_staging.text_rows_limit` between
    them), and then the extract that read the shop later is the one to clean (the text one on a tie).
    """
    try:
        data = read_object(folder / EXTRACT_TEXT)
    except FileNotFoundError:
        return None
    other = folder / EXTRACT_PARQUET
    if not other.exists():
        return data
    import pyarrow.parquet as pq

    with _open_staged(other) as handle:
        parquet_facts = _facts_of(pq.ParquetFile(handle)) or {}
    text_facts = text_staging.header(data, EXTRACT_TEXT)["facts"]
    never = dt.datetime.min
    text_read = _parse(text_facts.get("source_watermark_utc")) or never
    parquet_read = _parse(parquet_facts.get("source_watermark_utc")) or never
    return data if text_read >= parquet_read else None


@dataclasses.dataclass(frozen=True)
class StagedClean:
    """What the load task reads: rows, rejects and the counts needed for the reject ratio."""

    partition: dt.date
    rows: pd.DataFrame
    rejects: pd.DataFrame
    source_rows: int
    processing_version: str
    #: when the extract behind these rows read the shop (naive UTC); None if not recorded.
    source_watermark_utc: dt.datetime | None = None
    #: exact repeats cleaning dropped; None for files staged before it was recorded.
    duplicates_dropped: int | None = None

    def row_batches(self) -> Iterator[pd.DataFrame]:
        """The rows as one batch (:meth:`StreamedClean.row_batches` streams them)."""
        yield self.rows

    def arrow_batches(self) -> Iterator[pd.DataFrame]:
        """The rows as one frame (``overwrite`` takes frames too; :meth:`StreamedClean.arrow_batches`
        streams Arrow batches)."""
        yield self.rows

    def reject_batches(self) -> Iterator[pd.DataFrame]:
        """The rejects as one frame (:meth:`StreamedClean.reject_batches` streams them)."""
        yield self.rejects

    def reject_arrow_batches(self) -> Iterator[pd.DataFrame]:
        """The rejects as one frame (the load takes frames too; :meth:`StreamedClean.reject_arrow_batches`
        streams Arrow batches)."""
        yield self.rejects

    def load_batches(self, batch_rows: int | None = None) -> Iterator[pd.DataFrame]:
        """The rows as the load takes them: one frame."""
        yield self.rows

    def reject_load_batches(self) -> Iterator[pd.DataFrame]:
        """The rejects as the load takes them: one frame."""
        yield self.rejects

    @property
    def reject_count(self) -> int:
        """The number of staged rejects."""
        return len(self.rejects)

    @property
    def reject_ratio(self) -> float:
        """The share of source rows rejected (0 for an empty day)."""
        return self.reject_count / self.source_rows if self.source_rows else 0.0


def write_clean(
    folder: Folder,
    result: CleanResult,
    *,
    partition: dt.date,
    processing_version: str,
    source: StagedExtract | None = None,
) -> None:
    """Store a clean result; the manifest is written last and marks the folder complete.

    :param source: the extract ``result`` was cleaned from (:func:`read_extract`); its watermark
        and id go into the metadata of both files. None: no watermark (tests, old folders).
    """
    folder = storage_path(folder)
    facts = {
        "partition": partition_key(partition),
        "source_rows": result.source_rows,
        "processing_version": processing_version,
        "source_watermark_utc": _iso(source.source_watermark_utc if source else None),
        "extract_id": source.extract_id if source else None,
        "duplicates_dropped": result.duplicates_dropped,
    }
    _write_parquet(result.rows, folder / "rows.parquet", facts)
    _write_parquet(result.rejects.astype({"source_row_id": "int64"}), folder / "rejects.parquet", facts)
    manifest = {
        **facts,
        "format": PARQUET_FORMAT,
        "rows": len(result.rows),
        "rejects": len(result.rejects),
        "duplicates_dropped": result.duplicates_dropped,
        "reasons": result.reasons(),
    }
    write_object(folder / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


@dataclasses.dataclass(frozen=True)
class CleanSummary:
    """What :func:`clean_extract` staged: the counts its manifest, XCom and logs show."""

    source_rows: int
    rows: int
    rejects: int
    duplicates_dropped: int
    #: reject counts by reason, sorted by reason.
    reasons: dict[str, int]


def clean_extract(
    folder: Folder,
    *,
    partition: dt.date,
    processing_version: str,
    reporting_currency: str = "EUR",
    bucket_rows: int | None = None,
) -> CleanSummary:
    """Clean the folder's extract into rows, rejects and the manifest, as :func:`write_clean` of
    :func:`~onceflow.sales.clean.clean_orders` of :func:`read_extract` would, in bounded memory
    (:class:`onceflow.sales.clean_stream.DayCleaner`).

    The extract is held open (one try's file, its rows and watermark together, as
    :func:`read_extract`'s one read) and read row group by row group; spill files go to a
    temporary folder under ``$TMPDIR`` (about twice the extract's size), deleted at the end. Each
    output file is written as it streams into a temporary file and renamed into place (on
    ``gs://``: uploaded whole once complete), the manifest last.

    A day held in memory (one bucket) of at most
    :func:`~onceflow.sales.text_staging.text_rows_limit` source rows is staged as ``rows.tsv`` and
    ``rejects.tsv``, a larger one as ``rows.parquet`` and ``rejects.parquet``; the manifest's
    ``format`` says which (:data:`TEXT_FORMAT`, :data:`PARQUET_FORMAT`). A text extract cleaned as
    text never imports Arrow.

    :param bucket_rows: rows per bucket (default :data:`onceflow.sales.clean_stream.BUCKET_ROWS`).
    """
    from onceflow.sales.clean_rules import Row
    from onceflow.sales.clean_stream import BUCKET_ROWS, DayCleaner

    folder = storage_path(folder)
    with contextlib.ExitStack() as stack:
        data = _text_extract(folder)
        text_rows: list[tuple[Any, ...]] = []
        if data is not None:
            source, text_rows = text_staging.decode(data, EXTRACT_TEXT, ORDER_COLUMNS, EXTRACT_KINDS)
            expected_rows = len(text_rows)
        else:
            import pyarrow.parquet as pq

            handle = stack.enter_context(_open_staged(folder / EXTRACT_PARQUET))
            # pre_buffer=False: pre-buffering (pyarrow's default) keeps every column chunk read until
            # the file is closed, so memory grew with the file (about 40 MB per million rows).
            extract = pq.ParquetFile(handle, pre_buffer=False)
            source = _facts_of(extract) or {}
            expected_rows = extract.metadata.num_rows
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="onceflow-clean-"))
        cleaner = stack.enter_context(
            DayCleaner(
                partition=partition,
                expected_rows=expected_rows,
                workdir=work,
                reporting_currency=reporting_currency,
                bucket_rows=bucket_rows or BUCKET_ROWS,
            )
        )
        if data is None:
            for batch in extract.iter_batches(batch_size=EXTRACT_READ_ROWS):
                cleaner.add(batch)
        elif cleaner.in_memory:
            cleaner.add_rows(list(map(Row._make, text_rows)))
        elif text_rows:  # a text extract spilled into more than one bucket (a small bucket_rows)
            from onceflow.sales.shop_query import rows_columns

            cleaner.add(_extract_batch(rows_columns(text_rows), _extract_schema(source)))
        del text_rows
        cleaner.dedupe()
        facts = {
            "partition": partition_key(partition),
            "source_rows": cleaner.source_rows,
            "processing_version": processing_version,
            "source_watermark_utc": _iso(_parse(source.get("source_watermark_utc"))),
            "extract_id": source.get("extract_id"),
            "duplicates_dropped": cleaner.duplicates_dropped,
        }
        limit = text_staging.text_rows_limit()
        as_text = limit > 0 and cleaner.in_memory and cleaner.source_rows <= limit
        rejects = (_write_clean_text if as_text else _write_clean_parquet)(folder, cleaner, facts)
        summary = CleanSummary(
            source_rows=cleaner.source_rows,
            rows=cleaner.row_count,
            rejects=rejects,
            duplicates_dropped=cleaner.duplicates_dropped,
            reasons=dict(sorted(cleaner.reasons.items())),
        )
    manifest = {
        **facts,
        "format": TEXT_FORMAT if as_text else PARQUET_FORMAT,
        "rows": summary.rows,
        "rejects": summary.rejects,
        "duplicates_dropped": summary.duplicates_dropped,
        "reasons": summary.reasons,
    }
    write_object(folder / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return summary


def _write_clean_text(folder: ObjectStoragePath, cleaner: Any, facts: dict[str, Any]) -> int:
    """A day held in memory as ``rows.tsv`` and ``rejects.tsv``; returns the reject count."""
    rows, rejects = cleaner.sales_rows(), cleaner.reject_rows()
    write_object(folder / ROWS_TEXT, text_staging.encode(rows, SALES_COLUMNS, SALES_KINDS, facts))
    write_object(folder / REJECTS_TEXT, text_staging.encode(rejects, REJECT_COLUMNS, REJECT_KINDS, facts))
    return len(rejects)


def _write_clean_parquet(folder: ObjectStoragePath, cleaner: Any, facts: dict[str, Any]) -> int:
    """The cleaner's rows and rejects as ``rows.parquet`` and ``rejects.parquet``, each streamed
    into its file as it comes; returns the reject count."""
    import pyarrow.parquet as pq

    from onceflow.sales.clean_stream import reject_schema

    metadata = {METADATA_KEY: json.dumps(facts, sort_keys=True).encode()}
    schema = sales_arrow_schema().with_metadata(metadata)
    with _staged_file(folder / "rows.parquet") as sink, pq.ParquetWriter(sink, schema) as writer:
        for table in cleaner.rows():
            writer.write_table(table.replace_schema_metadata(metadata), row_group_size=BATCH_ROWS)
    rejects = 0
    schema = reject_schema().with_metadata(metadata)
    with _staged_file(folder / "rejects.parquet") as sink, pq.ParquetWriter(sink, schema) as writer:
        for table in cleaner.rejects():
            writer.write_table(table.replace_schema_metadata(metadata), row_group_size=BATCH_ROWS)
            rejects += len(table)
    return rejects


def read_clean(folder: Folder) -> StagedClean:
    """Read what :func:`write_clean` stored; the facts come from the parquet files themselves.

    :raises StagingMismatchError: rows and rejects were cleaned from different extracts.
    """
    from onceflow.sales.clean import empty_sales_frame, normalise_sales_frame

    folder = storage_path(folder)
    manifest = json.loads(read_object(folder / "manifest.json"))  # absent: clean never finished
    if _clean_format(folder, manifest) == TEXT_FORMAT:
        text = _read_text_clean(folder, manifest)
        return StagedClean(
            partition=text.partition,
            rows=text.rows,
            rejects=text.rejects,
            source_rows=text.source_rows,
            processing_version=text.processing_version,
            source_watermark_utc=text.source_watermark_utc,
            duplicates_dropped=text.duplicates_dropped,
        )
    rows, facts = _read_parquet(folder / "rows.parquet")
    rows = normalise_sales_frame(rows) if len(rows) else empty_sales_frame()
    rejects, reject_facts = _read_parquet(folder / "rejects.parquet")
    return StagedClean(
        rows=rows, rejects=_reject_frame(rejects), **_clean_facts(folder, manifest, facts, reject_facts)
    )


def _reject_frame(rejects: pd.DataFrame) -> pd.DataFrame:
    """Staged rejects as the load takes them: :data:`REJECT_COLUMNS`, a missing order id as None."""
    rejects = rejects.loc[:, list(REJECT_COLUMNS)]
    rejects["order_id"] = rejects["order_id"].astype(object).where(rejects["order_id"].notna(), None)
    return rejects


def _clean_facts(
    folder: ObjectStoragePath,
    manifest: dict[str, Any],
    facts: dict[str, Any] | None,
    reject_facts: dict[str, Any] | None,
    suffix: str = "parquet",
) -> dict[str, Any]:
    """The facts of a staged clean, the rows file's ``facts`` checked against the rejects file's."""
    if facts != reject_facts:
        raise StagingMismatchError(
            f"{folder}: rows.{suffix} ({facts}) and rejects.{suffix} ({reject_facts}) come from "
            "different clean or extract tries; clear the run's extract task to stage them again"
        )
    if facts is None:  # staged before the facts moved into the files: no watermark known
        facts = {**manifest, "source_watermark_utc": None}
    return {
        "partition": validate_partition(facts["partition"]),
        "source_rows": int(facts["source_rows"]),
        "processing_version": str(facts["processing_version"]),
        "source_watermark_utc": _parse(facts.get("source_watermark_utc")),
        "duplicates_dropped": facts.get("duplicates_dropped"),
    }


@dataclasses.dataclass(frozen=True)
class StreamedClean:
    """A staged clean whose rows are read batch by batch (:func:`open_clean`); else as :class:`StagedClean`."""

    partition: dt.date
    source_rows: int
    processing_version: str
    source_watermark_utc: dt.datetime | None
    duplicates_dropped: int | None
    #: the open ``rows.parquet`` (one file: the rows of the same try as the facts above).
    rows_file: Any
    #: the open ``rejects.parquet``, of the same try (its facts are the rows file's).
    rejects_file: Any

    @property
    def reject_count(self) -> int:
        """The number of staged rejects (from the file's metadata: none is read)."""
        return int(self.rejects_file.metadata.num_rows)

    @property
    def reject_ratio(self) -> float:
        """The share of source rows rejected (0 for an empty day)."""
        return self.reject_count / self.source_rows if self.source_rows else 0.0

    def reject_batches(self, batch_rows: int = REJECT_BATCH_ROWS) -> Iterator[pd.DataFrame]:
        """The rejects, ``batch_rows`` at a time (columns :data:`REJECT_COLUMNS`): a day's rejects
        are bounded by the reject ratio, not by memory (about 1 kB each once loaded as rows)."""
        for batch in self.reject_arrow_batches(batch_rows):
            yield _reject_frame(batch.to_pandas())

    def reject_arrow_batches(self, batch_rows: int = REJECT_BATCH_ROWS) -> Iterator[Any]:
        """:meth:`reject_batches` as Arrow record batches (what the SQL load inserts, without pandas)."""
        yield from self.rejects_file.iter_batches(batch_size=batch_rows, columns=list(REJECT_COLUMNS))

    @property
    def rejects(self) -> pd.DataFrame:
        """Every reject in one frame (what :meth:`reject_batches` streams; for small days and tests)."""
        import pandas as pd

        frames = list(self.reject_batches())
        if frames:
            return pd.concat(frames, ignore_index=True)
        return _reject_frame(self.rejects_file.schema_arrow.empty_table().to_pandas())

    @property
    def row_count(self) -> int:
        """The number of clean rows in the staged file."""
        return int(self.rows_file.metadata.num_rows)

    def row_batches(self, batch_rows: int = BATCH_ROWS) -> Iterator[pd.DataFrame]:
        """The rows, ``batch_rows`` at a time, each a normalised sales frame."""
        from onceflow.sales.clean import normalise_sales_frame

        for batch in self.rows_file.iter_batches(batch_size=batch_rows):
            yield normalise_sales_frame(batch.to_pandas())

    def arrow_batches(self, batch_rows: int = COPY_BATCH_ROWS) -> Iterator[Any]:
        """The rows, ``batch_rows`` at a time, as Arrow record batches of
        :func:`~onceflow.sales.schema.sales_arrow_schema` (what the load's COPY path formats
        column-wise; :meth:`PartitionStore.overwrite
        <onceflow.sales.partition_store.PartitionStore.overwrite>` takes either)."""
        schema = sales_arrow_schema()
        for batch in self.rows_file.iter_batches(batch_size=batch_rows, columns=schema.names):
            yield batch.cast(schema)  # files staged before the fixed schema: null or large types

    def load_batches(self, batch_rows: int | None = None) -> Iterator[Any]:
        """The rows as the load takes them (:meth:`arrow_batches`)."""
        return self.arrow_batches(batch_rows or COPY_BATCH_ROWS)

    def reject_load_batches(self) -> Iterator[Any]:
        """The rejects as the load takes them (:meth:`reject_arrow_batches`)."""
        return self.reject_arrow_batches()


@dataclasses.dataclass(frozen=True)
class TextClean:
    """A staged clean of a day staged as text (:func:`open_clean`): rows and rejects as Python
    rows (tuples in :data:`SALES_COLUMNS` and :data:`REJECT_COLUMNS` order), each file read whole.
    The load inserts them without Arrow or pandas."""

    partition: dt.date
    source_rows: int
    processing_version: str
    source_watermark_utc: dt.datetime | None
    duplicates_dropped: int | None
    sales_rows: list[tuple[Any, ...]]
    reject_rows: list[tuple[Any, ...]]

    @property
    def row_count(self) -> int:
        """The number of clean rows."""
        return len(self.sales_rows)

    @property
    def reject_count(self) -> int:
        """The number of staged rejects."""
        return len(self.reject_rows)

    @property
    def reject_ratio(self) -> float:
        """The share of source rows rejected (0 for an empty day)."""
        return self.reject_count / self.source_rows if self.source_rows else 0.0

    def load_batches(self, batch_rows: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """The rows as the load takes them: lists of at most ``batch_rows`` rows (default: one list)."""
        step = batch_rows or max(1, len(self.sales_rows))
        for start in range(0, len(self.sales_rows), step):
            yield self.sales_rows[start : start + step]

    def reject_load_batches(self) -> Iterator[list[tuple[Any, ...]]]:
        """The rejects as the load takes them: one list."""
        if self.reject_rows:
            yield self.reject_rows

    @property
    def rows(self) -> pd.DataFrame:
        """The rows as a normalised sales frame (BigQuery's load job, tests)."""
        from onceflow.sales.clean import sales_rows_frame

        return sales_rows_frame(self.sales_rows)

    @property
    def rejects(self) -> pd.DataFrame:
        """The rejects as a frame (columns :data:`REJECT_COLUMNS`)."""
        import pandas as pd

        frame = pd.DataFrame.from_records(self.reject_rows, columns=list(REJECT_COLUMNS))
        return _reject_frame(frame.astype({"source_row_id": "int64"}))

    def row_batches(self, batch_rows: int = BATCH_ROWS) -> Iterator[pd.DataFrame]:
        """The rows, ``batch_rows`` at a time, each a normalised sales frame."""
        from onceflow.sales.clean import sales_rows_frame

        for start in range(0, len(self.sales_rows), batch_rows):
            yield sales_rows_frame(self.sales_rows[start : start + batch_rows])


def _read_text_clean(folder: ObjectStoragePath, manifest: dict[str, Any]) -> TextClean:
    """``rows.tsv`` and ``rejects.tsv``, each read whole (one try's file), facts checked to agree.

    :raises StagingMismatchError: rows and rejects were cleaned from different extracts.
    """
    facts, rows = text_staging.decode(read_object(folder / ROWS_TEXT), ROWS_TEXT, SALES_COLUMNS, SALES_KINDS)
    reject_facts, rejects = text_staging.decode(
        read_object(folder / REJECTS_TEXT), REJECTS_TEXT, REJECT_COLUMNS, REJECT_KINDS
    )
    return TextClean(
        sales_rows=rows, reject_rows=rejects, **_clean_facts(folder, manifest, facts, reject_facts, "tsv")
    )


@contextlib.contextmanager
def open_clean(folder: Folder) -> Iterator[StreamedClean | TextClean]:
    """:func:`read_clean` without holding the rows in memory: they stream from ``rows.parquet``, the
    rejects from ``rejects.parquet`` (:meth:`StreamedClean.reject_batches`). A day staged as text
    (the manifest's ``format``) is read whole instead, as a :class:`TextClean`: it is small.

    The files are held open (locally, the open file keeps the inode a later try may rename over;
    from ``gs://``, one download into a temporary file), so the batches and the facts come from
    one try's files, as :func:`read_clean`'s one read does.

    :raises StagingMismatchError: rows and rejects were cleaned from different extracts.
    """
    folder = storage_path(folder)
    manifest = json.loads(read_object(folder / "manifest.json"))  # absent: clean never finished
    if _clean_format(folder, manifest) == TEXT_FORMAT:
        yield _read_text_clean(folder, manifest)
        return
    import pyarrow.parquet as pq

    with (
        _open_staged(folder / "rows.parquet") as handle,
        _open_staged(folder / "rejects.parquet") as reject_handle,
    ):
        rows_file = pq.ParquetFile(handle, pre_buffer=False)  # else every row group read stays cached
        rejects_file = pq.ParquetFile(reject_handle, pre_buffer=False)
        facts = _clean_facts(folder, manifest, _facts_of(rows_file), _facts_of(rejects_file))
        yield StreamedClean(rows_file=rows_file, rejects_file=rejects_file, **facts)


@contextlib.contextmanager
def _open_staged(path: ObjectStoragePath) -> Iterator[Any]:
    """A staged file open for reading, one try's file throughout: locally the open file keeps the
    inode a later try may rename over; from ``gs://``, one download into a temporary file."""
    if is_local(path):
        with open(path.path, "rb") as handle:
            yield handle
    else:
        with tempfile.TemporaryFile() as handle:
            with path.open("rb") as source:
                shutil.copyfileobj(source, handle, 1 << 20)
            handle.seek(0)
            yield handle


def _facts_of(parquet_file: Any) -> dict[str, Any] | None:
    """The facts in an open parquet file's metadata (None: staged before the facts)."""
    raw = (parquet_file.schema_arrow.metadata or {}).get(METADATA_KEY)
    return None if raw is None else json.loads(raw)
