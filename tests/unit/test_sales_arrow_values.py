"""onceflow.sales.arrow_values builds the same arrays as ``pyarrow.array()``, without pandas.

Generated values (nulls anywhere, empty batches, the whole datetime range, surrogate-escaped
bytes, int64's bounds) are compared with what ``pyarrow.array()`` builds from the same list, and a
fresh interpreter checks that building them never imports pandas.
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
        import pyarrow.compute as pc
        t = arrow_values.binaries([b"a", None]).cast("string")
        arrow_values.int64s([1, None]); arrow_values.timestamps_us([dt.datetime(2024, 1, 1), None])
        pc.binary_join_element_wise(pc.fill_null(t, arrow_values.text("x")), t, arrow_values.text("\\t"))
        print("pandas" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr
