"""Reading weight bytes, one tensor (or one expert's slice of a stacked tensor) at a time, and writing them out.

Every read checks what the model promises against what is on disk: a missing external data file or one shorter than
a tensor's offset + length is an InputError naming the file and the tensor, before anything is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ortgate.errors import InputError

# Element bytes are moved, never computed on: bfloat16 and float16 travel as 16-bit integers.
_ITEMSIZE: dict[int, int] = {
    TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
    TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.INT16: 2, TensorProto.UINT16: 2, TensorProto.INT32: 4,
    TensorProto.UINT32: 4, TensorProto.INT64: 8, TensorProto.UINT64: 8, TensorProto.BOOL: 1,
    TensorProto.FLOAT8E4M3FN: 1, TensorProto.FLOAT8E5M2: 1,
}
# Element types narrower than a byte, packed (two 4-bit or four 2-bit elements a byte, the last byte padded): moved
# as bytes, whole tensors only.
_PACKED_BITS: dict[int, int] = {
    getattr(TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(TensorProto, name)
}
_RAW_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
COPY_CHUNK = 64 * 2**20  # bytes moved per read when a tensor is copied as it is
INLINE_LIMIT = 1024  # tensors smaller than this stay in model.onnx (what onnx.save_as_external_data does)
ALIGNMENT = 64


def itemsize(data_type: int) -> int | None:
    return _ITEMSIZE.get(data_type)


def external_info(tensor: onnx.TensorProto) -> dict[str, str] | None:
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in tensor.external_data}


@dataclass(frozen=True)
class TensorBytes:
    """Where one tensor's bytes are: an external file range, or the protobuf itself."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    file: Path | None  # None: inline
    offset: int
    nbytes: int

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self.data_type, 1)

    @property
    def packed(self) -> bool:
        """Elements narrower than a byte: the tensor is moved as `nbytes` bytes, never sliced."""
        return self.data_type in _PACKED_BITS


