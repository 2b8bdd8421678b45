"""A small day staged as text (issue 27): ``extract.tsv``, ``rows.tsv`` and ``rejects.tsv`` instead of
parquet, so no daily_sales task of such a day imports Arrow or numpy (0.14 s of CPU a task).

The promise is that the format changes nothing a user sees: the same day staged either way is
cleaned into the same rows and rejects and stored as the same partition with the same checksum,
read back from the warehouse (not from what the load reported). Checked here on generated messy
days (conflicts, NULLs, NUL bytes, stray bytes, ties), both formats side by side, on SQLite and
PostgreSQL; the codec on generated awkward values; a cut or foreign file is refused, never read as
fewer rows. ``tests/integration/test_sales_tasks_without_pandas.py`` runs the DAG's own tasks with
pandas, pyarrow and numpy refused.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from onceflow.sales import staging, text_staging
from onceflow.sales.checksum import RowDigests, frame_checksum, rows_checksum
from onceflow.sales.clean import clean_orders
from onceflow.sales.clean_stream import DayCleaner
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore, frame_records
from onceflow.sales.schema import ORDER_COLUMNS, REJECT_COLUMNS, SALES_COLUMNS
from onceflow.sales.text_staging import (
    EXTRACT_KINDS,
    REJECT_KINDS,
    SALES_KINDS,
    TEXT_ROWS_ENV,
    StagedTextError,
    decode,
    encode,
)
from onceflow.testing import sales_fixtures
from onceflow.testing.sales_fixtures import order_columns

if TYPE_CHECKING:
    from pathlib import Path

DAY = dt.date(2024, 10, 27)  # 25 hours in Europe/Amsterdam
WATERMARK = dt.datetime(2024, 10, 28, 1, 2, 3, 456789)
AWKWARD = [
    None, "", "plain", "tab\there", "new\nline", "carriage\rreturn", "back\\slash", "\\N", "\\", "\\\\N",
    "ends with backslash\\", "nul\x00byte", "caf\u00e9", "\U0001f600", "stray \udcff\udc80 bytes",
    "unit\x1fsep", " padded ", "N", "\\t literally",
]  # fmt: skip


def messy_day(seed: int, orders: int = 400) -> pd.DataFrame:
    frame: pd.DataFrame = sales_fixtures.messy_day(DAY, seed, orders)
    return frame


def awkward_rows(rng: random.Random, kinds: tuple[str, ...], count: int) -> list[tuple[Any, ...]]:
    def value(kind: str) -> Any:
        if rng.random() < 0.1:
            return None
        if kind == text_staging.INT:
            return rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(-(10**12), 10**12)])
        if kind == text_staging.TEXT:
            return rng.choice(AWKWARD) or rng.choice(AWKWARD[1:]) + rng.choice(AWKWARD[1:])
        day = dt.date(rng.choice([1, 1970, 2024, 9999]), rng.randint(1, 12), rng.randint(1, 28))
        if kind == text_staging.DATE:
            return day
        micro = rng.choice([0, rng.randrange(1_000_000)])
        return dt.datetime.combine(
            day, dt.time(rng.randrange(24), rng.randrange(60), rng.randrange(60), micro)
        )

    return [tuple(value(k) for k in kinds) for _ in range(count)]


@pytest.mark.parametrize("seed", range(60))
def test_every_value_round_trips_exactly(seed: int) -> None:
    rng = random.Random(seed)
    for columns, kinds in (
        (ORDER_COLUMNS, EXTRACT_KINDS),
        (SALES_COLUMNS, SALES_KINDS),
        (REJECT_COLUMNS, REJECT_KINDS),
    ):
        rows = awkward_rows(rng, kinds, rng.choice([0, 1, 2, 40]))
        facts = {"extract_id": f"x{seed}", "source_watermark_utc": None}
        data = encode(rows, columns, kinds, facts)
        assert decode(data, "f", columns, kinds) == (facts, rows)


def test_a_cut_or_foreign_file_is_refused_at_every_byte() -> None:
    """Never fewer rows read: a file cut anywhere, or with a line edited out, raises."""
    rows = awkward_rows(random.Random(1), EXTRACT_KINDS, 5)
    data = encode(rows, ORDER_COLUMNS, EXTRACT_KINDS, {"extract_id": "x"})
    for cut in range(len(data)):
        with pytest.raises(StagedTextError):
            decode(data[:cut], "extract.tsv", ORDER_COLUMNS, EXTRACT_KINDS)
    lines = data.split(b"\n")
    with pytest.raises(StagedTextError, match="holds 4 rows, its header says 5"):
        decode(b"\n".join(lines[:2] + lines[3:]), "extract.tsv", ORDER_COLUMNS, EXTRACT_KINDS)
    one_row = encode(rows[:1], ORDER_COLUMNS, EXTRACT_KINDS, {"extract_id": "x"})
    with pytest.raises(StagedTextError, match="its header says True"):
        decode(one_row.replace(b'"rows": 1', b'"rows": true', 1), "extract.tsv", ORDER_COLUMNS, EXTRACT_KINDS)
    with pytest.raises(StagedTextError, match="holds columns"):
        decode(data, "rows.tsv", SALES_COLUMNS, SALES_KINDS)
    with pytest.raises(StagedTextError, match="not a staged text file"):
        decode(b"PAR1\x00\x01", "extract.tsv", ORDER_COLUMNS, EXTRACT_KINDS)
    extra_field = lines[0] + b"\n" + lines[1] + b"\tx\n" + b"\n".join(lines[2:])
    with pytest.raises(StagedTextError, match="line 2 has 10 fields"):
        decode(extra_field, "extract.tsv", ORDER_COLUMNS, EXTRACT_KINDS)
    fields = lines[1].split(b"\t")
    fields[5] = b"yesterday"
    bad_time = b"\n".join([lines[0], b"\t".join(fields), *lines[2:]])
    with pytest.raises(StagedTextError, match="does not parse"):
        decode(bad_time, "extract.tsv", ORDER_COLUMNS, EXTRACT_KINDS)


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert text_staging.text_rows_limit() == text_staging.DEFAULT_TEXT_ROWS
    monkeypatch.setenv(TEXT_ROWS_ENV, " 0 ")
    assert text_staging.text_rows_limit() == 0
    for bad in ("-1", "ten", "1.5"):
        monkeypatch.setenv(TEXT_ROWS_ENV, bad)
        with pytest.raises(ValueError, match=f"{TEXT_ROWS_ENV} must be a whole number of rows"):
            text_staging.text_rows_limit()


def stage(folder: Path, source: pd.DataFrame, limit: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """Extract and clean ``source`` into ``folder`` with the text limit ``limit``; the manifest's format."""
    monkeypatch.setenv(TEXT_ROWS_ENV, str(limit))
    _path, rows = staging.write_extract_stream(
        folder, [order_columns(source)], source_watermark_utc=WATERMARK
    )
    assert rows == len(source)
    staging.clean_extract(folder, partition=DAY, processing_version="v")
    return str(json.loads((folder / "manifest.json").read_text())["format"])


