"""Finding and parsing model files. Only the protobuf is read: external weight files are never opened."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ortgate.errors import LFS_POINTER_PROBLEM, InputError, is_lfs_pointer, printable
from ortgate.proto import ATTR_GRAPH, ATTR_GRAPHS, ATTR_TENSOR, ATTR_TENSORS, plain_model_class, verifying_model_class

if TYPE_CHECKING:  # imported where a model is parsed: loading the pipeline for a policy alone never needs it
    import onnx

    from ortgate.graph.index import Initializer

PROTOBUF_LIMIT = 2**31 - 1  # protobuf refuses messages of 2 GiB and more

_NOT_ONNX_SIGNATURES = (
    (b"PK\x03\x04", "a zip archive (a PyTorch checkpoint?)"),
    (b"\x80\x02", "a Python pickle"),
    (b"\x80\x03", "a Python pickle"),
    (b"\x80\x04", "a Python pickle"),
    (b"\x80\x05", "a Python pickle"),
    (b"\x89HDF", "an HDF5 file"),
    (b"GGUF", "a GGUF file"),
    (b"\x7fELF", "an executable"),
)


def load_model(path: str | Path) -> onnx.ModelProto:
    """Parse an ONNX file without its external data into onnx's own classes (for code that hands the model to onnx:
    `ortgate fix`). Every failure is an InputError naming the file; the checks are read_model's."""
    import onnx

    model, _ = _load(Path(path), onnx.ModelProto)
    return model


def read_model(path: str | Path) -> onnx.ModelProto:
    """Parse an ONNX file without its external data, without importing onnx: the message classes are
    ortgate.proto's, built from onnx's own schema (same fields and names as onnx.ModelProto, other classes). What
    the linter reads. Every failure is an InputError naming the file.

    Refused: files over 2 GiB (before reading a byte), files that are not regular files, protobuf nested
    deeper than the parser allows (subgraphs within subgraphs), string fields that are not UTF-8, and models whose
    external data would be read from outside their folder (ORT refuses those too). External data files are never
    opened. A model with local functions is inlined by onnx's inliner (onnx is imported for those alone).
    """
    model, _ = _load(Path(path), None)
    return model


def read_model_indexed(path: str | Path) -> tuple[onnx.ModelProto, dict[str, Initializer] | None]:
    """read_model, and the main graph's dense initializers already indexed (for Graph's `initializers`; None
    when the model has local functions, which inlining rewrites): the external-data locations are checked on what
    that index reads, so each weight's protobuf is read once. Same checks, same errors, in the same order."""
    return _load(Path(path), None, indexed=True)


