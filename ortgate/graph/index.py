"""The read-only graph index every rule reads. Built once per model, in one pass over the protobuf.

It holds nodes by (domain, op_type), producers and consumers of every value, declared shapes and dtypes,
initializer metadata (never their bytes), subgraph nodes (If/Loop/Scan bodies, flattened with their path)
and the decoder layer each node belongs to.
"""

from __future__ import annotations

import functools
import gc
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from ortgate.errors import printable
from ortgate.graph.nodes import (
    _NO_ATTRIBUTES,
    _SMALL_CONSTANT_BYTES,
    _Attributes,
    _subgraphs,
    _value_info,
)
from ortgate.graph.nodes import DEFAULT_DOMAIN as DEFAULT_DOMAIN
from ortgate.graph.nodes import MS_DOMAIN as MS_DOMAIN
from ortgate.graph.nodes import Initializer as Initializer
from ortgate.graph.nodes import Node as Node
from ortgate.graph.nodes import TensorSummary as TensorSummary
from ortgate.graph.nodes import ValueInfo as ValueInfo
from ortgate.graph.nodes import canonical_domain as canonical_domain
from ortgate.graph.nodes import dtype_name as dtype_name
from ortgate.graph.nodes import index_initializers as index_initializers
from ortgate.knowledge.kernels import op_key as op_key
from ortgate.proto import ATTR_GRAPH, ATTR_GRAPHS

if TYPE_CHECKING:  # the models are duck-typed: onnx.ModelProto, or ortgate.proto's classes of the same schema
    import onnx

# The only ONNX ops with graph attributes; nodes of other domains are checked attribute by attribute.
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
# Graph.early_metadata_keys: the metadata keys of this many first nodes.
EARLY_METADATA_NODES = 64
_UNKNOWN = object()  # not in a cache yet (None is a cached answer)


def ort_load_refusal(graph: Graph, release: str | None) -> str | None:
    """Why ONNX Runtime `release` (the deployment's pinned one; None: the newest ortgate has measured) refuses to
    create a session of this model for its IR version or opset imports (ortgate.knowledge.model_format), or None."""
    from ortgate.knowledge.model_format import model_format_refusal

    used = {node.domain for node in graph.nodes}
    return model_format_refusal(graph.ir_version, graph.opsets, used, release)


