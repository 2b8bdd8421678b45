"""Arrow arrays and scalars from Python values, and Python values from Arrow arrays, without
importing pandas.

``pyarrow.array()`` and ``pyarrow.scalar()`` (and every ``pyarrow.compute`` call given a plain
Python value, which it wraps with ``pyarrow.scalar()``) first ask whether the value is a pandas
object, and that question imports pandas when it is installed: about 0.2 s of CPU in a task
process that never uses it. daily_sales' extract and load stage and format rows with Arrow alone,
so they build their arrays here, from buffers (``pyarrow.Array.from_buffers``, which asks
nothing), and their scalars as one-value arrays' elements. The way back is no better: every
``to_numpy()`` imports pandas, and ``take()`` given a numpy array does, so the clean task reads
its columns from their buffers here (:func:`int64_values`, :func:`texts`, :func:`datetimes`) and
takes rows by :func:`indices`. ``tests/integration/test_sales_tasks_without_pandas.py`` runs every
daily_sales task with pandas refused.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from typing import Any

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = _EPOCH.date().toordinal()


def _validity(values: Sequence[object]) -> tuple[Any, int]:
    """The validity bitmap of ``values`` (None where every value is present) and the null count."""
    import numpy as np
    import pyarrow as pa

    if None not in values:  # the common case, asked in C
        return None, 0
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    nulls = len(values) - int(present.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(present, bitorder="little").tobytes()), nulls


#: the range of a 64-bit integer (``row_id``, a warehouse ``bigint``).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def is_int64(value: int) -> bool:
    """Whether an integer fits in 64 bits."""
    return INT64_MIN <= value <= INT64_MAX


def int64s(values: Sequence[int | None], kind: Any = None) -> Any:
    """An Arrow array of 64-bit integers (or of ``kind``, a 64-bit type), None as null.

    :raises TypeError: a value is not an integer (a bool, a float, a string, a Decimal).
    :raises OverflowError: a value is outside the 64-bit range (naming it, not numpy's C long).
    """
    import numpy as np
    import pyarrow as pa

    if not set(map(type, values)) <= {int, type(None)}:  # else (bool, an int subclass) ask each
        for value in values:
            if value is not None and (type(value) is bool or not isinstance(value, int)):
                raise TypeError(f"{value!r:.60} is not an integer")
    validity, nulls = _validity(values)
    try:
        data = np.fromiter((0 if v is None else v for v in values), dtype=np.int64, count=len(values))
    except OverflowError:
        big = next(v for v in values if v is not None and not is_int64(v))
        raise OverflowError(f"{big!r:.60} is outside the 64-bit integer range") from None
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


def strings(values: Sequence[str | None]) -> Any:
    """An Arrow ``string`` array of ``values``, None as null.

    :raises UnicodeEncodeError: a value holds a lone surrogate (not UTF-8: stage it as binary).
    """
    import pyarrow as pa

    encoded = [None if v is None else v.encode("utf-8") for v in values]
    return binaries(encoded).view(pa.string())


def dates(values: Sequence[dt.date | None]) -> Any:
    """An Arrow ``date32`` array of ``values``, None as null.

    :raises TypeError: a value is not a ``date`` (a ``datetime`` is refused: its time would be lost).
    """
    import numpy as np
    import pyarrow as pa

    days: list[int] = []
    for value in values:
        if value is None:
            days.append(0)
        elif not isinstance(value, dt.date) or isinstance(value, dt.datetime):
            raise TypeError(f"{value!r:.60} is not a date")
        else:
            days.append(value.toordinal() - _EPOCH_DAY)
    validity, nulls = _validity(values)
    data = np.array(days, dtype=np.int32)
    return pa.Array.from_buffers(pa.date32(), len(values), [validity, pa.py_buffer(data)], nulls)


def text(value: str) -> Any:
    """``value`` as an Arrow string scalar (what ``pyarrow.compute`` takes for a plain ``str``)."""
    import numpy as np
    import pyarrow as pa

    data = value.encode()
    offsets = np.array([0, len(data)], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])[0]


def indices(positions: Any) -> Any:
    """Row positions (a sequence of ints or a numpy array) as an Arrow int64 array, for ``take()``."""
    import numpy as np
    import pyarrow as pa

    data = np.ascontiguousarray(positions, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)], 0)


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    return any(f(kind) for f in (pa.types.is_binary, pa.types.is_string, pa.types.is_large_binary,
                                 pa.types.is_large_string))  # fmt: skip


def _chunks(column: Any) -> list[Any]:
    return [c for c in (column.chunks if hasattr(column, "chunks") else [column]) if len(c)]


def _present(chunk: Any) -> list[bool] | None:
    """Which values of ``chunk`` are not null (None when none is)."""
    import numpy as np

    bitmap = chunk.buffers()[0]
    if bitmap is None or not chunk.null_count:
        return None
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[chunk.offset : chunk.offset + len(chunk)].astype(bool).tolist()


def int64_values(column: Any) -> Any:
    """An integer or timestamp array (or chunked array) without nulls as a numpy int64 array.

    :raises ValueError: it holds a null.
    :raises TypeError: it holds neither integers nor timestamps.
    """
    import numpy as np
    import pyarrow as pa

    parts = []
    for chunk in _chunks(column):
        if chunk.null_count:
            raise ValueError(f"a {chunk.type} column holds {chunk.null_count} nulls")
        if not (pa.types.is_int64(chunk.type) or pa.types.is_timestamp(chunk.type)):
            # Read as they are, an int32's buffer would be taken 8 bytes a value: two values as one.
            if not pa.types.is_integer(chunk.type):
                raise TypeError(f"a {chunk.type} column is not integers")
            chunk = chunk.cast(pa.int64())
        parts.append(
            np.frombuffer(chunk.buffers()[1], dtype=np.int64, count=len(chunk), offset=chunk.offset * 8)
        )
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def texts(column: Any) -> list[str | None]:
    """A ``binary`` or ``string`` array (or chunked array; another type Arrow casts to binary, such
    as ``null``) as ``str`` values, None for null; bytes that are not UTF-8 become lone surrogates
    (``surrogateescape``), as the shop engine reads them."""
    import numpy as np
    import pyarrow as pa

    out: list[str | None] = []
    for chunk in _chunks(column):
        if not _is_text(chunk.type):
            # A column of NULLs alone, as extracts staged through pandas typed them (``null``),
            # or one dictionary-encoded: the values as binary (offsets and data buffers).
            chunk = chunk.cast(pa.binary())
        wide = pa.types.is_large_binary(chunk.type) or pa.types.is_large_string(chunk.type)
        width = 8 if wide else 4
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(
            offsets_buffer,
            dtype=np.int64 if wide else np.int32,
            count=len(chunk) + 1,
            offset=chunk.offset * width,
        ).tolist()
        data = data_buffer.to_pybytes()[offsets[0] : offsets[-1]] if data_buffer is not None else b""
        if data.isascii():  # one decode, then slices (byte offsets are character offsets)
            text, start = data.decode("ascii"), offsets[0]
            values: list[str | None] = [text[a - start : b - start] for a, b in itertools.pairwise(offsets)]
        else:
            view, start = memoryview(data), offsets[0]
            values = [
                str(view[a - start : b - start], "utf-8", "surrogateescape")
                for a, b in itertools.pairwise(offsets)
            ]
        present = _present(chunk)
        if present is not None:
            values = [v if p else None for v, p in zip(values, present, strict=True)]
        out += values
    return out


def datetimes(column: Any) -> list[dt.datetime | None]:
    """A timestamp array (or chunked array) as naive ``datetime`` values (microseconds), None for
    null.

    :raises pyarrow.ArrowInvalid: a value has nanoseconds (it would be cut).
    """
    import numpy as np
    import pyarrow as pa

    out: list[dt.datetime | None] = []
    for chunk in _chunks(column):
        if chunk.type != pa.timestamp("us"):
            chunk = chunk.cast(pa.timestamp("us"))
        micros = np.frombuffer(chunk.buffers()[1], dtype=np.int64, count=len(chunk), offset=chunk.offset * 8)
        values: list[dt.datetime | None] = micros.view("datetime64[us]").astype(object).tolist()
        present = _present(chunk)
        if present is not None:
            values = [v if p else None for v, p in zip(values, present, strict=True)]
        out += values
    return out