def _load(p: Path, model_class, *, indexed: bool = False) -> tuple[onnx.ModelProto, dict[str, Initializer] | None]:
    """read_model (`model_class` None) or load_model (onnx.ModelProto); with `indexed`, read_model_indexed."""
    if not p.exists():
        raise InputError("no such file", p)
    if not p.is_file():
        raise InputError("not a regular file", p)
    try:
        size = p.stat().st_size
        if size == 0:
            raise InputError("empty file, not an ONNX model", p)
        if size > PROTOBUF_LIMIT:
            raise InputError(
                f"file is {size / 2**30:.1f} GiB; an ONNX protobuf cannot exceed 2 GiB, so its weights must be "
                "saved as external data (onnx.save(..., save_as_external_data=True))", p)
        with open(p, "rb") as f:
            data = f.read()  # sized from fstat; read(LIMIT + 1) would reserve 2 GiB for any model
        if len(data) > PROTOBUF_LIMIT:  # the file grew between stat and read
            raise InputError("file is over 2 GiB; an ONNX protobuf cannot exceed 2 GiB", p)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", p) from None
    except MemoryError:
        raise InputError(f"out of memory reading {size} bytes", p) from None
    if is_lfs_pointer(data[:64]):
        raise InputError(LFS_POINTER_PROBLEM, p)
    for signature, what in _NOT_ONNX_SIGNATURES:
        if data.startswith(signature):
            raise InputError(f"not an ONNX model: this is {what}", p)
    model = None
    if model_class is None:
        # One parse that also verifies every string's UTF-8; only a file it refuses is parsed again, by the plain
        # schema, to tell a string that is not UTF-8 from a corrupt protobuf (and to say which).
        verifying = verifying_model_class()
        if verifying is not None:
            try:
                model = verifying.FromString(data)
            except Exception:
                model = None
        utf8_ok = model is not None
        if model is None:
            model = _parse(data, plain_model_class(), p, size)
    else:
        utf8_ok = _utf8_checked_parse(data)  # parsed once more, then dropped: memory peaks at one parse
        model = _parse(data, model_class, p, size)
    # Every external-data location is a "location" entry: how many the bytes hold bounds the search below.
    locations_in_bytes = data.count(b"location")
    del data
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InputError("not an ONNX model (no IR version or graph in the protobuf)", p)
    if not model.graph.node:
        raise InputError("the ONNX graph has no nodes", p)
    bad_text = None if utf8_ok else first_non_utf8_text(model)
    if bad_text is not None:
        raise InputError(f"not an ONNX model: {bad_text} is not UTF-8 text (corrupt protobuf?)", p)
    initializers = None
    if indexed and not model.functions:  # (inlining rewrites the graph: its index would be thrown away)
        from ortgate.graph.index import gc_paused, index_initializers

        locations: list[str] = []
        with gc_paused():
            initializers = index_initializers(model.graph, locations)
        escaping = check_external_data_locations(model, locations_in_bytes, initializer_locations=locations)
    else:
        escaping = check_external_data_locations(model, locations_in_bytes)
    if escaping:
        raise InputError(f"external data location {escaping[0]!r} is outside the model's folder (absolute or "
                         "'..'); ONNX Runtime refuses such a model and ortgate never opens it", p)
    if model.functions:
        return inline_local_functions(model, p), None
    return model, initializers


def _parse(data: bytes, model_class, p: Path, size: int):
    from google.protobuf.message import DecodeError

    model = model_class()
    try:
        model.ParseFromString(data)
    except RecursionError:
        raise InputError(f"not an ONNX model ({_TOO_DEEP})", p) from None
    except (DecodeError, RuntimeError, ValueError) as exc:
        text = str(exc).lower()
        if "depth" in text or "deep" in text or "recursion" in text:
            reason = _TOO_DEEP
        else:
            reason = "truncated or corrupt protobuf" if isinstance(exc, DecodeError) else " ".join(str(exc).split())
        raise InputError(f"not an ONNX model ({reason})", p) from None
    except MemoryError:
        raise InputError(f"out of memory parsing {size} bytes of protobuf", p) from None
    return model


