"""What the graph index holds per node and value: nodes (attributes kept serialized, decoded on first use),
value infos, initializer metadata (never their bytes) and summaries of small tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ortgate.errors import printable
from ortgate.graph.tensors import small_tensor_values
from ortgate.knowledge.kernels import op_key
from ortgate.proto import (
    ATTR_FLOAT,
    ATTR_FLOATS,
    ATTR_GRAPH,
    ATTR_GRAPHS,
    ATTR_INT,
    ATTR_INTS,
    ATTR_SPARSE_TENSOR,
    ATTR_SPARSE_TENSORS,
    ATTR_STRING,
    ATTR_STRINGS,
    ATTR_TENSOR,
    ATTR_TENSORS,
    ATTR_TYPE_PROTO,
    ATTR_TYPE_PROTOS,
    ATTR_UNDEFINED,
    DATA_EXTERNAL,
    dtype_names,
)

if TYPE_CHECKING:  # the models are duck-typed: onnx.ModelProto, or ortgate.proto's classes of the same schema
    import onnx

DEFAULT_DOMAIN = "ai.onnx"
MS_DOMAIN = "com.microsoft"

# Values larger than this are never decoded, even when stored inline.
_SMALL_CONSTANT_ELEMENTS = 64
# ... nor tensors whose protobuf is larger than this (a malformed dims field must not make us copy a huge blob).
_SMALL_CONSTANT_BYTES = 64 * 1024
# Attribute lists longer than this (a Constant's value_floats holding a weight) are not decoded.
_MAX_ATTRIBUTE_ELEMENTS = 1 << 20
def canonical_domain(domain: str) -> str:
    return DEFAULT_DOMAIN if domain in ("", DEFAULT_DOMAIN) else domain


_DTYPE_NAMES: dict[int, str | None] = {}


def dtype_name(elem_type: int) -> str | None:
    if not isinstance(elem_type, int) or isinstance(elem_type, bool):  # e.g. Cast's `to` written as a float
        return None
    name = _DTYPE_NAMES.get(elem_type, "")
    if name == "":
        known = dtype_names().get(elem_type) if elem_type else None
        name = _DTYPE_NAMES[elem_type] = known.lower() if known else None
    return name


@dataclass(frozen=True)
class ValueInfo:
    name: str
    dtype: str | None
    shape: tuple[int | str | None, ...] | None  # None: rank unknown; str: symbolic dim; None entry: unknown dim


class Initializer:
    """Metadata of a weight: dtype, dims, external or inline, the external data file (never opened).

    Read from the TensorProto when the index is built; the index keeps no protobuf object (the parsed model is
    freed once it is indexed). Its bytes are never read: a small inline tensor (a slice bound, a shape) is kept
    serialized and decoded on first use.
    """

    __slots__ = ("name", "dtype", "dims", "external", "location", "_length", "_small", "_values")

    dtype: str | None
    dims: tuple[int, ...]
    external: bool
    location: str | None  # the external data file the model names (never opened)

    def __init__(self, name: str, t: Any, *, dense: bool = True, locations: list[str] | None = None):
        """`locations`, when given, gets every external-data location entry the tensor holds."""
        self.name = name
        if not dense:  # the values of a sparse initializer (never decoded as a constant)
            t = t.values
        elem_type = t.data_type
        dtype = _DTYPE_NAMES.get(elem_type, "")
        self.dtype = dtype_name(elem_type) if dtype == "" else dtype
        dims = self.dims = tuple(t.dims)
        location = length = None
        if t.data_location == DATA_EXTERNAL:
            self.external = True
            for entry in t.external_data:
                key = entry.key
                if key == "location":
                    location = entry.value
                    if locations is not None:
                        locations.append(location)
                elif key == "length" and length is None:
                    length = entry.value
            small = None
        else:
            self.external = False
            if locations is not None:  # (a location entry on a tensor not stored externally: still checked)
                locations.extend([entry.value for entry in t.external_data if entry.key == "location"])
            small = None  # (its class, its bytes): a small inline tensor, decoded by small_values()
            if dense:
                numel = 1
                for d in dims:
                    numel *= d
                # (a larger protobuf is never decoded: _tensor_summary's bound, checked before copying any bytes)
                if numel <= _SMALL_CONSTANT_ELEMENTS and t.ByteSize() <= _SMALL_CONSTANT_BYTES:
                    small = (t.__class__, t.SerializeToString())
        self.location = location
        self._length: str | None = length
        self._small: Any = small
        self._values: tuple | None | bool = False  # small_values(), decoded on first use (False: not yet)

    @property
    def external_length(self) -> int | None:
        """The byte length the external-data entry declares (the file is never opened), or None."""
        if not self.external or self._length is None:
            return None
        try:
            return max(0, int(self._length))
        except ValueError:
            return None

    def small_values(self) -> tuple | None:
        """Flattened values of a small inline initializer; None when external, large or sparse."""
        values = self._values
        if values is False:
            # Patterns ask for the same few constants (slice bounds, gather indices) once per candidate.
            small = self._small
            values = None if small is None else _tensor_summary(small[0].FromString(small[1])).values
            self._values = values
        return cast("tuple | None", values)

    def __repr__(self) -> str:
        return f"Initializer({self.name!r}, {self.dtype}, {list(self.dims)}{', external' if self.external else ''})"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


def index_initializers(g: onnx.GraphProto, locations: list[str] | None = None) -> dict[str, Initializer]:
    """A graph's dense initializers by name (a repeated name: the last one), in the order the graph lists them.
    `locations`, when given, gets every external-data location entry they hold (Initializer)."""
    initializers: dict[str, Initializer] = {}
    for t in g.initializer:
        name = t.name
        initializers[name] = Initializer(name, t, locations=locations)
    return initializers


class _Attributes:
    """A node's attributes: kept serialized (one AttributeProto's bytes each), decoded on first use, shared by
    every node that has the same ones (a 200k-node graph has a dozen distinct attribute sets). A node holding
    subgraphs (indexed from it), or an attribute over 64 KiB (a weight in a Constant, never copied), keeps its live
    attribute list instead, and with it the parsed model."""

    __slots__ = ("_raw", "_cls", "_live", "_values", "_types")

    def __init__(self, raw: tuple[bytes, ...] | None, cls: Any, live: Any = None):
        self._raw = raw
        self._cls = cls
        self._live = live
        self._values: dict[str, Any] | None = None
        self._types: dict[str, int] | None = None

    def protos(self) -> Iterable[onnx.AttributeProto]:
        if self._live is not None:
            return self._live
        if not self._raw:
            return ()
        parse = self._cls.FromString
        return [parse(b) for b in self._raw]

    def values(self) -> dict[str, Any]:
        values = self._values
        if values is None:
            values = self._values = {a.name: _attribute_value(a) for a in self.protos()}
        return values

    def types(self) -> dict[str, int]:
        types = self._types
        if types is None:
            types = {}
            for a in self.protos():
                types.setdefault(a.name, a.type)  # the first of a name, as a reader scanning the list finds it
            self._types = types
        return types


_NO_ATTRIBUTES = _Attributes((), None)


class Node:
    """One node of the model (main graph or a subgraph). Attributes decode on first use.

    The node keeps no protobuf object: what rules read is copied out when the index is built (attributes kept
    serialized), so the parsed model can be freed. A message object held per node would cost memory twice over
    (the Python object, and the bookkeeping protobuf adds to a held message for every absent field read through
    it), and the model itself as much again."""

    __slots__ = ("index", "position", "name", "op_type", "domain", "inputs", "outputs", "graph", "layer", "_attrs")

    def __init__(self, attrs: _Attributes, position: int, index: int, graph: str | None, name: str, op_type: str,
                 domain: str, inputs: tuple[str, ...], outputs: tuple[str, ...]):
        self._attrs = attrs
        self.position = position  # its position in its graph's node list (`index` counts every node of every graph)
        self.index = index
        self.name = name
        self.op_type = op_type
        self.domain = domain  # canonical (see canonical_domain)
        self.inputs = inputs
        self.outputs = outputs
        self.graph = graph
        self.layer: int | None = None

    @property
    def key(self) -> str:
        return op_key(self.domain, self.op_type)

    @property
    def display_name(self) -> str:
        """The node's name, or a stable synthetic one when the exporter left it empty. Control characters
        (newlines, terminal escapes) are shown escaped: a name must not forge lines in a CI log."""
        name = self.name or f"<{self.op_type}#{self.index}>"
        return name if name.isprintable() else printable(name)

    @property
    def attributes(self) -> dict[str, Any]:
        return self._attrs.values()

    @property
    def attribute_types(self) -> dict[str, int]:
        """Attribute name -> its AttributeProto.AttributeType number (the first attribute of a name)."""
        return self._attrs.types()

    def attribute_protos(self) -> Iterable[onnx.AttributeProto]:
        """The node's AttributeProtos, in order (read-only use)."""
        return self._attrs.protos()

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value, else `default`. With a default, a value of another kind (text where the
        default is a number, a number where it is a list, ...) counts as absent: hostile graphs write those."""
        value = self.attributes.get(name, default)
        if default is None or value is default or _kind(value) == _kind(default):
            return value
        return default

    def int_attr(self, name: str, default: int | None = None) -> int | None:
        """An INT attribute's value; `default` when absent or of another type (a hostile graph may write
        num_heads as text or k as a list)."""
        value = self.attributes.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def has_attr(self, name: str) -> bool:
        return name in self.attributes

    def input(self, i: int) -> str:
        """The i-th input name, "" when absent or omitted."""
        inputs = self.inputs
        return inputs[i] if i < len(inputs) else ""

    def __repr__(self) -> str:
        return f"Node({self.key} {self.display_name!r} layer={self.layer})"


def _subgraphs(attributes: Iterable[onnx.AttributeProto]) -> Iterator[tuple[str, onnx.GraphProto]]:
    """Each subgraph a node's attributes hold (If's branches, Loop's and Scan's bodies), with its attribute's name."""
    for attr in attributes:
        if attr.type == ATTR_GRAPH:
            yield attr.name, attr.g
        elif attr.type == ATTR_GRAPHS:
            for sub in attr.graphs:
                yield attr.name, sub


