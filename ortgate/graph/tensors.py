"""The values of a small inline tensor (a Constant's shape, a Slice's bounds, an epsilon), decoded without numpy.

`small_tensor_values(t)` is `tuple(onnx.numpy_helper.to_array(t).reshape(-1).tolist())`, or None where that raises,
for the element types and encodings exporters write (raw little-endian bytes or the typed fields, of the float,
integer, bool and string types): Python's struct module reads them as numpy would, value for value. Any other
case (8-, 6-, 4- and 2-bit types, complex numbers, negative dims, integers out of their type's range in a typed
field) is handed to onnx's numpy_helper itself, so the answer is always numpy_helper's. Only small tensors are
ever decoded (the graph index bounds them); weights never are.
"""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

from ortgate.proto import dtype_names

# TensorProto.DataType numbers (fixed by the ONNX IR spec).
_FLOAT, _UINT8, _INT8, _UINT16, _INT16, _INT32, _INT64, _STRING, _BOOL = 1, 2, 3, 4, 5, 6, 7, 8, 9
_FLOAT16, _DOUBLE, _UINT32, _UINT64, _BFLOAT16 = 10, 11, 12, 13, 16

# dtype -> struct format of one little-endian element in raw_data.
_RAW_FORMATS = {
    _FLOAT: "f", _DOUBLE: "d", _FLOAT16: "e", _INT8: "b", _UINT8: "B", _INT16: "h", _UINT16: "H", _INT32: "i",
    _INT64: "q", _UINT32: "I", _UINT64: "Q", _BOOL: "?",
}
# Integer types held in int32_data (numpy_helper casts them from int32): their range.
_INT32_HELD_RANGES = {
    _INT8: (-(2**7), 2**7 - 1), _UINT8: (0, 2**8 - 1), _INT16: (-(2**15), 2**15 - 1), _UINT16: (0, 2**16 - 1),
    _INT32: (-(2**31), 2**31 - 1),
}

_NOT_HANDLED = object()


def small_tensor_values(t: Any) -> tuple | None:
    """Flattened values of an inline tensor, as onnx.numpy_helper.to_array gives them; None where it fails."""
    try:
        found = _decode(t)
    except Exception:
        return None
    if found is _NOT_HANDLED:
        return _numpy_helper_values(t)
    return found  # type: ignore[return-value]


def _decode(t: Any) -> tuple | None | object:
    if t.HasField("segment") or sys.byteorder != "little":
        return _NOT_HANDLED
    dtype = t.data_type
    if dtype not in dtype_names() or dtype == 0:  # numpy_helper raises on UNDEFINED and unknown types
        return None
    dims = tuple(t.dims)
    if any(d < 0 for d in dims):  # numpy's reshape reads -1 as "the rest": leave that to numpy
        return _NOT_HANDLED
    count = math.prod(dims)
    if t.HasField("raw_data") and dtype != _STRING:
        if dtype == _BFLOAT16:  # the upper half of a float32
            raw = t.raw_data
            if len(raw) % 2 or len(raw) // 2 != count:
                return None
            return _bfloat16(struct.unpack(f"<{count}H", raw))
        fmt = _RAW_FORMATS.get(dtype)
        if fmt is None:
            return _NOT_HANDLED
        raw = t.raw_data
        size = struct.calcsize(fmt)
        if len(raw) % size or len(raw) // size != count:  # numpy's frombuffer or reshape raises
            return None
        if dtype == _BOOL and any(b > 1 for b in raw):  # numpy keeps such bytes as they are
            return _NOT_HANDLED
        return struct.unpack(f"<{count}{fmt}", raw)
    values: Any
    if dtype == _FLOAT:
        values = tuple(t.float_data)
    elif dtype == _DOUBLE:
        values = tuple(t.double_data)
    elif dtype == _INT64:
        values = tuple(t.int64_data)
    elif dtype == _UINT64:
        values = tuple(t.uint64_data)
    elif dtype == _UINT32:
        values = tuple(t.uint64_data)
        if any(v > 2**32 - 1 for v in values):
            return _NOT_HANDLED
    elif dtype in _INT32_HELD_RANGES:
        values = tuple(t.int32_data)
        low, high = _INT32_HELD_RANGES[dtype]
        if any(v < low or v > high for v in values):
            return _NOT_HANDLED
    elif dtype == _BOOL:
        values = tuple(t.int32_data)
        if any(v not in (0, 1) for v in values):
            return _NOT_HANDLED
        values = tuple(bool(v) for v in values)
    elif dtype in (_FLOAT16, _BFLOAT16):  # the 16 bits of each element, held in int32_data
        bits = [v & 0xFFFF for v in t.int32_data]
        if dtype == _FLOAT16:
            values = struct.unpack(f"<{len(bits)}e", struct.pack(f"<{len(bits)}H", *bits))
        else:
            values = _bfloat16(bits)
    elif dtype == _STRING:
        values = tuple(s.decode("utf-8") for s in t.string_data)
        if any(v.endswith("\0") for v in values):  # numpy's fixed-width strings drop trailing NULs
            return _NOT_HANDLED
    else:
        return _NOT_HANDLED
    if len(values) != count:  # numpy's reshape raises
        return None
    return values


def _bfloat16(bits: Any) -> tuple:
    return struct.unpack(f"<{len(bits)}f", struct.pack(f"<{len(bits)}I", *(b << 16 for b in bits)))


def _numpy_helper_values(t: Any) -> tuple | None:
    """The rare tensor only onnx decodes (8-bit floats, packed 4-bit integers, ...): onnx's own helper."""
    try:
        import onnx
        from onnx import numpy_helper

        if not isinstance(t, onnx.TensorProto):  # ortgate.proto's class: onnx's helper reads its own
            t = onnx.TensorProto.FromString(t.SerializeToString())
        return tuple(numpy_helper.to_array(t).reshape(-1).tolist())
    except Exception:
        return None
