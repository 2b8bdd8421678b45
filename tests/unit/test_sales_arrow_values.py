"""onceflow.sales.arrow_values builds the same arrays as ``pyarrow.array()``, and reads back the
same values as ``to_pylist()``, without pandas.

Generated values (nulls anywhere, empty batches, the whole datetime range, surrogate-escaped
bytes, int64's bounds) are compared with what ``pyarrow.array()`` builds from the same list; the
readers are given sliced chunks (a buffer offset) of chunked arrays of every text type; a fresh
interpreter checks that building and reading never import pandas.
"""

from __future__ import annotations

import datetime as dt
import random
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from onceflow.sales import arrow_values


def _values(rng: random.Random, make: object, n: int, null_share: float) -> list[object]:
    return [None if rng.random() < null_share else make() for _ in range(n)]  # type: ignore[operator]


@pytest.mark.parametrize("seed", range(40))
def test_generated_columns_equal_pyarrows_own(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 7, 8, 9, 63, 64, 65, 1000])
    nulls = rng.choice([0.0, 0.0, 0.1, 0.5, 1.0])

    ints = _values(
        rng, lambda: rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randrange(-(10**12), 10**12)]), n, nulls
    )
    got = arrow_values.int64s(ints)  # type: ignore[arg-type]
    assert got.equals(pa.array(ints, type=pa.int64())) and got.null_count == ints.count(None)
    got.validate(full=True)

    span = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - dt.datetime(1, 1, 1)) // dt.timedelta(
        microseconds=1
    )
    times = _values(
        rng, lambda: dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(span + 1)), n, nulls
    )
    got = arrow_values.timestamps_us(times)  # type: ignore[arg-type]
    assert got.equals(pa.array(times, type=pa.timestamp("us")))
    assert got.to_pylist() == times
    got.validate(full=True)

    texts = _values(
        rng,
        lambda: rng.choice(["", "O1", "14.02", "\t\\\n", "ünï", "\udcff", "x" * rng.randrange(300)]).encode(
            "utf-8", "surrogateescape"
        ),
        n,
        nulls,
    )
    got = arrow_values.binaries(texts)  # type: ignore[arg-type]
    assert got.equals(pa.array(texts, type=pa.binary())) and got.to_pylist() == texts
    got.validate(full=True)


def _utf8(text: object) -> bool:
    try:
        str(text).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _sliced_chunks(rng: random.Random, array: pa.Array) -> pa.ChunkedArray:
    """``array`` cut into chunks, most of them slices of a longer array that starts with nulls (so
    a reader that ignores a chunk's offset reads the nulls' bits, offsets and zeros instead)."""
    chunks, start = [], 0
    while start < len(array):
        end = min(len(array), start + rng.randrange(1, 70))
        piece, before = array.slice(start, end - start), rng.randrange(0, 12)
        chunks.append(
            pa.concat_arrays([pa.nulls(before, array.type), piece]).slice(before) if before else piece
        )
        start = end
    return pa.chunked_array(chunks, type=array.type)


@pytest.mark.parametrize("seed", range(40))
def test_values_read_back_equal_pyarrows_own(seed: int) -> None:
    """The readers against ``to_pylist()`` (text decoded with surrogateescape, as the shop reads)."""
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 7, 8, 9, 63, 64, 65, 500])
    nulls = rng.choice([0.0, 0.0, 0.1, 0.5, 1.0])

    words = ["", "O1", "14.02", "\t\\\n", "ünï", "\udcff", "a\udc80b", "\x00", "x" * rng.randrange(300)]
    texts = _values(rng, lambda: rng.choice(words), n, nulls)
    raw = [None if t is None else t.encode("utf-8", "surrogateescape") for t in texts]  # type: ignore[union-attr]
    for kind in (pa.binary(), pa.large_binary()):
        column = _sliced_chunks(rng, pa.array(raw, type=kind))
        assert arrow_values.texts(column) == texts
    if all(t is None or _utf8(t) for t in texts):  # valid UTF-8: the string types too
        for kind in (pa.string(), pa.large_string()):
            column = _sliced_chunks(rng, pa.array(texts, type=kind))
            assert arrow_values.texts(column) == column.to_pylist() == texts

    span = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - dt.datetime(1, 1, 1)) // dt.timedelta(
        microseconds=1
    )
    times = _values(
        rng, lambda: dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(span + 1)), n, nulls
    )
    column = _sliced_chunks(rng, pa.array(times, type=pa.timestamp("us")))
    assert arrow_values.datetimes(column) == column.to_pylist() == times
    seconds = [None if t is None else t.replace(microsecond=0) for t in times]  # type: ignore[union-attr]
    assert arrow_values.datetimes(_sliced_chunks(rng, pa.array(seconds, type=pa.timestamp("s")))) == seconds

    ints = [rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(-(10**12), 10**12)]) for _ in range(n)]
    column = _sliced_chunks(rng, pa.array(ints, type=pa.int64()))
    assert arrow_values.int64_values(column).tolist() == ints
    positions = [rng.randrange(n) for _ in range(n)] if n else []
    table = pa.table({"i": column})
    assert table.take(arrow_values.indices(positions)).column("i").to_pylist() == [ints[i] for i in positions]

    want = [t if t is None or _utf8(t) else "ok" for t in texts]
    got = arrow_values.strings(want)  # type: ignore[arg-type]
    assert got.equals(pa.array(want, type=pa.string()))
    got.validate(full=True)
    days = _values(rng, lambda: dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3_652_059)), n, nulls)
    got = arrow_values.dates(days)  # type: ignore[arg-type]
    assert got.equals(pa.array(days, type=pa.date32())) and got.to_pylist() == days
    got.validate(full=True)


