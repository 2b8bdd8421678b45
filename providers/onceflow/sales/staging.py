"""Staging files between the extract, clean and load tasks of one daily_sales run.

Layout: ``<base>/<dag_id>/<partition>/<run key>/`` with ``extract.parquet``, ``rows.parquet``,
``rejects.parquet`` and ``manifest.json`` (written last: the folder is complete). The run key is
the run id made filesystem-safe plus a short hash, so two runs of the same partition never share
files, and a retry of a task rewrites its own files.

**What the load needs travels inside the parquet files** (key-value metadata under
:data:`METADATA_KEY`) and is read in the same read as the rows: the extract's **source
watermark** (when it read the shop) and its id in ``extract.parquet``; those plus the partition,
the source row count and the processing version in ``rows.parquet`` and ``rejects.parquet``. Two
tries of one task may overlap on the same folder (a zombie and its retry); each file is replaced
whole (:mod:`onceflow.files`: unique temporary file, fsync, rename), so a reader gets one try's
rows together with that same try's watermark, never one try's rows with another's. Rows and
rejects from different extracts are refused (:class:`StagingMismatchError`). The manifest is a
summary for people; the load does not read values from it.

The base defaults to ``$AIRFLOW_HOME/onceflow/staging``; set ``ONCEFLOW_SALES_STAGING_DIR`` to a
shared filesystem when workers run on several hosts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from onceflow.files import atomic_path, atomic_write_bytes
from onceflow.sales.clean import empty_sales_frame, normalise_sales_frame
from onceflow.sales.partitions import partition_key, validate_partition
from onceflow.sales.schema import ORDER_COLUMNS, REJECT_COLUMNS

if TYPE_CHECKING:
    from onceflow.sales.clean import CleanResult

STAGING_ENV = "ONCEFLOW_SALES_STAGING_DIR"
#: parquet key-value metadata key holding the staged file's JSON facts.
METADATA_KEY = b"onceflow.staging"
_TEXT_COLUMNS = ("order_id", "event_type", "refund_id", "customer_id", "amount", "currency")


class StagingMismatchError(RuntimeError):
    """The staged rows and rejects come from different extracts (overlapping tries): re-run clean."""


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")


def base_dir() -> Path:
    """Staging root: ``$ONCEFLOW_SALES_STAGING_DIR`` or ``$AIRFLOW_HOME/onceflow/staging``."""
    configured = os.environ.get(STAGING_ENV)
    return Path(configured) if configured else airflow_home() / "onceflow" / "staging"


def run_dir(base: Path, dag_id: str, partition: dt.date, run_id: str) -> Path:
    """The staging folder of one run of one partition."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    dag = re.sub(r"[^A-Za-z0-9_.-]", "_", dag_id)
    return base / dag / partition_key(partition) / f"{safe}-{digest}"


def _write_parquet(df: pd.DataFrame, path: Path, facts: dict[str, Any]) -> None:
    """``df`` with ``facts`` in the file's own metadata, replaced atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    metadata = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(facts, sort_keys=True).encode()}
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp)


def _read_parquet(path: Path) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """Rows and facts of a staged file from one read (None: a file staged before the facts)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
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
    folder: Path, frame: pd.DataFrame, *, source_watermark_utc: dt.datetime | None = None
) -> Path:
    """Store the extracted source rows (columns of ``orders``) with when they were read.

    :param source_watermark_utc: the shop's clock when the read began (naive UTC), from
        :meth:`onceflow.hooks.warehouse.ShopDbHook.read_interval_snapshot`. The load refuses to
        replace a partition with an extract older than the one it holds.
    """
    path = folder / "extract.parquet"
    out = frame.loc[:, list(ORDER_COLUMNS)].copy()
    for col in ("created_at_utc", "ingested_at_utc"):
        out[col] = pd.to_datetime(out[col]).astype("datetime64[us]")
    out["row_id"] = out["row_id"].astype("int64")
    for col in _TEXT_COLUMNS:
        # Stored as bytes (surrogateescape): a byte that is not UTF-8 reaches cleaning unchanged
        # (parquet strings must be UTF-8), where the row is rejected with its raw value.
        out[col] = pd.Series(
            [v.encode("utf-8", "surrogateescape") if isinstance(v, str) else None for v in out[col]],
            index=out.index,
            dtype=object,
        )
    facts = {"source_watermark_utc": _iso(source_watermark_utc), "extract_id": uuid.uuid4().hex}
    _write_parquet(out, path, facts)
    return path


def read_extract(folder: Path) -> StagedExtract:
    """The rows :func:`write_extract` stored, with the watermark from the same file and read."""
    frame, facts = _read_parquet(folder / "extract.parquet")
    facts = facts or {}
    for col in _TEXT_COLUMNS:
        frame[col] = pd.Series(
            [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v for v in frame[col]],
            index=frame.index,
            dtype=object,
        )
    return StagedExtract(frame, _parse(facts.get("source_watermark_utc")), facts.get("extract_id"))


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

    @property
    def reject_ratio(self) -> float:
        return len(self.rejects) / self.source_rows if self.source_rows else 0.0


def write_clean(
    folder: Path,
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
    facts = {
        "partition": partition_key(partition),
        "source_rows": result.source_rows,
        "processing_version": processing_version,
        "source_watermark_utc": _iso(source.source_watermark_utc if source else None),
        "extract_id": source.extract_id if source else None,
    }
    _write_parquet(result.rows, folder / "rows.parquet", facts)
    _write_parquet(result.rejects.astype({"source_row_id": "int64"}), folder / "rejects.parquet", facts)
    manifest = {
        **facts,
        "rows": len(result.rows),
        "rejects": len(result.rejects),
        "duplicates_dropped": result.duplicates_dropped,
        "reasons": result.reasons(),
    }
    atomic_write_bytes(
        folder / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    )


def read_clean(folder: Path) -> StagedClean:
    """Read what :func:`write_clean` stored; the facts come from the parquet files themselves.

    :raises StagingMismatchError: rows and rejects were cleaned from different extracts.
    """
    manifest = json.loads((folder / "manifest.json").read_text())  # absent: clean never finished
    rows, facts = _read_parquet(folder / "rows.parquet")
    rejects, reject_facts = _read_parquet(folder / "rejects.parquet")
    if facts != reject_facts:
        raise StagingMismatchError(
            f"{folder}: rows.parquet ({facts}) and rejects.parquet ({reject_facts}) come from "
            "different clean or extract tries; clear the run's extract task to stage them again"
        )
    if facts is None:  # staged before the facts moved into the files: no watermark known
        facts = {**manifest, "source_watermark_utc": None}
    rows = normalise_sales_frame(rows) if len(rows) else empty_sales_frame()
    rejects = rejects.loc[:, list(REJECT_COLUMNS)]
    rejects["order_id"] = rejects["order_id"].astype(object).where(rejects["order_id"].notna(), None)
    return StagedClean(
        partition=validate_partition(facts["partition"]),
        rows=rows,
        rejects=rejects,
        source_rows=int(facts["source_rows"]),
        processing_version=str(facts["processing_version"]),
        source_watermark_utc=_parse(facts.get("source_watermark_utc")),
    )
