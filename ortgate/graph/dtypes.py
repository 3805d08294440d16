"""Dtype inference of the graph index: a value's declared dtype, else one propagated through its producers by the
operators' contracts (exported graphs rarely declare it). Graph takes it from DtypeInference."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ortgate.graph.nodes import (
    DEFAULT_DOMAIN,
    MS_DOMAIN,
    Initializer,
    Node,
    TensorSummary,
    ValueInfo,
    _value_info,
    dtype_name,
)
from ortgate.proto import ATTR_GRAPH

if TYPE_CHECKING:  # the models are duck-typed: onnx.ModelProto, or ortgate.proto's classes of the same schema
    import onnx

_UNKNOWN = object()  # not in a cache yet (None is a cached answer)

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


class DtypeInference:
    """Graph's dtype queries and their propagation, over the index's producers, declared values and initializers."""

    nodes: list[Node]
    opsets: dict[str, int]
    initializers: dict[str, Initializer]
    _producer: dict[str, Node]
    _values: dict[str, ValueInfo | onnx.ValueInfoProto]
    _dtype_cache: _DtypeTable
    _dtypes_filled: bool
    _output_type_rules: dict[tuple[str, str], tuple[_OutputType, ...] | None]

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