def test_the_same_day_staged_either_way_is_stored_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sales_db_url: str
) -> None:
    """Generated messy days, each staged as text and as parquet and loaded by the load's own path
    (COPY on PostgreSQL, INSERT on SQLite): the stored rows, rejects and checksums are equal, and
    equal the whole-day pandas reference."""
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    for seed, orders in enumerate([0, 1, 7, 60, 400]):
        source = messy_day(seed, orders) if orders else messy_day(seed).iloc[0:0]
        whole = clean_orders(source, partition=DAY)
        stored = {}
        for limit in (10_000, 0):
            folder = tmp_path / f"{seed}-{limit}"
            fmt = stage(folder, source, limit, monkeypatch)
            assert fmt == ("text" if limit else "parquet")
            names = {p.name for p in folder.iterdir()}
            suffix = "tsv" if limit else "parquet"
            assert names == {f"extract.{suffix}", f"rows.{suffix}", f"rejects.{suffix}", "manifest.json"}
            with staging.open_clean(folder) as staged:
                assert (staged.row_count, staged.reject_count) == (len(whole.rows), len(whole.rejects))
                audit = store.overwrite(
                    store.acquire_lease(DAY, run_id=f"r{seed}-{limit}", try_number=1),
                    staged.load_batches(),
                    staged.reject_load_batches(),
                    processing_version=staged.processing_version,
                    source_watermark_utc=staged.source_watermark_utc,
                    duplicate_count=staged.duplicates_dropped,
                )
            rows, rejects = store.partition_rows(DAY), store.partition_rejects(DAY)
            assert audit.checksum == store.partition_checksum(DAY) == rows_checksum(rows), (seed, limit)
            stored[limit] = (sorted(rows, key=lambda r: r[1]), [tuple(r.values()) for r in rejects], audit)
        text, parquet = stored[10_000], stored[0]
        assert text[0] == parquet[0] == frame_records(whole.rows, SALES_COLUMNS), seed
        assert text[1] == parquet[1] == frame_records(whole.rejects, REJECT_COLUMNS), seed
        assert text[2].checksum == parquet[2].checksum == frame_checksum(whole.rows, SALES_COLUMNS), seed
        assert (text[2].row_count, text[2].reject_count, text[2].duplicate_count) == (
            parquet[2].row_count, parquet[2].reject_count, parquet[2].duplicate_count,
        )  # fmt: skip
        assert text[2].source_watermark_utc == parquet[2].source_watermark_utc == WATERMARK