def test_columns_of_other_types_read_back_as_pyarrows_own() -> None:
    """Extracts staged through pandas (before the extract built its columns itself) typed a column
    of NULLs alone ``null``; a reader taking every column for binary or int64 failed on them or
    took an int32's buffer 8 bytes a value."""
    for column in (
        pa.nulls(5),
        pa.chunked_array([pa.nulls(3), pa.nulls(4).slice(1)]),
        pa.array(["EUR", None, "SEK", "EUR"]).dictionary_encode(),
        pa.array(["EUR", None, "SEK", "EUR"]).dictionary_encode().slice(1),
    ):
        assert arrow_values.texts(column) == column.to_pylist()
    for kind in (pa.int32(), pa.uint16(), pa.int8()):
        column = pa.chunked_array([pa.array(range(100), kind).slice(3, 50), pa.array([7, 8], kind)])
        assert arrow_values.int64_values(column).tolist() == column.to_pylist()
    with pytest.raises(TypeError, match="not integers"):
        arrow_values.int64_values(pa.array([1.5, 2.0]))


def test_a_null_in_an_integer_column_read_as_numbers_is_refused() -> None:
    with pytest.raises(ValueError, match="1 nulls"):
        arrow_values.int64_values(pa.chunked_array([pa.array([1, None, 3], type=pa.int64())]))


def test_a_timestamp_with_nanoseconds_is_refused_not_cut() -> None:
    column = pa.array([1_000_000_001], type=pa.timestamp("ns"))
    with pytest.raises(pa.ArrowInvalid):
        arrow_values.datetimes(column)


@pytest.mark.parametrize("bad", [dt.datetime(2024, 1, 1), "2024-01-01", 19000])
def test_a_value_that_is_not_a_date_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="not a date"):
        arrow_values.dates([dt.date(2024, 1, 1), bad])  # type: ignore[list-item]


def test_text_with_a_stray_byte_is_refused_as_a_string() -> None:
    with pytest.raises(UnicodeEncodeError):
        arrow_values.strings(["ok", "\udcff"])


@pytest.mark.parametrize("value", ["", "\t", "\\N", "ü", "\n"])
def test_a_text_scalar_acts_as_pyarrows_in_compute(value: str) -> None:
    column = pa.array(["a", None, "b\\c"])
    assert arrow_values.text(value).as_py() == value
    assert pc.fill_null(column, arrow_values.text(value)).equals(pc.fill_null(column, value))
    joined = pc.binary_join_element_wise(column, column, arrow_values.text(value))
    assert joined.equals(pc.binary_join_element_wise(column, column, value))


@pytest.mark.parametrize("bad", [True, 1.0, "1", b"1"])
def test_a_value_that_is_not_an_integer_is_refused_not_converted(bad: object) -> None:
    with pytest.raises(TypeError, match="not an integer"):
        arrow_values.int64s([1, bad])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "bad", [dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), dt.date(2024, 1, 1), "2024-01-01 00:00:00", 0]
)
def test_a_value_that_is_not_a_naive_datetime_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="not a naive datetime"):
        arrow_values.timestamps_us([dt.datetime(2024, 1, 1), bad])  # type: ignore[list-item]


def test_an_integer_beyond_int64_is_refused() -> None:
    with pytest.raises(OverflowError):
        arrow_values.int64s([2**63])


def test_building_never_imports_pandas() -> None:
    code = textwrap.dedent(
        """
        import datetime as dt, sys
        from onceflow.sales import arrow_values
        import pyarrow as pa
        import pyarrow.compute as pc
        t = arrow_values.binaries([b"a", None]).cast("string")
        arrow_values.int64s([1, None]); arrow_values.timestamps_us([dt.datetime(2024, 1, 1), None])
        pc.binary_join_element_wise(pc.fill_null(t, arrow_values.text("x")), t, arrow_values.text("\\t"))
        table = pa.table({"t": t, "i": arrow_values.int64s([2, 1]), "d": arrow_values.dates([dt.date(2024, 1, 1), None]),
                          "s": arrow_values.strings(["a", None]),
                          "ts": arrow_values.timestamps_us([dt.datetime(2024, 1, 1), None])})
        table = table.take(arrow_values.indices([1, 0]))
        arrow_values.texts(table.column("t")); arrow_values.datetimes(table.column("ts"))
        arrow_values.int64_values(table.column("i"))
        print("pandas" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr
