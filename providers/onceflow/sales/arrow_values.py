"""Arrow arrays and scalars from Python values, without importing pandas.

``pyarrow.array()`` and ``pyarrow.scalar()`` (and every ``pyarrow.compute`` call given a plain
Python value, which it wraps with ``pyarrow.scalar()``) first ask whether the value is a pandas
object, and that question imports pandas when it is installed: about 0.2 s of CPU in a task
process that never uses it. daily_sales' extract and load stage and format rows with Arrow alone,
so they build their arrays here, from buffers (``pyarrow.Array.from_buffers``, which asks
nothing), and their scalars as one-value arrays' elements. ``tests/integration/
test_sales_tasks_without_pandas.py`` runs both tasks with pandas refused.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

_EPOCH = dt.datetime(1970, 1, 1)


def _validity(values: Sequence[object]) -> tuple[Any, int]:
    """The validity bitmap of ``values`` (None where every value is present) and the null count."""
    import numpy as np
    import pyarrow as pa

    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    nulls = len(values) - int(present.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(present, bitorder="little").tobytes()), nulls


def int64s(values: Sequence[int | None], kind: Any = None) -> Any:
    """An Arrow array of 64-bit integers (or of ``kind``, a 64-bit type), None as null.

    :raises TypeError: a value is not an integer (a bool, a float, a string, a Decimal).
    """
    import numpy as np
    import pyarrow as pa

    for value in values:
        if value is not None and (type(value) is bool or not isinstance(value, int)):
            raise TypeError(f"{value!r:.60} is not an integer")
    validity, nulls = _validity(values)
    data = np.fromiter((0 if v is None else v for v in values), dtype=np.int64, count=len(values))
    return pa.Array.from_buffers(kind or pa.int64(), len(values), [validity, pa.py_buffer(data)], nulls)


def timestamps_us(values: Sequence[dt.datetime | None]) -> Any:
    """An Arrow ``timestamp[us]`` array of naive datetimes (read as UTC), None as null.

    :raises TypeError: a value is not a naive ``datetime``.
    """
    import pyarrow as pa

    micros: list[int | None] = []
    for value in values:
        if value is None:
            micros.append(None)
        elif not isinstance(value, dt.datetime) or value.tzinfo is not None:
            raise TypeError(f"{value!r:.60} is not a naive datetime")
        else:
            micros.append((value - _EPOCH) // dt.timedelta(microseconds=1))
    return int64s(micros, pa.timestamp("us"))


def binaries(values: Sequence[bytes | None]) -> Any:
    """An Arrow ``binary`` array of ``values``, None as null."""
    import numpy as np
    import pyarrow as pa

    validity, nulls = _validity(values)
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(
        np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values)), out=offsets[1:]
    )
    if offsets[-1] >= 2**31:  # binary's offsets are 32-bit; a batch is 50,000 rows of a few bytes
        raise ValueError(f"{offsets[-1]} bytes of text in one batch of {len(values)} values: over 2 GiB")
    data = b"".join(v for v in values if v is not None)
    buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers, nulls)


def text(value: str) -> Any:
    """``value`` as an Arrow string scalar (what ``pyarrow.compute`` takes for a plain ``str``)."""
    import numpy as np
    import pyarrow as pa

    data = value.encode()
    offsets = np.array([0, len(data)], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])[0]