# Op domains whose ops ONNX Runtime runs with its own kernels: a local function named like one of their ops
# (a "Relu" in the default domain) is not what ORT runs, so it is not inlined either.
_KERNEL_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def inline_local_functions(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """The model as ONNX Runtime runs it: calls of local functions (FunctionProto) replaced by their bodies, so the
    rules see an MoE or an attention hidden in one. A function that shadows an op ORT implements itself stays a
    call of that op (ORT runs its kernel, not the body). Functions that call each other in a cycle are refused, as
    ORT refuses them."""
    if not model.functions:
        return model
    import onnx
    import onnx.defs
    import onnx.inliner

    if not isinstance(model, onnx.ModelProto):  # read_model's classes: onnx's inliner takes its own
        model = onnx.ModelProto.FromString(model.SerializeToString())

    def shadows_kernel(f: onnx.FunctionProto) -> bool:
        if f.domain == "com.microsoft":
            return True
        return f.domain in _KERNEL_DOMAINS and onnx.defs.has(f.name, f.domain if f.domain != "ai.onnx" else "")

    chosen = {(f.domain, f.name): f for f in model.functions if not shadows_kernel(f)}
    if not chosen:
        return model
    calls = {key: {(n.domain, n.op_type) for n in f.node if (n.domain, n.op_type) in chosen}
             for key, f in chosen.items()}
    cycle = _function_cycle(calls)
    if cycle:
        names = " -> ".join(f"{d}::{n}" if d else n for d, n in cycle)
        raise InputError(f"local functions call each other in a cycle ({names}); ONNX Runtime cannot inline them", path)
    _check_inlined_size(model, chosen, path)
    try:
        return onnx.inliner.inline_selected_functions(model, list(chosen), exclude=False)
    except Exception as exc:  # onnx's C++ inliner: its refusal is about this model
        raise InputError(f"local functions cannot be inlined: {' '.join(str(exc).split())}", path) from None


# Nodes the inlined graph may have. Exported LLM graphs have up to about 10^5 nodes; a model whose local functions
# expand past this (functions calling functions several times each: the size doubles per level) is refused before
# it is built, instead of taking minutes and gigabytes to inline.
MAX_INLINED_NODES = 1_000_000


def _check_inlined_size(model: onnx.ModelProto, chosen: dict, path: Path) -> None:
    """Count the nodes the inlined graph would have (each function's expansion counted once, memoized; subgraphs
    included) and refuse, naming the function, a model that would pass MAX_INLINED_NODES. The call graph has no
    cycle (checked before)."""
    sizes: dict[tuple[str, str], int] = {}

    def node_size(node) -> int:
        key = (node.domain, node.op_type)
        if key in chosen:
            return function_size(key)
        total = 1
        for attr in node.attribute:
            if attr.type == ATTR_GRAPH:
                total += graph_size(attr.g.node)
            elif attr.type == ATTR_GRAPHS:
                total += sum(graph_size(g.node) for g in attr.graphs)
        return total

    def graph_size(nodes) -> int:
        total = 0
        for node in nodes:
            total += node_size(node)
            if total > MAX_INLINED_NODES:
                return total  # past the bound: the exact figure does not matter
        return total

    def function_size(key: tuple[str, str]) -> int:
        if key not in sizes:
            size = graph_size(chosen[key].node)
            sizes[key] = size
            if size > MAX_INLINED_NODES:
                domain, name = key
                raise InputError(f"local function {f'{domain}::{name}' if domain else name!r} expands to more than "
                                 f"{MAX_INLINED_NODES:,} nodes when inlined (its calls of other functions multiply); "
                                 "ortgate does not build a graph that large", path)
        return sizes[key]

    total = graph_size(model.graph.node)
    if total > MAX_INLINED_NODES:
        largest = max(sizes, key=lambda k: sizes[k]) if sizes else None
        named = f" (the largest, {largest[1]!r}, expands to {sizes[largest]:,})" if largest else ""
        raise InputError(f"its local functions expand to more than {MAX_INLINED_NODES:,} nodes when inlined"
                         f"{named}; ortgate does not build a graph that large", path)


def _function_cycle(calls: dict[tuple[str, str], set[tuple[str, str]]]) -> list[tuple[str, str]] | None:
    """A cycle in the call graph of local functions (first function repeated at the end), or None."""
    state: dict[tuple[str, str], int] = {}  # 1: on the path, 2: done
    path: list[tuple[str, str]] = []

    def visit(key: tuple[str, str]) -> list[tuple[str, str]] | None:
        state[key] = 1
        path.append(key)
        for callee in sorted(calls.get(key, ())):
            if state.get(callee) == 1:
                return path[path.index(callee):] + [callee]
            if callee not in state:
                found = visit(callee)
                if found:
                    return found
        path.pop()
        state[key] = 2
        return None

    for key in sorted(calls):
        if key not in state:
            found = visit(key)
            if found:
                return found
    return None


def _text_fields(descriptor) -> tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]:
    """(string fields, (message field, repeated)) of a message type; bytes fields such as raw_data are skipped."""
    cached = _TEXT_FIELDS.get(descriptor.full_name)
    if cached is None:
        strings = tuple(f.name for f in descriptor.fields if f.type == f.TYPE_STRING)
        messages = tuple((f.name, _is_repeated(f)) for f in descriptor.fields if f.type == f.TYPE_MESSAGE)
        cached = _TEXT_FIELDS[descriptor.full_name] = (strings, messages)
    return cached


def _is_repeated(field) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; `label` is deprecated there
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


_TEXT_FIELDS: dict[str, tuple] = {}


