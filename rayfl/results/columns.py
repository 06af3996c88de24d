"""Python values to Arrow columns, built from numpy buffers rather than by `pa.array`.

Every `pa.array` call first asks whether its argument is a pandas object, and the first such
question imports pandas: 0.3-0.45 s of a short run's driver, at its first flush, for a library
the run never uses otherwise. The writer's columns are of five types only (null, bool, int64,
float64, string), whose Arrow layouts are plain: a validity bitmap and a values buffer (bits for
bool; offsets and bytes for strings). The arrays are the same as `pa.array` makes (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

_NUMPY = {pa.bool_(): np.bool_, pa.int64(): np.int64, pa.float64(): np.float64}
_FILL = {pa.bool_(): False, pa.int64(): 0, pa.float64(): 0.0}
_MAX_STRING_BYTES = 2**31 - 1  # a `string` array's int32 offsets


def column(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """`values` (each None or of `type_`'s Python type) as an Arrow array of `type_`; None is null."""
    n = len(values)
    if type_ == pa.null():
        return pa.nulls(n)
    valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=n)
    null_count = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    if type_ == pa.string():
        encoded = [b"" if v is None else v.encode() for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        if offsets[-1] > _MAX_STRING_BYTES:  # pa.array splits or widens such a column itself
            return pa.array(values, type=type_)
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
        return pa.Array.from_buffers(type_, n, buffers, null_count=null_count)
    if type_ not in _NUMPY:
        raise TypeError(f"no column builder for Arrow type {type_}")
    fill = _FILL[type_]
    dense = np.array([fill if v is None else v for v in values], dtype=_NUMPY[type_])
    data = np.packbits(dense, bitorder="little") if type_ == pa.bool_() else dense
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(data)], null_count=null_count)