def _attribute_value(attr: onnx.AttributeProto) -> Any:
    if attr.type == ATTR_GRAPH:
        return f"<graph {attr.g.name}>"
    if attr.type == ATTR_GRAPHS:
        return [f"<graph {g.name}>" for g in attr.graphs]
    if attr.type == ATTR_TENSOR:
        return _tensor_summary(attr.t)
    if max(len(attr.ints), len(attr.floats), len(attr.strings)) > _MAX_ATTRIBUTE_ELEMENTS:
        return None  # a weight smuggled into an attribute list: never decoded into Python objects
    if attr.ref_attr_name:  # a reference to an attribute of an enclosing function: no value of its own
        return None
    read = _ATTRIBUTE_READERS.get(attr.type)
    if read is None:  # unknown type: report its absence rather than crash
        return None
    value = read(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", errors="replace") for v in value]
    return value


# What onnx.helper.get_attribute_value returns, by AttributeProto.AttributeType (TENSOR and GRAPH(S) are summarised
# before). UNDEFINED reads as None.
_ATTRIBUTE_READERS: dict[int, Callable[[Any], Any]] = {
    ATTR_UNDEFINED: lambda a: None,
    ATTR_FLOAT: lambda a: a.f,
    ATTR_INT: lambda a: a.i,
    ATTR_STRING: lambda a: a.s,
    ATTR_SPARSE_TENSOR: lambda a: a.sparse_tensor,
    ATTR_TYPE_PROTO: lambda a: a.tp,
    ATTR_FLOATS: lambda a: list(a.floats),
    ATTR_INTS: lambda a: list(a.ints),
    ATTR_STRINGS: lambda a: list(a.strings),
    ATTR_TENSORS: lambda a: list(a.tensors),
    ATTR_SPARSE_TENSORS: lambda a: list(a.sparse_tensors),
    ATTR_TYPE_PROTOS: lambda a: list(a.type_protos),
}


def _kind(value: Any) -> str:
    if isinstance(value, (int, float)):  # bool included: attr("flag", False) reads an INT attribute
        return "number"
    if not isinstance(value, (str, list, tuple)):
        return type(value).__name__
    return "text" if isinstance(value, str) else "list"


@dataclass(frozen=True)
class TensorSummary:
    dtype: str | None
    dims: tuple[int, ...]
    values: tuple | None  # decoded only for small inline tensors


def _tensor_summary(t: onnx.TensorProto) -> TensorSummary:
    dims = tuple(int(d) for d in t.dims)
    values = None
    numel = 1
    for d in dims:
        numel *= max(d, 0)
    inline = t.data_location != DATA_EXTERNAL
    if inline and numel <= _SMALL_CONSTANT_ELEMENTS and t.ByteSize() <= _SMALL_CONSTANT_BYTES:
        values = small_tensor_values(t)
    return TensorSummary(dtype_name(t.data_type), dims, values)


def _value_info(vi: onnx.ValueInfoProto) -> ValueInfo:
    t = vi.type
    if not t.HasField("tensor_type"):
        return ValueInfo(vi.name, None, None)
    tt = t.tensor_type
    shape: tuple[int | str | None, ...] | None = None
    if tt.HasField("shape"):
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return ValueInfo(vi.name, dtype_name(tt.elem_type), shape)
