"""The MoE rewrite: every unfused MoE block whose anatomy com.microsoft.MoE can express becomes one MoE node.

The node follows the contract in knowledge/ort_moe.json: the hidden state as `input`, the router logits reshaped to
[tokens, experts] as `router_probs` (the kernel applies softmax and top-k itself), fc1 [E, 2I, H] with gate and up
rows interleaved (swiglu_fusion=1, the only SwiGLU form ORT's CPU kernel accepts) or [E, I, H] without a gate, the
empty fc1 bias slot ORT >= 1.25 requires, and fc2 [E, H, I]. Its output takes the name of the routed sum it replaces,
so whatever consumed that sum (a shared expert's Add, the residual) is unchanged; the nodes only the old block used are
removed. Weights are not read here: new tensors are planned, and written later one expert at a time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortgate.cost import StepShape, step_model
from ortgate.cost.model import expert_bytes_read, fused_expert_bytes_read
from ortgate.errors import printable
from ortgate.fix.weights import DataFile, MemorySink, WeightSource, itemsize
from ortgate.graph.index import Graph
from ortgate.graph.patterns.moe_anatomy import MoeAnatomy, WeightView, moe_anatomies, rewrite_refusal
from ortgate.graph.patterns.moe_group_routing import GroupRouting, group_verdict
from ortgate.knowledge.group_router import group_router_facts
from ortgate.knowledge.moe import moe_inputs
from ortgate.knowledge.moe_op import moe_op_facts

PLACEHOLDER_LOCATION = "model.onnx.data"


@dataclass
class MoeRewrite:
    """One MoE block replaced by one com.microsoft.MoE node."""

    anatomy: MoeAnatomy
    node_name: str
    fc1: str
    fc2: str
    attributes: dict
    fc1_bias: str = ""  # "" when the experts have no biases
    fc2_bias: str = ""
    removed: int = 0
    added: int = 0
    bytes_before: int = 0  # expert weight bytes read per decode token (one token), derived from the weight shapes
    bytes_after: int = 0
    notes: list[str] = field(default_factory=list)
    verification: str = "not run"
    group: GroupRouting | None = None  # routed by com.microsoft.MoEGroupRouter before the MoE node

    @property
    def layer(self) -> int | None:
        return self.anatomy.layer

    @property
    def output(self) -> str:
        return self.anatomy.output


@dataclass
class MoeRefusal:
    """A block left as it is, and why."""

    layer: int | None
    node: str
    reason: str


@dataclass
class PlannedTensor:
    """A new initializer whose bytes are produced when the output is written."""

    name: str
    kind: str  # fc1 | fc2
    rewrite: MoeRewrite
    dims: tuple[int, ...]
    data_type: int


def plan_moe(graph: Graph, release: str | None = None) -> tuple[list[MoeRewrite], list[MoeRefusal]]:
    """The MoE rewrites for a deployment on onnxruntime `release` (the policy's; None: not named), and the blocks
    left as they are with the reason."""
    rewrites, refusals = [], []
    taken = set(graph.initializers) | {n.name for n in graph.nodes}
    facts = moe_op_facts()
    for a in moe_anatomies(graph):
        verdict = rewrite_refusal(a)
        group = None
        bad_k = _bad_k(a)
        if bad_k:
            refusals.append(MoeRefusal(a.layer, a.anchor.display_name, bad_k))
            continue
        grouped = group_verdict(graph, a, release)
        if grouped is not None:
            if grouped.anatomy is None:
                refusals.append(MoeRefusal(a.layer, a.anchor.display_name, grouped.reason or ""))
                continue
            a, group = grouped.anatomy, grouped.group
        elif not verdict.rewritable:
            refusals.append(MoeRefusal(a.layer, a.anchor.display_name, verdict.reason or ""))
            continue
        prefix = f"model.layers.{a.layer}.moe" if a.layer is not None else f"moe.{a.anchor.index}"
        fc1 = _unique(f"{prefix}.experts.gate_up_proj.weight" if a.activation == "swiglu"
                      else f"{prefix}.experts.fc1.weight", taken)
        fc2 = _unique(f"{prefix}.experts.down_proj.weight", taken)
        name = _unique(f"/model/layers.{a.layer}/moe/MoE" if a.layer is not None else f"/moe.{a.anchor.index}/MoE",
                       taken)
        rewrite = MoeRewrite(a, name, fc1, fc2, _attributes(a, facts), group=group)
        if group is not None:
            # MoE's softmax over the router's log-scores renormalises the picks itself; normalize_routing_weights=1
            # changes nothing in the result, and the CPU kernel then copies its input first (no in-place defect).
            rewrite.attributes.update(k=group.top_k, normalize_routing_weights=1)
            rewrite.notes.append(_group_note(group))
        if any(v is not None and v.bias is not None for e in a.experts for v in (e.gate, e.up, e.down)):
            rewrite.fc1_bias = _unique(f"{prefix}.experts.gate_up_proj.bias" if a.activation == "swiglu"
                                       else f"{prefix}.experts.fc1.bias", taken)
            rewrite.fc2_bias = _unique(f"{prefix}.experts.down_proj.bias", taken)
        _price(graph, rewrite)
        assert a.hidden_size is not None and a.intermediate_size is not None  # set for every anatomy not refused
        if a.hidden_size == a.intermediate_size or a.hidden_size == 2 * a.intermediate_size:
            rewrite.notes.append(facts.square_layout_note(a.hidden_size, a.intermediate_size))
        rewrites.append(rewrite)
    return rewrites, refusals


def _bad_k(a: MoeAnatomy) -> str | None:
    """A router whose k no MoE node can take: never rewritten (with or without verification)."""
    experts = a.num_experts or len(a.experts)
    if a.k is not None and (a.k <= 0 or (experts and a.k > experts)):
        return f"the router's TopK picks k={a.k} of {experts or 'an unknown number of'} experts: no MoE node has such a k"
    return None


def _group_note(group: GroupRouting) -> str:
    bias = f"correction bias {group.bias}" if group.bias else "no correction bias"
    scale = (f"; routed scaling factor {group.scale:g} as one Mul after the MoE" if group.scale != 1.0 else "")
    return (f"routing: com.microsoft.{group_router_facts().op_type} (sigmoid scores, {bias}, n_group={group.n_group}, "
            f"topk_group={group.topk_group}, group_topk={group.group_topk}, top_k={group.top_k}), its picks "
            f"renormalised by MoE's softmax over their log-scores{scale}")


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 0
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate


def _attributes(a: MoeAnatomy, facts) -> dict:
    attrs: dict = {"k": a.k, "activation_type": a.activation, "normalize_routing_weights": int(a.normalize),
                   "use_sparse_mixer": int(a.routing == "sparsemixer")}
    if a.activation == "swiglu":
        alpha, beta, limit = a.swiglu
        attrs.update(swiglu_fusion=facts.cpu_swiglu_fusion, activation_alpha=float(alpha), activation_beta=float(beta))
        if limit is not None:
            attrs["swiglu_limit"] = float(limit)
    return attrs


# One decode token: the step the rewrite's bytes are quoted for.
# One token over a context of one: a graph without a KV cache recomputes its whole context per step, and the bytes
# quoted are those of the token the rewrite is about.
DECODE_TOKEN = StepShape(batch=1, new_tokens=1, context=1)


def _price(graph: Graph, r: MoeRewrite) -> None:
    """Expert weight bytes one decode token reads before and after the rewrite, as the cost model prices the block
    (`ortgate estimate` of the same model) and the fused MoE node that replaces it."""
    model = step_model(graph, DECODE_TOKEN, gpu=False)
    form = next((f for f in model.moe_forms if f.anchor is r.anatomy.anchor), None)
    before = expert_bytes_read(form) if form is not None else None
    after = fused_expert_bytes_read(form, model.tokens) if form is not None else None
    r.bytes_before = round(before or 0)
    r.bytes_after = round(after or 0)


def _dtype_code(graph: Graph, initializer: str) -> int:
    dtype = graph.initializers[initializer].dtype or "float"
    return TensorProto.DataType.Value(dtype.upper())


# ---- editing the protobuf ----------------------------------------------------------------------------------------


def apply_moe(model: onnx.ModelProto, graph: Graph, rewrites: list[MoeRewrite]) -> list[PlannedTensor]:
    """Replace each block in `model` (in place); returns the new tensors to write."""
    if not rewrites:
        return []
    g = model.graph
    nodes = list(g.node)
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for o in node.output:
            if o:
                producer[o] = i
    uses: Counter = Counter()
    for node in nodes:
        uses.update(i for i in node.input if i)
        uses.update(_subgraph_references(node))
    uses.update(o.name for o in g.output)
    removed: set[int] = set()
    inserted: dict[int, list[onnx.NodeProto]] = {}
    planned: list[PlannedTensor] = []
    new_initializers: list[onnx.TensorProto] = []
    for r in rewrites:
        a = r.anatomy
        assert a.combine is not None
        position = producer[a.combine.outputs[0]]
        shape_name = f"{r.node_name}/router_shape"
        logits_2d = f"{r.node_name}/router_logits"
        new_initializers.append(onnx.numpy_helper.from_array(np.array([-1, len(a.experts)], dtype=np.int64),
                                                             shape_name))
        reshape = helper.make_node("Reshape", [a.logits, shape_name], [logits_2d], name=f"{r.node_name}/Reshape")
        dtype = _dtype_code(graph, a.experts[0].down.initializer)
        added = [reshape]
        probs = logits_2d
        if r.group is not None:
            probs, router_nodes = _group_router_nodes(r, logits_2d, dtype, new_initializers)
            added.extend(router_nodes)
        moe_output = a.output if r.group is None or r.group.scale == 1.0 else f"{r.node_name}/unscaled"
        moe = helper.make_node("MoE", _moe_node_inputs(a.hidden, probs, r.fc1, r.fc2, r.fc1_bias, r.fc2_bias),
                               [moe_output], name=r.node_name, domain="com.microsoft", **r.attributes)
        added.append(moe)
        if moe_output != a.output:
            assert r.group is not None
            scale_name = f"{r.node_name}/routed_scaling_factor"
            new_initializers.append(onnx.numpy_helper.from_array(
                np.array(r.group.scale, dtype=helper.tensor_dtype_to_np_dtype(dtype)), scale_name))
            added.append(helper.make_node("Mul", [moe_output, scale_name], [a.output], name=f"{r.node_name}/scale"))
        uses.update([a.logits, a.hidden])
        before = len(removed)
        _remove(position, nodes, producer, uses, removed, protect={a.output})
        r.removed = len(removed) - before
        r.added = len(added)
        inserted[position] = added
        assert a.hidden_size is not None and a.intermediate_size is not None  # set for every anatomy not refused
        rows = 2 * a.intermediate_size if a.activation == "swiglu" else a.intermediate_size
        planned.append(PlannedTensor(r.fc1, "fc1", r, (len(a.experts), rows, a.hidden_size), dtype))
        planned.append(PlannedTensor(r.fc2, "fc2", r, (len(a.experts), a.hidden_size, a.intermediate_size), dtype))
        if r.fc1_bias:
            planned.append(PlannedTensor(r.fc1_bias, "fc1_bias", r, (len(a.experts), rows), dtype))
            planned.append(PlannedTensor(r.fc2_bias, "fc2_bias", r, (len(a.experts), a.hidden_size), dtype))
    kept: list[onnx.NodeProto] = []
    for i, node in enumerate(nodes):
        kept.extend(inserted.get(i, ()))
        if i not in removed:
            kept.append(node)
    del g.node[:]
    g.node.extend(kept)
    still_used = set(uses.elements()) | {n for node in kept for n in node.input}
    survivors = [t for t in g.initializer if t.name in still_used]
    del g.initializer[:]
    g.initializer.extend(survivors)
    g.initializer.extend(new_initializers)
    for t in planned:
        tensor = g.initializer.add()
        tensor.name, tensor.data_type = t.name, t.data_type
        tensor.dims.extend(t.dims)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", PLACEHOLDER_LOCATION), ("offset", "0"), ("length", "0")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    known = {o for node in kept for o in node.output} | {i.name for i in g.input}
    infos = [v for v in g.value_info if v.name in known]
    del g.value_info[:]
    g.value_info.extend(infos)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return planned


def _group_router_nodes(r: MoeRewrite, logits_2d: str, dtype: int, new_initializers: list[onnx.TensorProto]
                        ) -> tuple[str, list[onnx.NodeProto]]:
    """MoEGroupRouter over the [tokens, E] logits with the block's correction bias as a float32 [E] vector."""
    group = r.group
    assert group is not None
    experts = len(r.anatomy.experts)
    nodes: list[onnx.NodeProto] = []
    if group.bias is None:
        bias = f"{r.node_name}/expert_bias"
        new_initializers.append(onnx.numpy_helper.from_array(np.zeros(experts, dtype=np.float32), bias))
    else:
        bias = group.bias
        cast = f"{r.node_name}/expert_bias"
        shape = f"{r.node_name}/expert_bias_shape"
        new_initializers.append(onnx.numpy_helper.from_array(np.array([experts], dtype=np.int64), shape))
        nodes.append(helper.make_node("Reshape", [bias, shape], [cast + "/flat"], name=f"{r.node_name}/bias_flat"))
        nodes.append(helper.make_node("Cast", [cast + "/flat"], [cast], to=TensorProto.FLOAT,
                                      name=f"{r.node_name}/bias_float"))
        bias = cast
    facts = group_router_facts()
    probs = f"{r.node_name}/router_probs"
    nodes.append(helper.make_node(facts.op_type, [logits_2d, bias], [probs], name=f"{r.node_name}/GroupRouter",
                                  domain=facts.domain, top_k=group.top_k, n_group=group.n_group,
                                  topk_group=group.topk_group, group_topk=group.group_topk,
                                  router_sentinel=facts.sentinel))
    return probs, nodes


def _moe_node_inputs(hidden: str, logits: str, fc1: str, fc2: str, fc1_bias: str = "", fc2_bias: str = ""
                     ) -> list[str]:
    """The node's inputs by the kernel table's positions; optional slots before the last one given stay "" (ORT >=
    1.25 wants at least the empty fc1 bias slot: knowledge/ort_moe.json)."""
    positions = moe_inputs("MoE")
    given = {positions.input: hidden, positions.router_probs: logits, positions.fc1_experts_weights: fc1,
             positions.fc2_experts_weights: fc2}
    if fc1_bias:
        given.update({positions.fc1_experts_bias: fc1_bias, positions.fc2_experts_bias: fc2_bias})
    count = max(max(given) + 1, moe_op_facts().min_inputs)
    return [given.get(i, "") for i in range(count)]


def _remove(position: int, nodes, producer: dict[str, int], uses: Counter, removed: set[int], protect: set[str]) -> None:
    """Remove the node at `position` and, transitively, every producer left without a consumer."""
    stack = [position]
    while stack:
        i = stack.pop()
        if i in removed:
            continue
        removed.add(i)
        for value in nodes[i].input:
            if not value:
                continue
            uses[value] -= 1
            if uses[value] <= 0:
                del uses[value]
                j = producer.get(value)
                if j is not None and j not in removed and value not in protect and all(
                        not o or (uses.get(o, 0) <= 0 and o not in protect) for o in nodes[j].output):
                    stack.append(j)


def _subgraph_references(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read from the enclosing scope (counted as used: never removed)."""
    out: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            for n in sub.node:
                out.update(i for i in n.input if i)
                out.update(_subgraph_references(n))
    return out


# ---- writing the fused weights ------------------------------------------------------------------------------------


def view_matrix(source: WeightSource, view: WeightView) -> np.ndarray:
    """One expert matrix in [out, in] order (raw elements)."""
    matrix = source.read(view.initializer, index=view.index)
    if view.transposed:
        matrix = matrix.T
    if view.rows is not None:
        start, stop, step = view.rows
        matrix = matrix[start:stop:step]
    return np.ascontiguousarray(matrix)


def write_planned(tensor: PlannedTensor, source: WeightSource, out: DataFile | MemorySink) -> tuple[int, int]:
    """Write one fused tensor expert by expert; (offset, length) in the data file."""
    offset = out.begin()
    length = 0
    for expert in tensor.rewrite.anatomy.experts:
        if tensor.kind.endswith("_bias"):
            data = _bias_block(source, tensor, expert).tobytes()
            out.append(data)
            length += len(data)
            continue
        if tensor.kind == "fc2":
            block = view_matrix(source, expert.down)
        elif expert.gate is not None:
            gate, up = view_matrix(source, expert.gate), view_matrix(source, expert.up)
            block = np.empty((gate.shape[0] * 2, gate.shape[1]), dtype=gate.dtype)
            block[0::2], block[1::2] = gate, up  # swiglu_fusion=1: g0, u0, g1, u1, ...
        else:
            block = view_matrix(source, expert.up)
        expected = tensor.dims[1:]
        if tuple(block.shape) != tuple(expected):
            raise ValueError(f"{tensor.name}: expert {expert.index} block {block.shape} is not {expected}")
        data = block.tobytes()
        out.append(data)
        length += len(data)
    return offset, length


def _bias_vector(source: WeightSource, view: WeightView | None, rows: int, dtype) -> np.ndarray:
    """One expert's bias for `view` (zeros when it has none), rows applied as for its weight."""
    if view is None or view.bias is None:
        return np.zeros(rows, dtype=dtype)
    name, index = view.bias
    vector = source.read(name, index=index).reshape(-1)
    if view.rows is not None:
        start, stop, step = view.rows
        vector = vector[start:stop:step]
    return np.ascontiguousarray(vector)


def _bias_block(source: WeightSource, tensor: PlannedTensor, expert) -> np.ndarray:
    raw = np.uint16 if itemsize(tensor.data_type) == 2 else np.uint32 if itemsize(tensor.data_type) == 4 else np.uint64
    if tensor.kind == "fc2_bias":
        return _bias_vector(source, expert.down, tensor.dims[1], raw)
    if expert.gate is None:
        return _bias_vector(source, expert.up, tensor.dims[1], raw)
    half = tensor.dims[1] // 2
    block = np.empty(tensor.dims[1], dtype=raw)
    block[0::2] = _bias_vector(source, expert.gate, half, raw)  # interleaved as fc1's rows
    block[1::2] = _bias_vector(source, expert.up, half, raw)
    return block


def weight_names(rewrites: list[MoeRewrite]) -> list[str]:
    """Every initializer the fused tensors are read from."""
    names: list[str] = []
    for r in rewrites:
        for e in r.anatomy.experts:
            for v in (e.gate, e.up, e.down):
                if v is not None:
                    names.append(v.initializer)
                    if v.bias is not None:
                        names.append(v.bias[0])
    return list(dict.fromkeys(names))


def describe_refusal(r: MoeRefusal) -> str:
    where = f"layer {r.layer}" if r.layer is not None else "MoE block"
    return f"{where} ({printable(r.node)}): left unchanged: {r.reason}"