def first_non_utf8_text(model: onnx.ModelProto) -> str | None:
    """The first string field (a name, op type, domain, ...) that is not valid UTF-8, or None.

    ONNX's protobuf is proto2, whose parser does not check UTF-8: such a field reaches Python as bytes instead
    of str, and every name lookup downstream would silently miss it (or fail). Only string fields are read:
    tensor data (raw_data, float_data, ...) is never touched. A walk over every message: load_model runs it
    only when the fast check (`_utf8_checked_parse`) has failed, to say which field is at fault.
    """
    stack: list = [model]
    while stack:
        message = stack.pop()
        strings, messages = _text_fields(message.DESCRIPTOR)
        for name in strings:
            value = getattr(message, name)
            if isinstance(value, str):
                continue
            for item in (value if not isinstance(value, bytes) else (value,)):
                if isinstance(item, bytes):
                    return f"{message.DESCRIPTOR.name}.{name} {printable(repr(item[:60]))}"
        for name, repeated in messages:
            if repeated:
                stack.extend(getattr(message, name))
            elif message.HasField(name):
                stack.append(getattr(message, name))
    return None


def _utf8_checked_parse(data: bytes) -> bool:
    """False when the bytes hold a string field that is not UTF-8 (or the check is unavailable)."""
    checking = verifying_model_class()
    if checking is None:
        return False
    probe = checking()
    try:
        probe.ParseFromString(data)
        return True
    except Exception:
        return False


_TOO_DEEP = "protobuf nested too deeply: subgraphs inside subgraphs beyond what the protobuf parser accepts"


def escapes_folder(location: str) -> bool:
    """Whether a file name from inside a model or config leaves its folder. Decided on the text alone, as
    ONNX Runtime does: nothing is resolved, followed or opened."""
    if not location or "\0" in location or os.path.isabs(location):
        return True
    normal = os.path.normpath(location)
    return normal == ".." or normal.startswith(("../", "/"))


def check_external_data_locations(model: onnx.ModelProto, locations_in_bytes: int | None = None, *,
                                  initializer_locations: list[str] | None = None) -> list[str]:
    """External data locations that would escape the model's folder (absolute or '..'). Never opened.

    `locations_in_bytes`, the count of b"location" in the serialized model, lets the search stop at the
    initializers when they account for every occurrence (the usual case), instead of visiting every node's
    attributes for tensors. `initializer_locations`: every location entry of the main graph's initializers,
    already read (index_initializers): they are not read again."""
    bad: set[str] = set()
    seen: dict[str, bool] = {}
    found = 0
    if initializer_locations is not None:
        found = len(initializer_locations)
        for value in set(initializer_locations):
            seen[value] = escapes_folder(value)
            if seen[value]:
                bad.add(value)
    for tensor in _all_tensors(model, initializers_first=True, skip_initializers=initializer_locations is not None):
        if tensor is None:  # the initializers are done
            if locations_in_bytes is not None and found >= locations_in_bytes:
                break
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                found += 1
                value = entry.value
                if value not in seen:
                    seen[value] = escapes_folder(value)
                if seen[value]:
                    bad.add(value)
    return sorted(bad)


def _all_tensors(model: onnx.ModelProto, *, initializers_first: bool = False, skip_initializers: bool = False):
    """Initializers, sparse initializers and tensor attributes of the graph, every subgraph and every local
    function's body. With
    `initializers_first`, the main graph's initializers come first (none with `skip_initializers`), then a None
    marker, then the rest."""
    if initializers_first:
        if not skip_initializers:
            yield from model.graph.initializer
        yield None
    stack: list = [model.graph]
    # A local function's body is a graph ORT inlines: a Constant there pointing at external data is read as
    # any other (its nodes are walked after the graph's, as a graph with no initializers).
    functions = list(model.functions)
    while stack or functions:
        g = stack.pop() if stack else functions.pop()
        if hasattr(g, "initializer"):  # a GraphProto (a FunctionProto has nodes only)
            if not (initializers_first and g is model.graph):
                yield from g.initializer
            for sparse in g.sparse_initializer:
                yield sparse.values
                yield sparse.indices
        for node in g.node:
            for attr in node.attribute:
                if attr.type == ATTR_GRAPH:
                    stack.append(attr.g)
                elif attr.type == ATTR_GRAPHS:
                    stack.extend(attr.graphs)
                elif attr.type == ATTR_TENSOR:
                    yield attr.t
                elif attr.type == ATTR_TENSORS:
                    yield from attr.tensors