def test_read_clean_and_read_extract_give_the_same_frames_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What BigQuery's load (``read_clean``) and the pandas reference (``read_extract``) read."""
    source = messy_day(3, 120)
    stage(tmp_path / "text", source, 10_000, monkeypatch)
    stage(tmp_path / "parquet", source, 0, monkeypatch)
    text, parquet = staging.read_clean(tmp_path / "text"), staging.read_clean(tmp_path / "parquet")
    pd.testing.assert_frame_equal(text.rows, parquet.rows)
    pd.testing.assert_frame_equal(text.rejects, parquet.rejects)
    assert (text.source_rows, text.source_watermark_utc, text.duplicates_dropped) == (
        parquet.source_rows, parquet.source_watermark_utc, parquet.duplicates_dropped,
    )  # fmt: skip
    extracts = [staging.read_extract(tmp_path / name) for name in ("text", "parquet")]
    assert [e.source_watermark_utc for e in extracts] == [WATERMARK, WATERMARK]
    cleaned = [clean_orders(e.frame, partition=DAY) for e in extracts]
    pd.testing.assert_frame_equal(cleaned[0].rows, cleaned[1].rows)
    pd.testing.assert_frame_equal(cleaned[0].rejects, cleaned[1].rejects)


def test_the_format_follows_the_day_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most the limit in one batch: text. Over it, or a second batch from the cursor: parquet."""
    source = order_columns(messy_day(5, 6))
    monkeypatch.setenv(TEXT_ROWS_ENV, str(len(source["row_id"])))

    def staged(name: str, batches: list[dict[str, list[Any]]]) -> str:
        path, _rows = staging.write_extract_stream(tmp_path / name, batches)
        return path.name

    def cut(start: int, end: int) -> dict[str, list[Any]]:
        return {c: v[start:end] for c, v in source.items()}

    size = len(source["row_id"])
    assert staged("at-limit", [source]) == "extract.tsv"
    assert staged("empty", []) == "extract.tsv"
    assert staged("two-batches", [cut(0, 3), cut(3, size)]) == "extract.parquet"
    # Values the parquet way converts (a NaN as NULL, a pandas time): staged as parquet.
    assert (
        staged("nan", [{**source, "customer_id": [float("nan"), *source["customer_id"][1:]]}])
        == "extract.parquet"
    )
    stamp = pd.Timestamp(source["created_at_utc"][0])
    assert staged("pandas-time", [{**source, "created_at_utc": [stamp, *source["created_at_utc"][1:]]}]) == (
        "extract.parquet"
    )
    monkeypatch.setenv(TEXT_ROWS_ENV, str(size - 1))
    assert staged("over-limit", [source]) == "extract.parquet"
    for name in ("at-limit", "two-batches", "over-limit", "nan", "pandas-time"):
        assert len(staging.read_extract(tmp_path / name).frame) == size
    assert staging.read_extract(tmp_path / "nan").frame["customer_id"].iloc[0] is None


def test_bad_extract_values_are_refused_as_parquet_refuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never staged as NULL or as something else: the same error either way, nothing written."""
    good = order_columns(messy_day(6, 3))
    aware = dt.datetime(2024, 10, 27, 9, tzinfo=dt.timezone.utc)
    for column, value in [
        ("order_id", 17), ("amount", 12.5), ("row_id", None), ("row_id", True), ("row_id", "5"),
        ("row_id", 2**63), ("row_id", -(2**63) - 1),
        ("created_at_utc", aware), ("ingested_at_utc", "2024-10-27"), ("created_at_utc", dt.date(2024, 10, 27)),
    ]:  # fmt: skip
        batch = {**good, column: [value, *good[column][1:]]}
        errors = []
        for limit in ("10000", "0"):
            monkeypatch.setenv(TEXT_ROWS_ENV, limit)
            folder = tmp_path / f"{column}-{value!r}-{limit}"
            with pytest.raises((TypeError, ValueError)) as caught:
                staging.write_extract_stream(folder, [batch])
            errors.append((type(caught.value), str(caught.value)))
            assert not folder.exists() or not [p for p in folder.iterdir() if not p.name.startswith(".")]
        assert errors[0] == errors[1], (column, value)