class WeightSource:
    """The weights of one model: where each initializer's bytes live, checked before they are read."""

    def __init__(self, model: onnx.ModelProto, model_path: str | Path):
        self.model_path = Path(model_path)
        self.folder = self.model_path.parent
        self.tensors: dict[str, onnx.TensorProto] = {t.name: t for t in model.graph.initializer}
        self._sizes: dict[Path, int] = {}

    def locate(self, name: str) -> TensorBytes:
        tensor = self.tensors[name]
        size = _ITEMSIZE.get(tensor.data_type)
        bits = _PACKED_BITS.get(tensor.data_type)
        if size is None and bits is None:
            raise InputError(f"tensor {name!r} has data type {tensor.data_type}, which `ortgate fix` cannot move",
                             self.model_path)
        numel = 1
        for d in tensor.dims:
            numel *= int(d)
        if any(d < 0 for d in tensor.dims):
            raise InputError(f"tensor {name!r} has a negative dimension {list(tensor.dims)}", self.model_path)
        nbytes = numel * size if size is not None else (numel * (bits or 8) + 7) // 8
        info = external_info(tensor)
        if info is None:
            return TensorBytes(name, tensor.data_type, tuple(tensor.dims), None, 0, nbytes)
        location = info.get("location", "")
        path = self._data_file(name, location)
        offset = self._integer(name, info, "offset", "0")
        length = self._integer(name, info, "length", str(nbytes))
        if length < nbytes:
            raise InputError(f"tensor {name!r}: external data length {length} is less than its {nbytes} bytes",
                             path)
        available = self._size(path, name)
        if offset + nbytes > available:
            raise InputError(f"truncated: tensor {name!r} needs bytes {offset}..{offset + nbytes} but the file has "
                             f"{available}", path)
        return TensorBytes(name, tensor.data_type, tuple(tensor.dims), path, offset, nbytes)

    def _data_file(self, name: str, location: str) -> Path:
        """The external data file of tensor `name`: a plain relative file name inside the model's folder (what ONNX
        Runtime reads), checked on the text before anything is opened."""
        problem = None
        parts = location.split("/")
        if not location or not location.isprintable():
            problem = "is empty or holds control characters"
        elif location.startswith(("/", "~")):
            problem = "is not a path relative to the model's folder"
        elif any(part in ("", "..") for part in parts) or os.path.normpath(location) == ".":
            problem = "is not a file path inside the model's folder (a '..' or empty part, or the folder itself)"
        if problem is not None:
            raise InputError(f"tensor {name!r}: external data location {location!r} {problem}", self.model_path)
        path = self.folder / location
        try:
            real = path.resolve(strict=False)
            inside = real.is_relative_to(self.folder.resolve())
        except (OSError, RuntimeError) as exc:
            raise InputError(f"tensor {name!r}: external data location {location!r} cannot be resolved "
                             f"({getattr(exc, 'strerror', None) or exc})", self.model_path) from None
        if not inside:
            raise InputError(f"tensor {name!r}: external data location {location!r} leads outside the model's "
                             f"folder (through a symlink)", self.model_path)
        return path

    def _integer(self, name: str, info: dict[str, str], key: str, default: str) -> int:
        text = info.get(key) or default
        if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
            raise InputError(f"tensor {name!r}: external data {key} {text[:40]!r} is not an integer from 0 to "
                             "2^63 - 1", self.model_path)
        return int(text)

    def check_external(self) -> None:
        """Every tensor kept in external data points into a regular file of the model's folder, within its size:
        checked before the fusions hand the model to onnx_ir, which reads them its own way."""
        self.check_all(name for name, t in self.tensors.items() if external_info(t) is not None)

    def _size(self, path: Path, name: str) -> int:
        if path not in self._sizes:
            try:
                self._sizes[path] = path.stat().st_size if path.is_file() else (-2 if path.exists() else -1)
            except OSError:
                self._sizes[path] = -1
        if self._sizes[path] == -2:
            raise InputError(f"external weights of tensor {name!r}: not a regular file", path)
        if self._sizes[path] < 0:
            raise InputError(f"external weights of tensor {name!r} are missing: no such file", path)
        return self._sizes[path]

    def check_all(self, names) -> None:
        """Locate every tensor that will be read: a missing or short file fails before anything is written."""
        for name in names:
            self.locate(name)

    def read(self, name: str, *, index: int | None = None) -> np.ndarray:
        """The tensor (or its `index`-th slice along axis 0) as raw elements of its item size, shaped."""
        where = self.locate(name)
        if where.packed:
            if index is not None:
                raise InputError(f"tensor {name!r} packs elements narrower than a byte: `ortgate fix` moves it whole "
                                 "and cannot take one slice of it", self.model_path)
            return self._packed_bytes(where)
        dims = where.dims
        raw = _RAW_DTYPE[where.itemsize]
        if index is not None:
            if not dims or not 0 <= index < dims[0]:
                raise InputError(f"tensor {name!r} has no slice {index}", self.model_path)
            dims = dims[1:]
        count = 1
        for d in dims:
            count *= d
        start = (index or 0) * count * where.itemsize
        if where.file is None:
            return self._inline(name, raw)[start // where.itemsize: start // where.itemsize + count].reshape(dims)
        with open(where.file, "rb") as f:
            f.seek(where.offset + start)
            data = np.fromfile(f, dtype=raw, count=count)
        if data.size != count:
            raise InputError(f"truncated: tensor {name!r} ends early", where.file)
        return data.reshape(dims)

    def _packed_bytes(self, where: TensorBytes) -> np.ndarray:
        """A packed tensor's bytes, flat (uint8)."""
        if where.file is None:
            tensor = self.tensors[where.name]
            if not tensor.HasField("raw_data") and _typed_fields_used(tensor):
                raise InputError(f"tensor {where.name!r} keeps its packed elements in typed fields, not raw bytes: "
                                 "`ortgate fix` cannot move it", self.model_path)
            data = np.frombuffer(tensor.raw_data, dtype=np.uint8)
        else:
            with open(where.file, "rb") as f:
                f.seek(where.offset)
                data = np.fromfile(f, dtype=np.uint8, count=where.nbytes)
        if data.size != where.nbytes:
            raise InputError(f"truncated: tensor {where.name!r} has {data.size} bytes, not {where.nbytes}",
                             where.file or self.model_path)
        return data

    def _inline(self, name: str, raw) -> np.ndarray:
        tensor = self.tensors[name]
        if tensor.HasField("raw_data") or not _typed_fields_used(tensor):
            return np.frombuffer(tensor.raw_data, dtype=raw)
        # Typed fields (float_data, int64_data, ...) of a small inline tensor: decode, then view as raw bytes.
        array = numpy_helper.to_array(tensor)
        return np.ascontiguousarray(array).view(raw).reshape(-1)

    def copy_into(self, name: str, out: DataFile) -> tuple[int, int]:
        """Copy a tensor's bytes as they are into `out`, in chunks; (offset, length) there."""
        where = self.locate(name)
        if where.file is None:
            data = self._packed_bytes(where) if where.packed else self._inline(name, _RAW_DTYPE[where.itemsize])
            return out.write(data.tobytes())
        offset = out.begin()
        remaining = where.nbytes
        with open(where.file, "rb") as f:
            f.seek(where.offset)
            while remaining:
                chunk = f.read(min(COPY_CHUNK, remaining))
                if not chunk:
                    raise InputError(f"truncated: tensor {name!r} ends early", where.file)
                out.append(chunk)
                remaining -= len(chunk)
        return offset, where.nbytes


def _typed_fields_used(tensor: onnx.TensorProto) -> bool:
    return any(len(getattr(tensor, f)) for f in ("float_data", "int32_data", "int64_data", "double_data",
                                                   "uint64_data", "string_data"))


class DataFile:
    """The output's external data file, written append-only."""

    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "wb")
        self.size = 0

    def begin(self) -> int:
        pad = (-self.size) % ALIGNMENT
        if pad:
            self._f.write(b"\0" * pad)
            self.size += pad
        return self.size

    def append(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self.size += len(data)

    def write(self, data: bytes | memoryview) -> tuple[int, int]:
        offset = self.begin()
        self.append(data)
        return offset, len(data)

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


class MemorySink:
    """DataFile's interface, into memory: a small fused tensor's bytes, kept inline while onnxscript runs (its
    optimizer compares small initializers by value)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def begin(self) -> int:
        return 0

    def append(self, data: bytes | memoryview) -> None:
        self.chunks.append(bytes(data))

    def value(self) -> bytes:
        return b"".join(self.chunks)


def set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Point `tensor` at a range of the output's data file (its inline bytes, if any, are dropped)."""
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