@contextmanager
def gc_paused():
    """The cyclic garbage collector off for a while (restored after).

    Building the index allocates hundreds of thousands of objects and frees none: the collector would rescan
    the growing index again and again, for nothing (the index holds no reference cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            # What was allocated meanwhile counts as long-lived (the oldest generation): re-enabled as it is, the
            # collector's next young-generation pass would walk every object of the index at once, for nothing.
            gc.freeze()
            gc.unfreeze()
            gc.enable()


# Output dtype rules for propagation where value_info is absent (exported graphs rarely declare it).
_INT64_OUTPUT_OPS = {"Shape", "Size", "NonZero", "ArgMax", "ArgMin", "NonMaxSuppression"}
_FIXED_OUTPUT_DTYPES = {(DEFAULT_DOMAIN, "MatMulInteger"): "int32", (DEFAULT_DOMAIN, "ConvInteger"): "int32"}
# Ops whose output dtype is that of one input other than the first (quantized data in, scales' dtype out).
_DTYPE_FROM_INPUT = {(MS_DOMAIN, "GatherBlockQuantized"): 2, (DEFAULT_DOMAIN, "OneHot"): 2}
# Control flow: output i of the node is output i + offset of its body (Loop's body starts with its condition).
_SUBGRAPH_OUTPUT_OFFSET = {"If": ("then_branch", 0), "Loop": ("body", 1), "Scan": ("body", 0)}


def _subgraph_output(node: Node, output: str) -> str | None:
    """The body output that becomes `output` of an If/Loop/Scan node (its dtype is the node output's dtype)."""
    attr_name, offset = _SUBGRAPH_OUTPUT_OFFSET[node.op_type]
    position = node.outputs.index(output) + offset
    for attr in node.attribute_protos():
        if attr.name == attr_name and attr.type == ATTR_GRAPH and position < len(attr.g.output):
            return attr.g.output[position].name
    return None


_BOOL_OUTPUT_OPS = {
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf",
}
# Every op type that Graph._dtype_inputs or Graph._infer_output_dtype treats specially (attribute-typed outputs,
# control flow). All others are typed by their operator's contract (_OutputTypes); an op with no contract takes
# the dtype of its first input whose dtype is known.
_DTYPE_SPECIAL_OPS = frozenset(
    {"Cast", "CastLike", "Constant", "ConstantOfShape", "DequantizeLinear", "QuantizeLinear", "Where", "Unique",
     "TopK"}
    | _INT64_OUTPUT_OPS | _BOOL_OUTPUT_OPS | set(_SUBGRAPH_OUTPUT_OFFSET)
    | {op for _, op in _FIXED_OUTPUT_DTYPES} | {op for _, op in _DTYPE_FROM_INPUT}
)


@dataclass(frozen=True)
class _OutputType:
    """How one output's element type follows from its operator's schema: a literal type, or the type parameter it
    shares with some inputs (positions; `variadic_from`: every input from there on), or, when no input binds the
    parameter, its only allowed type. Neither: unknown (the schema allows several and nothing says which)."""

    fixed: str | None
    inputs: tuple[int, ...] = ()
    variadic_from: int | None = None


_NO_CONTRACT = object()


def _output_types(domain: str, op_type: str, opset: int | None) -> tuple[_OutputType, ...] | None:
    """Per formal output of the op's contract at that opset; None when ortgate has no contract for it (or it
    documents no outputs)."""
    key = (domain, op_type, opset)
    found = _OUTPUT_TYPES.get(key, _NO_CONTRACT)
    if found is _NO_CONTRACT:
        from ortgate.knowledge.contracts import op_contract

        contract = op_contract(domain, op_type, opset)
        found = None
        if contract is not None and contract.outputs:
            rules = []
            for formal in contract.outputs:
                allowed = contract.allowed_types(formal)
                if formal.type not in contract.types:  # a literal type (or a sequence: not typed here)
                    rules.append(_OutputType(allowed[0] if allowed and len(allowed) == 1 else None))
                    continue
                positions = tuple(i for i, f in enumerate(contract.inputs) if f.type == formal.type)
                variadic = next((i for i in positions if contract.inputs[i].option == "variadic"), None)
                only = allowed[0] if allowed and len(allowed) == 1 else None
                rules.append(_OutputType(only if not positions else None, positions, variadic) if positions or only
                             else _OutputType(None))
            found = tuple(rules)
        _OUTPUT_TYPES[key] = found
    return cast("tuple[_OutputType, ...] | None", found)


_OUTPUT_TYPES: dict[tuple[str, str, int | None], object] = {}


def _declared_dtype(values: dict[str, Any], initializers: dict[str, Initializer], name: str) -> str | None:
    info = values.get(name)
    if info is not None:
        if info.__class__ is not ValueInfo:
            info = values[name] = _value_info(cast("onnx.ValueInfoProto", info))
        return info.dtype
    init = initializers.get(name)
    return init.dtype if init is not None else None


class _ConsumerTable(dict):
    """Value name -> the nodes reading it; a name nothing reads gets a new empty list (not kept)."""

    __slots__ = ()

    def __missing__(self, name: str) -> list[Node]:
        return []


class _DtypeTable(dict):
    """Value name -> dtype. Once every node output is in it (Graph._fill_dtypes), a missing name is no node's
    output: `declared` gives its dtype (a graph input's, a weight's, or None), kept for the next lookup. It holds
    no reference to its graph (the index stays free of reference cycles)."""

    __slots__ = ("declared",)

    def __init__(self) -> None:
        super().__init__()
        self.declared: Callable[[str], str | None] | None = None

    def __missing__(self, name: str) -> str | None:
        if self.declared is None:
            raise KeyError(name)
        found = self[name] = self.declared(name) or None
        return found


class Graph:
    """Read-only index over one ONNX model. It keeps no reference to the model's protobuf (only a model with
    subgraphs keeps the nodes holding them), so the parsed model is freed once it is indexed."""

    def __init__(self, model: onnx.ModelProto, path: str, *, role: str = "model",
                 initializers: dict[str, Initializer] | None = None):
        """`initializers`: the main graph's dense initializers of this very model, already read
        (index_initializers), so that they are not read twice."""
        self.path = path
        self.role = role  # "model" (as exported) or "optimized" (ORT's optimized dump)
        # What reports call the graph when `path` is not its own file: ORT's optimized graph of a model, written to
        # a temporary file that `ortgate run` deleted ("optimized graph of MODEL"; `path` is then MODEL).
        self.label: str | None = None
        self._producer_name: str = model.producer_name
        self._producer_version: str = model.producer_version
        self.opsets: dict[str, int] = {canonical_domain(o.domain): int(o.version) for o in model.opset_import}
        self.ir_version: int = int(model.ir_version)
        self.nodes: list[Node] = []
        self._by_op: dict[tuple[str, str], list[Node]] = defaultdict(list)
        self._producer: dict[str, Node] = {}
        # producer(value): the dict's own lookup, called hundreds of thousands of times by the patterns.
        self.producer: Callable[[str], Node | None] = self._producer.get
        self._consumers: dict[str, list[Node]] = _ConsumerTable()
        # consumers(value): the table's own lookup (a value nothing reads gets a new empty list).
        self.consumers: Callable[[str], list[Node]] = self._consumers.__getitem__  # type: ignore[method-assign,assignment]
        # ValueInfo, or (a subgraph's) ValueInfoProto not decoded yet.
        self._values: dict[str, ValueInfo | onnx.ValueInfoProto] = {}
        self.initializers: dict[str, Initializer] = {} if initializers is None else initializers
        self.subgraph_paths: list[str] = []
        self.subgraph_owners: dict[str, Node] = {}  # subgraph path (Node.graph) -> the node holding it
        self._dtype_cache: _DtypeTable = _DtypeTable()
        self._dtypes_filled = False
        self._output_type_rules: dict[tuple[str, str], tuple[_OutputType, ...] | None] = {}
        # Node index -> the layer its scope metadata names (None: scoped outside every layer), for the nodes that
        # carry such metadata (ortgate.graph.layer_names.METADATA_KEYS); and the metadata keys of the first nodes.
        self.metadata_layers: dict[int, int | None] = {}
        self._early_metadata_keys: set[str] = set()
        self._constants: frozenset[str] | None = None  # is_constant's set, once built

        g = model.graph
        self.input_infos: list[ValueInfo] = []
        with gc_paused():
            if initializers is None:
                initializers = self.initializers = index_initializers(g)
            for t in g.sparse_initializer:
                name = t.values.name
                if name:
                    initializers[name] = Initializer(name, t, dense=False)
            values = self._values
            input_names = []
            for vi in g.input:
                name = vi.name
                input_names.append(name)
                info = _value_info(vi)
                values[name] = info
                if name not in initializers:  # IR < 4 lists every initializer as an input too
                    self.input_infos.append(info)
            self.output_infos: list[ValueInfo] = [_value_info(vi) for vi in g.output]
            for info in self.output_infos:
                values.setdefault(info.name, info)
            for vi in g.value_info:
                name = vi.name
                if name not in values:
                    values[name] = _value_info(vi)
            # What unordered_nodes needs of the main graph: the names in its scope, its node count.
            self._main_scope = (len(initializers), tuple(input_names), len(g.node))
            self._index_graph(g, None)
        self.layer_source = "none"  # set by ortgate.graph.layers.assign_layers, a separate pass

    # ---- what made the model -------------------------------------------------------------------------

    @property
    def producer_name(self) -> str:
        """The tool that wrote the model, as it recorded itself (ModelProto.producer_name), or ''."""
        return printable(self._producer_name).strip()

    @property
    def producer_version(self) -> str:
        return printable(self._producer_version).strip()

    def early_metadata_keys(self) -> frozenset[str]:
        """The metadata keys of the first nodes (graph.nodes[:EARLY_METADATA_NODES]): what an exporter writes."""
        return frozenset(self._early_metadata_keys)

    # ---- construction -------------------------------------------------------------------------------

    def _index_graph(self, g: onnx.GraphProto, path: str | None) -> None:
        # Depth-first over nested graphs without recursion; each graph sees its own names plus its parents'.
        # This loop runs once per node of the model: every protobuf field read and allocation counts.
        from ortgate.graph.layer_names import METADATA_KEYS, layer_from_name

        nodes, by_op, producers, consumers = self.nodes, self._by_op, self._producer, self._consumers
        metadata_layers, early_keys = self.metadata_layers, self._early_metadata_keys
        append = nodes.append
        # One str object per op type and per value name (sys.intern's), shared by node inputs, outputs and the index
        # keys: less memory, and every later lookup by name compares identical objects instead of equal strings.
        share = sys.intern
        op_keys: dict[tuple[str, str], list[Node]] = {}
        default_ops: dict[str, list[Node]] = {}  # the same lists, for the default domain: no key tuple per node
        # One _Attributes per distinct serialized attribute list.
        attribute_sets: dict[tuple[bytes, ...], _Attributes] = {}
        no_attributes = _NO_ATTRIBUTES
        subgraph_ops = _SUBGRAPH_OPS
        graph_types = (ATTR_GRAPH, ATTR_GRAPHS)
        stack: list[tuple[str | None, Iterator[tuple[int, onnx.NodeProto]]]] = [(path, enumerate(g.node))]
        while stack:
            gpath, it = stack[-1]
            for position, proto in it:
                domain = proto.domain
                if not domain:
                    domain = DEFAULT_DOMAIN
                elif domain != DEFAULT_DOMAIN:
                    domain = canonical_domain(domain)
                op_type = share(proto.op_type)
                inputs = tuple(map(share, proto.input))
                outputs = tuple(map(share, proto.output))
                index = len(nodes)
                if index == position:  # one int object for both (a main graph's nodes, before any subgraph)
                    index = position
                attrs = proto.attribute
                holds_graphs = False
                if not attrs:
                    entry = no_attributes
                elif (domain != DEFAULT_DOMAIN or op_type in subgraph_ops) and any(
                        a.type in graph_types for a in attrs):
                    entry = _Attributes(None, None, attrs)
                    holds_graphs = True
                elif any(a.ByteSize() > _SMALL_CONSTANT_BYTES for a in attrs):
                    entry = _Attributes(None, None, attrs)  # a weight in a Constant: never copied
                else:
                    raw = tuple([a.SerializeToString() for a in attrs])
                    entry = attribute_sets.get(raw)  # type: ignore[assignment]
                    if entry is None:
                        entry = attribute_sets[raw] = _Attributes(raw, attrs[0].__class__)
                metadata = proto.metadata_props
                if metadata:
                    for prop in metadata:
                        if prop.key in METADATA_KEYS:
                            metadata_layers[index] = layer_from_name(prop.value)
                            break
                    if index < EARLY_METADATA_NODES:
                        early_keys.update([prop.key for prop in metadata])
                node = Node(entry, position, index, gpath, proto.name, op_type, domain, inputs, outputs)
                append(node)
                if domain is DEFAULT_DOMAIN:
                    same_op = default_ops.get(op_type)
                    if same_op is None:
                        same_op = default_ops[op_type] = by_op[(domain, op_type)]
                else:
                    same_op = op_keys.get((domain, op_type))
                    if same_op is None:
                        same_op = op_keys[(domain, op_type)] = by_op[(domain, op_type)]
                same_op.append(node)
                for name in inputs:
                    if name:
                        readers = consumers.get(name)
                        if readers is None:
                            consumers[name] = [node]  # most values have one consumer: a list of exactly one
                        else:
                            readers.append(node)
                for name in outputs:
                    if name and name not in producers:
                        producers[name] = node
                if holds_graphs and self._push_subgraphs(node, attrs, stack):
                    break  # index the subgraphs first; this graph's iterator resumes after them
            else:
                stack.pop()

    def _push_subgraphs(self, node: Node, attrs: Any, stack: list) -> bool:
        pushed = False
        for attr_name, sub in _subgraphs(attrs):
            sub_path = f"{node.graph + '/' if node.graph else ''}{node.display_name}/{attr_name}"
            self.subgraph_paths.append(sub_path)
            self.subgraph_owners.setdefault(sub_path, node)
            for t in sub.initializer:
                name = t.name
                if name not in self.initializers:
                    self.initializers[name] = Initializer(name, t)
            for vi in list(sub.input) + list(sub.value_info) + list(sub.output):
                self._values.setdefault(vi.name, vi)
            stack.append((sub_path, enumerate(sub.node)))
            pushed = True
        return pushed

    @cached_property
    def unordered_nodes(self) -> list[Node]:
        """Nodes using a value not produced before them in their graph or a graph around it (a cycle, a bad
        order, a name nothing defines), in node order. Worked out when first asked, in the index's own order."""
        initializer_count, input_names, node_count = self._main_scope
        visible = {""}  # "" (an omitted input) is in every scope
        visible.update(islice(self.initializers, initializer_count))  # the main graph's, dense and sparse
        visible.update(input_names)
        unordered: list[Node] = []
        nodes = iter(self.nodes)
        # Per graph being walked: its scopes (its own last, then those around it) and its nodes left to see. A node
        # holding subgraphs has them walked next, the last one pushed first, as the index walked them.
        stack: list[list] = [[[visible], node_count]]
        while stack:
            frame = stack[-1]
            if not frame[1]:
                stack.pop()
                continue
            frame[1] -= 1
            scopes = frame[0]
            scope = scopes[-1]
            node = next(nodes)
            if not scope.issuperset(node.inputs):
                for name in node.inputs:
                    if name not in scope and not any(name in s for s in scopes[:-1]):
                        unordered.append(node)
                        break
            scope.update(node.outputs)
            live = node._attrs._live  # (a node holding subgraphs keeps its attribute list)
            if live is not None and (node.domain != DEFAULT_DOMAIN or node.op_type in _SUBGRAPH_OPS):
                for _, sub in _subgraphs(live):
                    local = {""}
                    local.update(t.name for t in sub.initializer)
                    local.update(vi.name for vi in sub.input)
                    stack.append([scopes + [local], len(sub.node)])
        return unordered

    # ---- queries ------------------------------------------------------------------------------------

    def by_op(self, domain: str, op_type: str) -> list[Node]:
        return self._by_op.get((canonical_domain(domain), op_type), [])

    def by_op_type(self, *op_types: str) -> list[Node]:
        """Nodes of these op types in the default ONNX domain."""
        if len(op_types) == 1:  # each index list is already in node order
            return list(self._by_op.get((DEFAULT_DOMAIN, op_types[0]), ()))
        out: list[Node] = []
        for op in op_types:
            out.extend(self._by_op.get((DEFAULT_DOMAIN, op), []))
        out.sort(key=lambda n: n.index)
        return out

    def count(self, domain: str, op_type: str) -> int:
        return len(self.by_op(domain, op_type))

    def consumers(self, value: str) -> list[Node]:  # replaced per instance by its table's lookup (see __init__)
        return self._consumers.get(value, [])

    def value(self, name: str) -> ValueInfo | None:
        info = self._values.get(name)
        if info is not None:
            if info.__class__ is not ValueInfo:  # decoded on first use
                info = self._values[name] = _value_info(cast("onnx.ValueInfoProto", info))
            return info
        init = self.initializers.get(name)
        if init is not None:
            return ValueInfo(name, init.dtype, init.dims)
        return None

    def is_constant(self, name: str) -> bool:
        """A weight, or the output of a Constant node. The first call gathers every such name; from then on
        is_constant(name) is that set's own membership test (the patterns ask hundreds of thousands of times). A
        caller that took the method before the first call keeps it: it then tests the same set, built once."""
        built = self._constants
        if built is not None:
            return name in built
        constants = set(self.initializers)
        producers = self._producer
        for node in self._by_op.get((DEFAULT_DOMAIN, "Constant"), ()):
            for out in node.outputs:
                if out and producers.get(out) is node:
                    constants.add(out)
        frozen = self._constants = frozenset(constants)
        self.is_constant = frozen.__contains__  # type: ignore[method-assign,assignment]
        return name in frozen

    def constant_value(self, name: str) -> tuple | None:
        """Flattened values of a small constant (Constant node or small inline initializer); else None."""
        p = self._producer.get(name)
        if p is not None and p.op_type == "Constant":
            attrs = p.attributes
            if isinstance(attrs.get("value"), TensorSummary):
                return attrs["value"].values
            for key in ("value_int", "value_float"):
                if key in attrs:
                    return (attrs[key],)
            for key in ("value_ints", "value_floats"):
                if key in attrs:
                    return tuple(attrs[key]) if attrs[key] is not None else None
            return None
        init = self.initializers.get(name)
        return init.small_values() if init is not None else None  # small and inline: reads no weights

    def scalar(self, name: str) -> float | int | None:
        values = self.constant_value(name)
        if values is not None and len(values) == 1:
            return values[0]
        return None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        info = self.value(name)
        return info.shape if info else None

    def dtype(self, name: str) -> str | None:
        """Declared dtype, else propagated through the producers (exported graphs rarely declare it)."""
        cache = self._dtype_cache
        found = cache.get(name, _UNKNOWN)
        if found is not _UNKNOWN:
            return cast("str | None", found)
        if not self._dtypes_filled:
            self._settle_dtypes()
            return cache[name]
        return self._walk_dtype(name)

    def dtype_lookup(self) -> Callable[[str], str | None]:
        """Graph.dtype as a plain function, with every dtype settled: for callers asking for many values."""
        if not self._dtypes_filled:
            self._settle_dtypes()
        return self._dtype_cache.__getitem__

    def _settle_dtypes(self) -> None:
        # One value's dtype can hang on the whole graph above it (an activation's comes from the embedding
        # table), and rules ask for most values: settle every node output at once.
        self._dtypes_filled = True
        self._fill_dtypes()
        # Every produced value is now in the table; any other name's dtype is its declared one (what the walk
        # would find), which the table works out on a miss: from here on dtype(name) is the table's lookup.
        cache = self._dtype_cache
        cache.declared = functools.partial(_declared_dtype, self._values, self.initializers)
        self.dtype = cache.__getitem__  # type: ignore[method-assign,assignment]

    def _fill_dtypes(self) -> None:
        """Every node output's dtype in one pass in graph order (in a valid graph producers come first); what the
        order does not settle (an If/Loop output from its body, a value used before it is produced) is walked.

        The schema's decision is looked up once per (domain, op type); for the ops it types (all but the few of
        _DTYPE_SPECIAL_OPS) an output's dtype is then its fixed type or the first known dtype among its typing
        inputs, exactly what _dtype_inputs and _infer_output_dtype say for it."""
        cache, producers, values, initializers = self._dtype_cache, self._producer, self._values, self.initializers
        declared_dtype, dtype_inputs, infer = self._declared_dtype, self._dtype_inputs, self._infer_output_dtype
        walk, get = self._walk_dtype, cache.get
        unknown, special_ops = _UNKNOWN, _DTYPE_SPECIAL_OPS
        # Per (domain, op type, input count): per output position, its fixed dtype (a str) or the positions of the
        # inputs that type it (None: every input); positions past the tuple take every input.
        plans_of: dict[tuple[str, str, int], tuple[str | tuple[int, ...] | None, ...]] = {}
        for node in self.nodes:
            op_type = node.op_type
            inputs = node.inputs
            if op_type in special_ops:
                plans = None
            else:
                plan_key = (node.domain, op_type, len(inputs))
                plans = plans_of.get(plan_key)
                if plans is None:
                    plans = plans_of[plan_key] = self._dtype_plans(plan_key)
            for position, out in enumerate(node.outputs):
                if not out or out in cache:
                    continue
                if out in values or out in initializers:
                    declared = declared_dtype(out)
                    if declared:
                        cache[out] = declared
                        continue
                sources: tuple[str, ...] | list[str]
                if plans is None:
                    sources = dtype_inputs(node, out)
                else:
                    plan = plans[position] if position < len(plans) else None
                    if plan is None:
                        sources = inputs
                    elif plan.__class__ is str:
                        cache[out] = plan
                        continue
                    else:
                        sources = [inputs[i] for i in cast("tuple[int, ...]", plan)]  # "" is skipped below
                    # The usual case in graph order: every source is settled; the first known dtype is the output's.
                    found = None
                    for i in sources:
                        if i:
                            known = get(i, unknown)
                            if known is unknown:
                                break
                            if found is None and known:
                                found = known
                    else:
                        cache[out] = found or None
                        continue
                for i in sources:
                    if i and i not in cache:
                        if i in producers:
                            walk(i)
                        else:  # a graph input or a weight: declared or unknown
                            cache[i] = declared_dtype(i) or None
                if out in cache:  # the walk reaches it first when it sits on a cycle
                    continue
                if plans is None:
                    cache[out] = infer(node, out)
                else:
                    found = None
                    for i in sources:
                        if i:
                            found = cache.get(i)
                            if found:
                                break
                    cache[out] = found or None

    def _dtype_plans(self, key: tuple[str, str, int]) -> tuple[str | tuple[int, ...] | None, ...]:
        """_fill_dtypes' plan for a node of this (domain, op type, input count): per output position of the op's
        contract, what _dtype_inputs and _infer_output_dtype decide for it."""
        domain, op_type, count = key
        plans: list[str | tuple[int, ...] | None] = []
        for rule in self._rules_for((domain, op_type)) or ():
            if rule.fixed:
                plans.append(rule.fixed)
                continue
            positions = [i for i in rule.inputs if i < count]
            if rule.variadic_from is not None:
                positions.extend(range(rule.variadic_from + 1, count))
            plans.append(tuple(positions))
        return tuple(plans)

    def _walk_dtype(self, name: str) -> str | None:
        cache = self._dtype_cache
        # Iterative depth-first post-order walk: deep graphs must not hit Python's recursion limit. A value is
        # "open" from its first visit until its inputs are done; an input that is open is a cycle (that edge is
        # given up). Sets, not lists: the walk can be as deep as the graph.
        stack = [name]
        open_values: set[str] = set()
        while stack:
            current = stack[-1]
            if current in cache:
                stack.pop()
                continue
            node = self._producer.get(current)
            if current in open_values:  # second visit: its inputs are done (only produced values are opened)
                cache[current] = self._infer_output_dtype(cast(Node, node), current)
                open_values.discard(current)
                stack.pop()
                continue
            declared = self._declared_dtype(current)
            if declared:
                cache[current] = declared
                stack.pop()
                continue
            if node is None:
                cache[current] = None
                stack.pop()
                continue
            needed = [i for i in self._dtype_inputs(node, current) if i and i not in cache and i not in open_values]
            if not needed:  # the usual case when values are asked for in graph order
                cache[current] = self._infer_output_dtype(node, current)
                stack.pop()
                continue
            open_values.add(current)
            stack.extend(needed)
        return cache[name]

    def _declared_dtype(self, name: str) -> str | None:
        return _declared_dtype(self._values, self.initializers, name)

    def _rules_for(self, key: tuple[str, str]) -> tuple[_OutputType, ...] | None:
        rules = self._output_type_rules.get(key, _NO_CONTRACT)
        if rules is _NO_CONTRACT:
            rules = self._output_type_rules[key] = _output_types(key[0], key[1], self.opsets.get(key[0]))
        return cast("tuple[_OutputType, ...] | None", rules)

    def _output_type(self, node: Node, output: str) -> _OutputType | None:
        """The schema's rule for `output`'s type; None when the op has no contract (or documents fewer outputs)."""
        rules = self._rules_for((node.domain, node.op_type))
        if not rules:
            return None
        position = node.outputs.index(output)
        if position >= len(rules):
            return None
        return rules[position]

    def _typing_inputs(self, node: Node, rule: _OutputType) -> list[str]:
        inputs = node.inputs
        out = [inputs[i] for i in rule.inputs if i < len(inputs) and inputs[i]]
        if rule.variadic_from is not None:
            out.extend(i for i in inputs[rule.variadic_from + 1:] if i)
        return out

    def _dtype_inputs(self, node: Node, output: str) -> tuple[str, ...] | list[str]:
        """The inputs whose dtypes decide `output`'s (may hold "" for omitted inputs)."""
        if node.op_type not in _DTYPE_SPECIAL_OPS:
            rule = self._output_type(node, output)
            if rule is None:
                return node.inputs
            return [] if rule.fixed else self._typing_inputs(node, rule)
        if node.op_type in ("Cast", "Constant", "ConstantOfShape") or node.op_type in _INT64_OUTPUT_OPS:
            return []
        if (node.domain, node.op_type) in _FIXED_OUTPUT_DTYPES:
            return []
        if (node.domain, node.op_type) in _DTYPE_FROM_INPUT:
            return [node.input(_DTYPE_FROM_INPUT[(node.domain, node.op_type)])]
        if node.domain == DEFAULT_DOMAIN and node.op_type in _SUBGRAPH_OUTPUT_OFFSET:
            source = _subgraph_output(node, output)
            return [source] if source else []
        if node.op_type == "CastLike":
            return [node.input(1)]
        if node.op_type in ("DequantizeLinear",):
            return [node.input(1)]
        if node.op_type in ("QuantizeLinear",):
            return [node.input(2)]
        if node.op_type == "Where":
            return [node.input(1), node.input(2)]
        return [i for i in node.inputs if i]

    def _infer_output_dtype(self, node: Node, output: str) -> str | None:
        op = node.op_type
        if op not in _DTYPE_SPECIAL_OPS:
            cache = self._dtype_cache
            rule = self._output_type(node, output)
            if rule is not None:  # the schema decides; a type it leaves open is unknown, never guessed
                if rule.fixed:
                    return rule.fixed
                for i in self._typing_inputs(node, rule):
                    found = cache.get(i)
                    if found:
                        return found
                return None
            for i in node.inputs:
                if i:
                    found = cache.get(i)
                    if found:
                        return found
            return None
        if op == "Cast":
            return dtype_name(node.attr("to", 0) or 0)
        if op in _INT64_OUTPUT_OPS:
            return "int64"
        if (node.domain, op) in _FIXED_OUTPUT_DTYPES:
            return _FIXED_OUTPUT_DTYPES[(node.domain, op)]
        if op == "Unique" and output != node.outputs[0]:  # indices, inverse indices, counts
            return "int64"
        if op in _BOOL_OUTPUT_OPS and node.domain == DEFAULT_DOMAIN:
            return "bool"
        if op == "TopK" and len(node.outputs) > 1 and output == node.outputs[1]:
            return "int64"
        if op in ("Constant",):
            value = node.attr("value")
            if isinstance(value, TensorSummary):
                return value.dtype
            if "value_float" in node.attributes or "value_floats" in node.attributes:
                return "float"
            if "value_int" in node.attributes or "value_ints" in node.attributes:
                return "int64"
            return None
        if op == "ConstantOfShape":
            value = node.attr("value")
            return value.dtype if isinstance(value, TensorSummary) else "float"
        if op in ("QuantizeLinear", "DequantizeLinear") and node.attr("output_dtype", 0):
            return dtype_name(node.attr("output_dtype", 0))
        if op == "QuantizeLinear":
            return self._dtype_cache.get(node.input(2)) or "uint8"
        for i in self._dtype_inputs(node, output):
            if i and self._dtype_cache.get(i):
                return self._dtype_cache[i]
        return None

    # ---- inputs, layers, subgraphs -----------------------------------------------------------------

    @property
    def inputs(self) -> list[ValueInfo]:
        """Graph inputs that are not initializers."""
        return self.input_infos

    @cached_property
    def input_names(self) -> frozenset[str]:
        """Names of the graph inputs that are not initializers (for membership tests in walks)."""
        return frozenset(i.name for i in self.input_infos)

    @property
    def outputs(self) -> list[ValueInfo]:
        return self.output_infos

    @cached_property
    def layers(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = defaultdict(list)
        for node in self.nodes:
            if node.layer is not None:
                out[node.layer].append(node)
        return dict(sorted(out.items()))

    @property
    def layer_count(self) -> int:
        return (max(self.layers) + 1) if self.layers else 0

    def layer_of_nodes(self, nodes: Iterable[Node]) -> int | None:
        """The layer most of these nodes belong to (ties: the lowest)."""
        counts: dict[int, int] = defaultdict(int)
        for n in nodes:
            if n.layer is not None:
                counts[n.layer] += 1
        if not counts:
            return None
        return min(counts, key=lambda layer: (-counts[layer], layer))

    @property
    def external_data_files(self) -> list[str]:
        return sorted({i.location for i in self.initializers.values() if i.external and i.location})

    def __len__(self) -> int:
        return len(self.nodes)