def test_of_two_extracts_in_one_folder_the_later_read_is_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tries of one run that staged the day in different formats (the day crossed the limit
    between them): clean takes the extract that read the shop later, whichever format it is."""
    small, large = order_columns(messy_day(8, 5)), order_columns(messy_day(9, 40))
    early, late = WATERMARK, WATERMARK + dt.timedelta(minutes=5)
    for text_read, parquet_read in ((early, late), (late, early), (early, early)):
        folder = tmp_path / f"{text_read:%M}-{parquet_read:%M}"
        monkeypatch.setenv(TEXT_ROWS_ENV, "10000")
        staging.write_extract_stream(folder, [small], source_watermark_utc=text_read)
        monkeypatch.setenv(TEXT_ROWS_ENV, "0")
        staging.write_extract_stream(folder, [large], source_watermark_utc=parquet_read)
        monkeypatch.setenv(TEXT_ROWS_ENV, "10000")
        summary = staging.clean_extract(folder, partition=DAY, processing_version="v")
        expected = small if text_read >= parquet_read else large
        assert summary.source_rows == len(expected["row_id"])
        assert staging.read_clean(folder).source_watermark_utc == max(text_read, parquet_read)


def test_rows_and_rejects_of_different_tries_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b"):
        stage(tmp_path / name, messy_day(10, 30), 10_000, monkeypatch)
    (tmp_path / "b" / "rejects.tsv").replace(tmp_path / "a" / "rejects.tsv")
    with (
        pytest.raises(staging.StagingMismatchError, match=r"rows\.tsv .* and rejects\.tsv"),
        staging.open_clean(tmp_path / "a"),
    ):
        pass


def test_a_text_extract_that_spills_is_cleaned_through_arrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets smaller than the day (a test's bucket_rows): the spilled clean, parquet output."""
    source = messy_day(11, 200)
    stage(tmp_path / "memory", source, 10_000, monkeypatch)
    monkeypatch.setenv(TEXT_ROWS_ENV, "10000")
    staging.write_extract_stream(
        tmp_path / "spilled", [order_columns(source)], source_watermark_utc=WATERMARK
    )
    staging.clean_extract(tmp_path / "spilled", partition=DAY, processing_version="v", bucket_rows=13)
    assert json.loads((tmp_path / "spilled" / "manifest.json").read_text())["format"] == "parquet"
    memory, spilled = staging.read_clean(tmp_path / "memory"), staging.read_clean(tmp_path / "spilled")
    pd.testing.assert_frame_equal(memory.rows, spilled.rows)
    pd.testing.assert_frame_equal(memory.rejects, spilled.rejects)


def test_python_rows_are_refused_on_a_day_that_spills(tmp_path: Path) -> None:
    with DayCleaner(partition=DAY, expected_rows=100, workdir=str(tmp_path), bucket_rows=10) as cleaner:
        with pytest.raises(RuntimeError, match="add_rows\\(\\) on a day that spills"):
            cleaner.add_rows([])
        cleaner.dedupe()
        with pytest.raises(RuntimeError, match="sales_rows\\(\\) on a day that spilled"):
            cleaner.sales_rows()
        assert list(cleaner.rows()) == []  # the refusal did not count as the one read


@pytest.mark.parametrize("plain_rows", [3, 100_000])
def test_digests_of_python_rows_equal_the_definition(
    monkeypatch: pytest.MonkeyPatch, plain_rows: int
) -> None:
    """Alone, mixed with frames, and past the point where they join the numpy runs."""
    from onceflow.sales import checksum

    monkeypatch.setattr(checksum, "_PLAIN_ROWS", plain_rows)
    frame = clean_orders(messy_day(12, 80), partition=DAY).rows
    records = frame_records(frame, SALES_COLUMNS)
    alone, mixed = RowDigests(SALES_COLUMNS), RowDigests(SALES_COLUMNS)
    for start in range(0, len(records), 7):
        alone.add_rows(records[start : start + 7])
    mixed.add_rows(records[:10])
    mixed.add(frame.iloc[10:])
    assert alone.rows == mixed.rows == len(records)
    assert (
        alone.hexdigest()
        == mixed.hexdigest()
        == rows_checksum(records)
        == frame_checksum(frame, SALES_COLUMNS)
    )
    assert RowDigests(SALES_COLUMNS).hexdigest() == rows_checksum([])


