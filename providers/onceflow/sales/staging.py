"""Staging files between the extract, clean and load tasks of one daily_sales run.

Layout: ``<base>/<dag_id>/<partition>/<run key>/`` with ``extract.parquet`` and ``extract.json``
(the extract's **source watermark**: when it read the shop), ``rows.parquet``, ``rejects.parquet``
and ``manifest.json`` (which carries the watermark on to the load). The run key is the run id made filesystem-safe plus a
short hash, so two runs of the same partition never share files, and a retry of a task rewrites
its own files. Every file is written to a unique temporary name in the same folder, fsynced and renamed
(:mod:`onceflow.files`), so a killed task or a host crash leaves either the previous file or the
complete new one, and two live tries of one task (a zombie and its retry) never write into the
same temporary file; the manifest is written last. The base defaults to ``$AIRFLOW_HOME/onceflow/staging``;
set ``ONCEFLOW_SALES_STAGING_DIR`` to a shared filesystem when workers run on several hosts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from onceflow.files import atomic_path, atomic_write_bytes
from onceflow.sales.clean import empty_sales_frame, normalise_sales_frame
from onceflow.sales.partitions import partition_key, validate_partition
from onceflow.sales.schema import ORDER_COLUMNS, REJECT_COLUMNS

if TYPE_CHECKING:
    from onceflow.sales.clean import CleanResult

STAGING_ENV = "ONCEFLOW_SALES_STAGING_DIR"


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


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def _atomic_text(text: str, path: Path) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_extract(
    folder: Path, frame: pd.DataFrame, *, source_watermark_utc: dt.datetime | None = None
) -> Path:
    """Store the extracted source rows (columns of ``orders``) and when they were read.

    :param source_watermark_utc: the shop's clock when the read began (naive UTC), from
        :meth:`onceflow.hooks.warehouse.ShopDbHook.read_interval_snapshot`. The load refuses to
        replace a partition with an extract older than the one it holds.
    """
    path = folder / "extract.parquet"
    out = frame.loc[:, list(ORDER_COLUMNS)].copy()
    for col in ("created_at_utc", "ingested_at_utc"):
        out[col] = pd.to_datetime(out[col]).astype("datetime64[us]")
    out["row_id"] = out["row_id"].astype("int64")
    for col in ("order_id", "event_type", "refund_id", "customer_id", "amount", "currency"):
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    _atomic_parquet(out, path)
    watermark = None if source_watermark_utc is None else source_watermark_utc.isoformat(sep=" ")
    meta = {"rows": len(out), "source_watermark_utc": watermark}
    _atomic_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", folder / "extract.json")
    return path


def read_extract_watermark(folder: Path) -> dt.datetime | None:
    """The watermark :func:`write_extract` stored, or None (a folder staged before watermarks)."""
    try:
        value = json.loads((folder / "extract.json").read_text())["source_watermark_utc"]
    except FileNotFoundError:
        return None
    return None if value is None else dt.datetime.fromisoformat(value)


def read_extract(folder: Path) -> pd.DataFrame:
    """The extracted source rows written by :func:`write_extract`."""
    return pd.read_parquet(folder / "extract.parquet")


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


def write_clean(folder: Path, result: CleanResult, *, partition: dt.date, processing_version: str) -> None:
    """Store a clean result; the manifest is written last and marks the folder complete.

    The manifest carries the extract's watermark (from ``extract.json`` in the same folder).
    """
    watermark = read_extract_watermark(folder)
    _atomic_parquet(result.rows, folder / "rows.parquet")
    _atomic_parquet(result.rejects.astype({"source_row_id": "int64"}), folder / "rejects.parquet")
    manifest = {
        "partition": partition_key(partition),
        "source_rows": result.source_rows,
        "rows": len(result.rows),
        "rejects": len(result.rejects),
        "duplicates_dropped": result.duplicates_dropped,
        "reasons": result.reasons(),
        "processing_version": processing_version,
        "source_watermark_utc": None if watermark is None else watermark.isoformat(sep=" "),
    }
    _atomic_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", folder / "manifest.json")


def read_clean(folder: Path) -> StagedClean:
    """Read what :func:`write_clean` stored."""
    manifest = json.loads((folder / "manifest.json").read_text())
    partition = validate_partition(manifest["partition"])
    rows = pd.read_parquet(folder / "rows.parquet")
    rows = normalise_sales_frame(rows) if len(rows) else empty_sales_frame()
    rejects = pd.read_parquet(folder / "rejects.parquet")
    rejects = rejects.loc[:, list(REJECT_COLUMNS)]
    rejects["order_id"] = rejects["order_id"].astype(object).where(rejects["order_id"].notna(), None)
    return StagedClean(
        partition=partition,
        rows=rows,
        rejects=rejects,
        source_rows=int(manifest["source_rows"]),
        processing_version=str(manifest["processing_version"]),
        source_watermark_utc=(
            dt.datetime.fromisoformat(manifest["source_watermark_utc"])
            if manifest.get("source_watermark_utc")
            else None
        ),
    )
