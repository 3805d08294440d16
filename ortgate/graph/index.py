"""The read-only graph index every rule reads. Built once per model, in one pass over the protobuf.

It holds nodes by (domain, op_type), producers and consumers of every value, declared shapes and dtypes,
initializer metadata (never their bytes), subgraph nodes (If/Loop/Scan bodies, flattened with their path)
and the decoder layer each node belongs to. What it holds per node and value is ortgate.graph.nodes; how it
answers dtypes, ortgate.graph.dtypes.
"""

from __future__ import annotations

import gc
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cached_property
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from ortgate.errors import printable
from ortgate.graph.dtypes import DtypeInference, _DtypeTable, _OutputType
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


class _ConsumerTable(dict):
    """Value name -> the nodes reading it; a name nothing reads gets a new empty list (not kept)."""

    __slots__ = ()

    def __missing__(self, name: str) -> list[Node]:
        return []


class Graph(DtypeInference):
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