#: ids cleaning keeps that COPY's text format must escape (a raw CR or LF ends a COPY line).
ESCAPED_IDS = ["c\rr", "l\nf", "t\tb", "b\\s", "\\N", "\\.", "ends\\", "u\x1fs", "caf\u00e9", "x" * 64]


def escaped_id_day() -> pd.DataFrame:
    """Valid sales whose order and customer ids hold what COPY text must escape, NULL and ``""``
    customers among them, times with and without microseconds."""
    rows = []
    for i, oid in enumerate(ESCAPED_IDS):
        for j, customer in enumerate([oid, None, "", "\\N"]):
            at = dt.datetime(2024, 10, 27, 10, 0, 0, 7 * (i % 2))
            order = f"{oid[:60]}{j:02d}{i:02d}"[:64]
            rows.append((len(rows) + 1, order, "sale", None, customer, at, at, "10.00", "EUR"))
    return pd.DataFrame(rows, columns=list(ORDER_COLUMNS)).astype({"row_id": "int64"})


def test_no_row_line_of_a_text_file_holds_a_raw_line_break() -> None:
    """COPY's text format ends a line at a CR as at a LF: both stay escaped inside values."""
    rows = [(None, v, v, v) for v in ESCAPED_IDS]
    data = encode(rows, REJECT_COLUMNS, REJECT_KINDS, {})
    assert b"\r" not in data
    assert data.count(b"\n") == 1 + len(rows)
    assert all(line.count(b"\t") == 3 for line in data.split(b"\n")[1:-1])


def test_ids_copy_must_escape_are_stored_unchanged_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sales_db_url: str
) -> None:
    """Staged as text and as parquet, loaded by the load's own path (COPY on PostgreSQL), read
    back with plain SQL: the ids as the reference clean has them."""
    import sqlalchemy as sa

    source = escaped_id_day()
    whole = clean_orders(source, partition=DAY)
    assert len(whole.rows) == len(source)  # every row valid: the ids reach the warehouse
    expected = sorted(zip(whole.rows["order_id"], whole.rows["customer_id"], strict=True), key=repr)
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    for limit in (10_000, 0):
        folder = tmp_path / str(limit)
        assert stage(folder, source, limit, monkeypatch) == ("text" if limit else "parquet")
        with staging.open_clean(folder) as staged:
            audit = store.overwrite(
                store.acquire_lease(DAY, run_id=f"r{limit}", try_number=1),
                staged.load_batches(),
                staged.reject_load_batches(),
                processing_version=staged.processing_version,
            )
        with store.engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT order_id, customer_id FROM daily_sales")).all()
        assert sorted(map(tuple, stored), key=repr) == expected, limit
        assert audit.checksum == frame_checksum(whole.rows, SALES_COLUMNS), limit


def test_a_day_of_exactly_the_limit_is_staged_as_text_and_one_row_more_as_parquet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = messy_day(13, 20)
    for limit, expected in ((len(source), "text"), (len(source) - 1, "parquet")):
        folder = tmp_path / str(limit)
        assert stage(folder, source, limit, monkeypatch) == expected, limit
        suffix = "tsv" if expected == "text" else "parquet"
        assert {p.name for p in folder.iterdir()} == {
            f"extract.{suffix}",
            f"rows.{suffix}",
            f"rejects.{suffix}",
            "manifest.json",
        }


def test_a_manifest_of_an_unknown_format_is_refused_not_read_as_parquet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest another version wrote (a format this one does not read) beside parquet files an
    earlier try left: the load must not take those stale files for the staged day."""
    stage(tmp_path, messy_day(14, 30), 0, monkeypatch)  # rows.parquet, rejects.parquet of a first try
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format": "text-2"}))
    with pytest.raises(staging.StagingFormatError, match="format 'text-2'"):
        staging.read_clean(tmp_path)
    with pytest.raises(staging.StagingFormatError, match="format 'text-2'"), staging.open_clean(tmp_path):
        pass
    del manifest["format"]  # a manifest written before text staging: parquet
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with staging.open_clean(tmp_path) as staged:
        assert staged.row_count == manifest["rows"]
