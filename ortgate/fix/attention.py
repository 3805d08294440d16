"""Decomposed attention with a KV cache -> com.microsoft.GroupQueryAttention, with onnxscript's rewriter API.

onnxscript's own GQA rule reads only the graph its own fusions leave (an SDPA node fed by com.microsoft
RotaryEmbedding, and transformers' 4.4x causal-mask subgraph); the rule here reads the attention core every exporter
writes around a cache, whatever its mask and rotary look like:

    present_k = Concat(past_key, k, axis=-2)              present_v = Concat(past_value, v, axis=-2)   (graph outputs)
    K = repeat_kv(present_k) | present_k                   V = repeat_kv(present_v) | present_v
        repeat_kv: Reshape(Expand(Unsqueeze(., [2]), .), .)
    s = MatMul(q [* c], Transpose(K, [0, 1, 3, 2]) [* c]) [* c | / c] [+ mask]
    w = Softmax(s, -1) [then Where(IsNaN(w), 0, w)]
    out = Reshape(Transpose(MatMul(w, V), [0, 2, 1, 3]), .)          -> o_proj

q and k are [B, H, S, Dh] as the graph has them after its own rotary and q/k norms (kept before the rotary: they
are untouched). The node written:

    out, present_k, present_v = GroupQueryAttention(q', k', v', past_key, past_value, seqlens_k, total_seq_len)
        q' = Reshape(Transpose(q, [0, 2, 1, 3]), [0, 0, -1]) (and k', v' alike)
        seqlens_k = ReduceSum(attention_mask, 1) - 1 (int32), total_seq_len = attention_mask's second dim (int32)
        num_heads / kv_num_heads = the q / k projections' output widths over the head size (past_key's last dim),
        scale = the product of the graph's own scalings, do_rotary=0 (the graph's rotary stays beside it)

The mask is the graph's causal mask of attention_mask (GroupQueryAttention is causal over seqlens_k): that is not
read from the mask's subgraph, it is proven by running the delivered model (ortgate.fix.generate). A model whose
mask is anything else (a sliding window, bidirectional prefix) diverges there and keeps its original attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ortgate.knowledge.provider_names import CPU

MASK_CHECK_LENGTH = 1024  # prompt tokens the mask is computed for (a sliding window shorter than this is seen)
# ONNX Runtime's GroupQueryAttention (CPU, 1.31-1.32, group_query_attention_helper.h) refuses at run time a cos_cache
# whose width is not "<= head_size / 2 and a multiple of 8" unless it is exactly head_size / 2
GQA_PARTIAL_COS_MULTIPLE = 8
PACK_BUDGET = 1 << 30  # packed QKV weights are built in memory: beyond this, q, k and v stay separate
_DATA_PATH = {"Reshape", "Transpose", "SimplifiedLayerNormalization", "RMSNormalization", "LayerNormalization",
              "Add", "Mul", "Cast", "Identity", "Squeeze", "Unsqueeze", "Concat", "Slice", "Neg"}


@dataclass
class AttentionRewrite:
    node: str  # the GroupQueryAttention node written
    past_key: str
    num_heads: int
    kv_num_heads: int
    head_size: int
    scale: float
    rotary: bool = False  # folded in (do_rotary=1)
    window: int | None = None  # local_window_size: the graph's mask is a sliding window of this many positions
    packed: bool = False  # q, k and v from one MatMul (packed QKV)


@dataclass
class AttentionPass:
    rewrites: list[AttentionRewrite] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    context_length: int | None = None  # rows of the cos/sin caches: the rotary is folded only when it is known
    rotary_notes: list[str] = field(default_factory=list)  # why a rotary stayed beside its node
    tables: dict = field(default_factory=dict)  # id(cos value) -> (cos, sin) numbers, computed once for all layers
    caches: dict = field(default_factory=dict)  # id(cos value) -> (cos_cache, sin_cache) initializers, shared
    packed_bytes: int = 0  # packed QKV weights built in memory so far
    gained_cache: int = 0  # layers of a cache-less export given past / present


def _sliding_window_size(width: int) -> int:
    """GroupQueryAttention's local_window_size for a sliding window of `width` positions up to the diagonal: ORT's
    kernels keep local_window_size positions (measured on ORT 1.32 CPU against the graph's own band mask)."""
    return width


def _projection_width(value, depth: int = 24) -> int | None:
    """The output width of the linear projection `value` comes from, walking up its data path (reshapes,
    transposes, norms, the rotary's Add / Mul / Concat / Slice / Neg; every operand tried): a MatMul by a constant
    [in, out] gives out (a Gemm with transB=1 by [out, in])."""
    node = value.producer() if value is not None else None
    if node is None or depth <= 0:
        return None
    if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and node.inputs[1] is not None:
        weight = node.inputs[1]
        shape = weight.shape
        if (weight.const_value is not None or weight.is_initializer()) and shape is not None and shape.rank() == 2:
            transposed = node.op_type == "Gemm" and node.attributes.get_int("transB", 0) == 1
            width = shape[0] if transposed else shape[1]
            return width if isinstance(width, int) else None
        return None
    if node.op_type not in _DATA_PATH:
        return None
    operands = node.inputs[:1] if node.op_type not in ("Add", "Mul", "Concat") else node.inputs
    for operand in operands:
        width = _projection_width(operand, depth - 1)
        if width is not None:
            return width
    return None


def _reaches(value, name: str, depth: int = 64) -> bool:
    """Whether graph input `name` is upstream of `value` (within `depth` nodes)."""
    frontier, seen = [value], set[int]()
    while frontier and len(seen) < depth * 8:
        current = frontier.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if current.name == name and current.producer() is None:
            return True
        node = current.producer()
        if node is not None:
            frontier.extend(node.inputs)
    return False


@dataclass
class Rotation:
    """x * cos + rotate_half(x) * sin, as the graph computes it around q or k."""

    x: object  # the value before the rotation (ir.Value, [B, H, S, Dh])
    cos: object  # the cos table as multiplied (ir.Value, broadcast to [B, 1, S, Dh])
    sin: object
    partial: bool = False  # only the first rotary_dim channels are rotated, the rest passed through
    interleaved: bool = False  # channels rotated in adjacent pairs (0, 1), (2, 3)... rather than half-split


def _other(node, value):
    a, b = node.inputs[0], node.inputs[1]
    return b if a is value else a


def _rotate_half_of(value):
    """x where value = Concat(Neg(Slice(x, h, end)), Slice(x, 0, h), axis=-1) (transformers' rotate_half), else
    None."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
        return None
    if node.attributes.get_int("axis", 0) not in (-1, 3):
        return None
    neg, second = (i.producer() for i in node.inputs)
    if neg is None or second is None or neg.op_type != "Neg" or second.op_type != "Slice":
        return None
    first = neg.inputs[0].producer()
    if first is None or first.op_type != "Slice":
        return None
    x = second.inputs[0]
    return x if first.inputs[0] is x else None


def _strided_slice(value):
    """(data, start, step) where value = Slice(data, [start], [end], [-1 | 3], [step]) with constant bounds."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Slice" or len(node.inputs) < 5:
        return None
    starts, axes, steps = _ints(node.inputs[1]), _ints(node.inputs[3]), _ints(node.inputs[4])
    if not starts or len(starts) != 1 or axes not in ([-1], [3]) or not steps or len(steps) != 1:
        return None
    return node.inputs[0], starts[0], steps[0]


def _rotate_interleaved_of(value):
    """x where value = Reshape(Concat(Unsqueeze(Neg(x[..., 1::2]), -1), Unsqueeze(x[..., 0::2], -1), axis=-1)) (GLM's
    and GPT-J's pairwise rotate: (-x1, x0), (-x3, x2)...), else None."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Reshape":
        return None
    concat = node.inputs[0].producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2:
        return None
    if concat.attributes.get_int("axis", 0) not in (-1, 4):
        return None
    unsqueezed = [i.producer() for i in concat.inputs]
    if any(u is None or u.op_type != "Unsqueeze" or _ints(u.inputs[1]) not in ([-1], [4]) for u in unsqueezed):
        return None
    neg = unsqueezed[0].inputs[0].producer()
    if neg is None or neg.op_type != "Neg":
        return None
    odd, even = _strided_slice(neg.inputs[0]), _strided_slice(unsqueezed[1].inputs[0])
    if odd is None or even is None or odd[0] is not even[0] or (odd[1], odd[2], even[1], even[2]) != (1, 2, 0, 2):
        return None
    return odd[0]


def rotation_of(value) -> Rotation | None:
    """The rotation x * cos + rotate(x) * sin (rotate: half-split or pairwise) whose output is `value`, or None."""
    add = value.producer() if value is not None else None
    if add is None or add.op_type != "Add" or len(add.inputs) != 2:
        return None
    muls = [i.producer() for i in add.inputs]
    if any(m is None or m.op_type != "Mul" for m in muls):
        return None
    for plain, rotated in ((muls[0], muls[1]), (muls[1], muls[0])):
        for r_input in rotated.inputs:
            x = _rotate_half_of(r_input)
            interleaved = x is None
            if x is None:
                x = _rotate_interleaved_of(r_input)
            if x is None or not any(i is x for i in plain.inputs):
                continue
            return Rotation(x, _other(plain, x), _other(rotated, r_input), interleaved=interleaved)
    return None


def _ints(value) -> list[int] | None:
    """The int64 numbers of a constant (an initializer or a Constant node's output), else None."""
    if value is None:
        return None
    tensor = value.const_value
    node = value.producer()
    if tensor is None and node is not None and node.op_type == "Constant":
        attr = node.attributes.get("value")
        tensor = attr.value if attr is not None else None
    if tensor is None:
        return None
    try:
        return [int(i) for i in tensor.numpy().reshape(-1)]
    except (TypeError, ValueError):
        return None


def _last_axis_slice(value):
    """(data, start, end) where value = Slice(data, [start], [end], [-1 | 3]) with constant bounds, else None."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Slice" or len(node.inputs) < 4:
        return None
    starts, ends, axes = (_ints(node.inputs[i]) for i in (1, 2, 3))
    steps = _ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if not starts or not ends or axes not in ([-1], [3]) or steps != [1] or len(starts) != 1 or len(ends) != 1:
        return None
    return node.inputs[0], starts[0], ends[0]


def partial_rotation_of(value) -> Rotation | None:
    """The partial rotation Concat(rotation(Slice(x, 0, r)), Slice(x, r, end), axis=-1) (GLM's partial_rotary_factor:
    the first r channels rotated half-split, the rest passed through) whose output is `value`, or None. Its x is the
    whole head, its tables r wide."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
        return None
    if node.attributes.get_int("axis", 0) not in (-1, 3):
        return None
    rotation = rotation_of(node.inputs[0])
    rotated = _last_axis_slice(rotation.x) if rotation is not None else None
    passed = _last_axis_slice(node.inputs[1])
    if rotation is None or rotated is None or passed is None:
        return None
    if rotated[0] is not passed[0] or rotated[1] != 0 or passed[1] != rotated[2] or rotated[2] <= 0:
        return None
    return Rotation(rotated[0], rotation.cos, rotation.sin, partial=True, interleaved=rotation.interleaved)


def position_tables(ir_model, values: list, length: int, kv_heads: int, head: int) -> list | None:
    """The numbers `values` (tables computed from the positions) take for positions 0 .. length-1 at batch 1: the
    subgraph computing them, run on ORT CPU with input_ids / attention_mask / position_ids of that length and an
    empty cache. None where it needs anything else."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort

    nodes: dict[int, ir.Node] = {}
    initializers: dict[str, ir.Value] = {}
    inputs: dict[str, ir.Value] = {}
    frontier = list(values)
    while frontier:
        value = frontier.pop()
        if value is None:
            continue
        node = value.producer()
        if node is None:
            if value.const_value is not None:
                initializers[value.name or ""] = value
            elif value.name in {i.name for i in ir_model.graph.inputs}:
                inputs[value.name or ""] = value
            else:
                return None
            continue
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        frontier.extend(node.inputs)
        if len(nodes) > 2000:
            return None
    order = {id(n): i for i, n in enumerate(ir_model.graph)}
    protos = [ir.serde.serialize_node(n) for n in sorted(nodes.values(), key=lambda n: order.get(id(n), 0))]
    tensors = []
    for name, value in initializers.items():
        assert value.const_value is not None
        tensor = ir.serde.serialize_tensor(value.const_value)
        tensor.name = name
        tensors.append(tensor)
    feeds = {}
    for name in inputs:
        if name == "position_ids":
            feeds[name] = np.arange(length, dtype=np.int64)[None, :]
        elif name in ("input_ids", "attention_mask"):
            feeds[name] = (np.zeros if name == "input_ids" else np.ones)((1, length), np.int64)
        elif name.startswith("past_key_values."):
            feeds[name] = np.zeros((1, kv_heads, 0, head), np.float32)
        else:
            return None
    outputs = [onnx.helper.make_tensor_value_info(v.name, v.dtype.value if v.dtype is not None else
                                                  onnx.TensorProto.FLOAT, None) for v in values]
    graph = onnx.helper.make_graph(protos, "position_tables",
                                   [ir.serde.serialize_value(v) for v in inputs.values()], outputs, tensors)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v
                                                         in ir_model.opset_imports.items()])
    model.ir_version = ir_model.ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=[CPU])
    return session.run([v.name for v in values], feeds)


def _projection(value):
    """(x, W) where value = Transpose(Reshape(MatMul(x, W), .), [0, 2, 1, 3]) with W a constant [in, out]."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Transpose" or list(node.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = node.inputs[0].producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    matmul = reshape.inputs[0].producer()
    if matmul is None or matmul.op_type != "MatMul":
        return None
    weight = matmul.inputs[1]
    if weight is None or weight.const_value is None or weight.shape is None or weight.shape.rank() != 2:
        return None
    return matmul.inputs[0], weight


def packable(q, k, v):
    """(x, [Wq, Wk, Wv]) where q, k and v are three projections of one x, so one MatMul can compute them."""
    found = [_projection(t) for t in (q, k, v)]
    if any(f is None for f in found):
        return None
    xs = {id(f[0]) for f in found}
    return (found[0][0], [f[1] for f in found]) if len(xs) == 1 else None


def _rules(state: AttentionPass):
    import onnx_ir as ir
    from onnxscript.rewriter import _ir_utils, pattern

    def scalar(value) -> float | None:
        got = _ir_utils.get_singleton_value(value) if value is not None else None
        return float(got) if isinstance(got, (int, float)) else None

    class DecomposedGqa(pattern.RewriteRuleClassBase):
        def __init__(self, name: str, cache: bool | None = None):
            super().__init__(name, remove_nodes=False)
            # None: a Concat(past, k) cache or none; False: no cache (where a Concat on k is the partial rotary's)
            self.cache = cache
            self.pending: list[tuple[object, object, object, object]] = []
            self.gained: list[tuple] = []  # (layer, past_key, past_value, present_key, present_value): new cache
            self.own_shapes: set[int] = set()  # Shape(attention_mask) values the rewrite made
            self._window: int | None = None  # local_window_size of the match being rewritten

        def pattern(self, op, q, k, v, past_key, past_value, mask, qs, ks, ss, zero):
            present_k = op.Concat(past_key, k, _outputs=["present_k"])
            present_v = op.Concat(past_value, v, _outputs=["present_v"])
            # a cache-less export attends over this step's k and v only
            if self.cache is False:
                k_seq, v_seq = k, v
            else:
                k_seq = pattern.OrValue([present_k, k], tag_var="has_cache", tag_values=[True, False])
                v_seq = pattern.OrValue([present_v, v])
            k_rep = op.Reshape(op.Expand(op.Unsqueeze(k_seq, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE)
            v_rep = op.Reshape(op.Expand(op.Unsqueeze(v_seq, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE)
            k_all = pattern.OrValue([k_rep, k_seq], tag_var="repeat_kv", tag_values=[True, False])
            v_all = pattern.OrValue([v_rep, v_seq])
            # K^T directly, or through 3D as torch.onnx (dynamo) writes it: [B*H, S, D] -> [B*H, D, S] -> 4D
            k_t = pattern.OrValue([op.Transpose(k_all, perm=[0, 1, 3, 2]),
                                   op.Reshape(op.Transpose(op.Reshape(k_all, pattern.ANY_VALUE), perm=[0, 2, 1]),
                                              pattern.ANY_VALUE)])
            q_s = pattern.OrValue([op.Mul(q, qs), op.Div(q, qs), q], tag_var="q_scaling",
                                  tag_values=["Mul", "Div", "None"])
            k_s = pattern.OrValue([op.Mul(k_t, ks), op.Div(k_t, ks), k_t], tag_var="k_scaling",
                                  tag_values=["Mul", "Div", "None"])
            scores = op.MatMul(q_s, k_s)
            scores = pattern.OrValue([op.Mul(scores, ss), op.Div(scores, ss), scores], tag_var="s_scaling",
                                     tag_values=["Mul", "Div", "None"])
            scores = pattern.OrValue([op.Add(scores, mask), op.Add(mask, scores)])
            weights = op.Softmax(scores, axis=-1)
            weights = pattern.OrValue([op.Where(op.IsNaN(weights), zero, weights), weights])
            # torch.onnx (dynamo) may reshape the [B, H, S, D] product to itself before the transpose (GLM-4-MoE)
            product = op.MatMul(weights, v_all)
            product = pattern.OrValue([op.Reshape(product, pattern.ANY_VALUE), product])
            out = op.Transpose(product, perm=[0, 2, 1, 3])
            return op.Reshape(out, pattern.ANY_VALUE, _outputs=["attention"])

        def check(self, context, q, k, v, past_key, past_value, mask, zero, attention, present_k=None,
                  present_v=None, **tags):
            result = pattern.MatchResult()
            graph = context.graph_or_function
            inputs = {value.name: value for value in graph.inputs}
            has_cache = (self.cache is not False and bool(tags.get("has_cache", True)) and present_k is not None
                         and present_v is not None)
            if self.cache is not False and tags.get("has_cache", True) and not has_cache:
                return result.fail("k is a Concat but v is not: not a KV cache", k)
            if has_cache:
                for concat in (present_k.producer(), present_v.producer()):
                    if concat.attributes.get_int("axis", 0) not in (-2, 2):
                        return result.fail("the cache is not concatenated on the sequence axis", concat)
                if past_key.producer() is not None or past_value.producer() is not None:
                    return result.fail("past key / value are not graph inputs", past_key)
                outputs = list(graph.outputs)
                if present_k not in outputs or present_v not in outputs:
                    return result.fail("present key / value are not graph outputs", present_k)
            elif any(name.startswith("past_key_values.") for name in inputs):
                return result.fail("an attention without a cache in a graph whose other layers have one", k)
            if zero is not None and scalar(zero) != 0.0:
                return result.fail("Where(IsNaN) does not write 0", zero)
            mask_input = inputs.get("attention_mask")
            if mask_input is None:
                return result.fail("the graph has no attention_mask input to give GroupQueryAttention seqlens_k")
            if not _reaches(mask, "attention_mask"):
                return result.fail("the additive mask is not computed from attention_mask", mask)
            if has_cache:
                head = past_key.shape[3] if past_key.shape is not None and past_key.shape.rank() == 4 else None
                kv_heads_cache = past_key.shape[1] if head is not None else None
            else:
                head = next((x.shape[-1] for x in (k, q) if x.shape is not None and x.shape.rank() == 4
                             and isinstance(x.shape[-1], int)), None)
                kv_heads_cache = None
            if not isinstance(head, int):
                return result.fail("the head size (past_key's or k's last dim) is not a number", k)
            q_width, k_width, v_width = _projection_width(q), _projection_width(k), _projection_width(v)
            if q_width is None or k_width is None or v_width is None:
                return result.fail("q, k or v is not read back to a linear projection with a constant weight", q)
            if q_width % head or k_width % head or k_width != v_width:
                return result.fail(f"projection widths q {q_width}, k {k_width}, v {v_width} are not whole heads "
                                   f"of {head}", q)
            heads, kv_heads = q_width // head, k_width // head
            if isinstance(kv_heads_cache, int) and kv_heads_cache != kv_heads:
                return result.fail(f"the cache has {kv_heads_cache} heads, the k projection {kv_heads}", past_key)
            if heads % kv_heads:
                return result.fail(f"{heads} query heads do not share {kv_heads} kv heads evenly", q)
            if (heads != kv_heads) != bool(tags.get("repeat_kv")):
                return result.fail("repeat_kv does not match the head counts", q)
            scale = 1.0
            for tag, name in (("q_scaling", "qs"), ("k_scaling", "ks"), ("s_scaling", "ss")):
                kind = tags.get(tag, "None")
                if kind == "None":
                    continue
                got = scalar(tags.get(name))
                if got is None or got == 0.0:
                    return result.fail(f"the {tag.replace('_', ' ')} is not a constant scalar")
                scale *= got if kind == "Mul" else 1.0 / got
            causal, self._window = self._plain_causal(context.model, mask, kv_heads, head)
            if causal is not None:
                state.misses.append(causal)
                return result.fail(causal, mask)
            self._rotary = self._fold_rotary(context.model, q, k, kv_heads, head)
            if not has_cache and self._rotary is None:
                why = state.rotary_notes[-1] if state.rotary_notes else "it has no rotary GroupQueryAttention can fold"
                return result.fail("a cache-less attention gains a KV cache only with its rotary folded into "
                                   f"GroupQueryAttention, whose positions then continue from the cache: {why}", q)
            self._found = (heads, kv_heads, head, scale, mask_input)
            return result

        def _plain_causal(self, model, mask, kv_heads: int, head: int) -> tuple[str | None, int | None]:
            """(None, None) where the additive mask, computed by the graph's own subgraph for a prompt of
            MASK_CHECK_LENGTH tokens (attention_mask all ones), is the plain causal mask GroupQueryAttention applies:
            0 at and below the diagonal, a large negative number above it; (None, W) where it is a sliding window
            of W positions (0 for the W positions up to the diagonal, large negative elsewhere), which
            GroupQueryAttention (ORT's kernels) applies as local_window_size W. Otherwise why not (a prefix, a bidirectional
            mask...), None."""
            import numpy as np

            length = min(state.context_length or MASK_CHECK_LENGTH, MASK_CHECK_LENGTH)
            key = ("mask", id(mask))
            if key not in state.tables:
                try:
                    state.tables[key] = position_tables(model, [mask], length, kv_heads, head)
                except Exception as exc:
                    state.tables[key] = f"it could not be computed alone ({type(exc).__name__})"
            got = state.tables[key]
            if got is None or isinstance(got, str):
                return f"the additive mask is not proven causal: {got or 'it depends on more than the prompt'}", None
            values = np.asarray(got[0], np.float64)
            if values.shape[-2:] != (length, length):
                return f"the additive mask for a {length}-token prompt has shape {list(values.shape)}", None
            values = values.reshape(-1, length, length)
            below = np.tril(np.ones((length, length), bool))
            if not (values[:, ~below] <= -1e4).all():
                return ((f"the additive mask lets positions above the diagonal of a {length}-token prompt through "
                        "(not causal): GroupQueryAttention's causal mask would hide them"), None)
            if (values[:, below] == 0).all():
                return None, None
            # a sliding window of W positions: row i sees i - W + 1 .. i
            width = int((values[:, -1, :] == 0).sum(axis=-1).min())
            rows, cols = np.indices((length, length))
            window = below & (rows - cols < width)
            if width > 0 and (values[:, window] == 0).all() and (values[:, below & ~window] <= -1e4).all():
                return None, _sliding_window_size(width)
            return ((f"the additive mask hides positions at or below the diagonal of a {length}-token prompt, and "
                    "not as a sliding window GroupQueryAttention's local_window_size writes"), None)

        def _fold_rotary(self, model, q, k, kv_heads: int, head: int):
            """(q before the rotation, k before it, cos_cache, sin_cache) where the rotary can be folded in."""
            rq, rk = rotation_of(q) or partial_rotation_of(q), rotation_of(k) or partial_rotation_of(k)
            if rq is None or rk is None:
                if rq is not None or rk is not None:
                    state.rotary_notes.append("q and k are not rotated alike: the rotary stays beside the node")
                return None
            if rq.cos is not rk.cos or rq.sin is not rk.sin:
                state.rotary_notes.append("q and k are rotated by different tables: the rotary stays beside the node")
                return None
            if state.context_length is None:
                state.rotary_notes.append("the rotary stays beside the node: pass --context-length N (the rows of "
                                          "GroupQueryAttention's cos/sin caches) to fold it in")
                return None
            try:
                tables = state.tables.get(id(rq.cos))
                if tables is None:
                    tables = position_tables(model, [rq.cos, rq.sin], state.context_length, kv_heads, head)
                    state.tables[id(rq.cos)] = tables
            except Exception as exc:  # the subgraph does not run alone: the rotary stays beside
                state.rotary_notes.append(f"the cos/sin tables could not be computed alone ({type(exc).__name__}): "
                                          "the rotary stays beside the node")
                return None
            if tables is None:
                state.rotary_notes.append("the cos/sin tables depend on more than the positions: the rotary stays "
                                          "beside the node")
                return None
            import numpy as np

            width = int(np.asarray(tables[0]).shape[-1])  # the rotary dim: the head, or its first channels (partial)
            if rq.partial != rk.partial or width % 2 or width > head or (width != head) != rq.partial:
                state.rotary_notes.append(f"the cos/sin tables are {width} wide for a head of {head}: the rotary stays "
                                          "beside the node")
                return None
            cos, sin = (np.asarray(t, np.float32).reshape(-1, width) for t in tables)
            half = width // 2
            if half != head // 2 and half % GQA_PARTIAL_COS_MULTIPLE:
                state.rotary_notes.append(
                    f"a partial rotary of {width} of {head} head dims: ONNX Runtime's GroupQueryAttention takes "
                    f"cos/sin caches narrower than half the head only in multiples of {GQA_PARTIAL_COS_MULTIPLE} "
                    f"(these are {half} wide): the rotary stays beside the node")
                return None
            if rq.interleaved != rk.interleaved:
                state.rotary_notes.append("q is rotated in pairs and k half-split (or the reverse): the rotary stays "
                                          "beside the node")
                return None
            # half-split: cos = [c, c]; interleaved (pairs): cos = [c0, c0, c1, c1, ...]
            first, second = ((slice(None, None), slice(0, None, 2), slice(1, None, 2)) if rq.interleaved
                             else (slice(None, None), slice(0, half), slice(half, None)))[1:]
            if (cos.shape[0] != state.context_length or not np.array_equal(cos[:, first], cos[:, second])
                    or not np.array_equal(sin[:, first], sin[:, second])):
                state.rotary_notes.append("the cos/sin tables are not one row per position with each value twice "
                                          f"({'in pairs' if rq.interleaved else 'in halves'}): the rotary stays "
                                          "beside the node")
                return None
            return (rq.x, rk.x, np.ascontiguousarray(cos[:, first]), np.ascontiguousarray(sin[:, first]), id(rq.cos),
                    rq.interleaved)

        def rewrite(self, op, q, k, v, past_key, past_value, present_k=None, present_v=None, **_):
            heads, kv_heads, head, scale, mask_input = self._found
            gained = None
            if present_k is None:  # a cache-less export: it gains past / present, as onnxruntime-genai names them
                index = len(self.gained)
                dtype = q.dtype if q.dtype is not None else ir.DataType.FLOAT
                past_key, past_value = (
                    ir.Value(name=f"past_key_values.{index}.{kind}", type=ir.TensorType(dtype),
                             shape=ir.Shape(["batch_size", kv_heads, "past_sequence_length", head]))
                    for kind in ("key", "value"))
                gained = (index, past_key, past_value)
            flat = op.Constant(value_ints=[0, 0, -1])

            def bsd(x):
                return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), flat)

            lengths = op.ReduceSum(mask_input, op.Constant(value_ints=[1]), keepdims=0)
            seqlens_k = op.Cast(op.Sub(lengths, op.Constant(value_int=1)), to=ir.DataType.INT32)
            mask_shape = op.Shape(mask_input)
            self.own_shapes.add(id(mask_shape))
            total = op.Cast(op.Gather(mask_shape, op.Constant(value_int=1), axis=0), to=ir.DataType.INT32)
            attributes = {"num_heads": heads, "kv_num_heads": kv_heads}
            if not math.isclose(scale, 1.0 / math.sqrt(head), rel_tol=1e-6):
                attributes["scale"] = scale
            window = self._window
            if window is not None:
                attributes["local_window_size"] = window
            rotary = self._rotary
            extra = []
            packed = None
            if rotary is not None:
                q, k, cos, sin, table, interleaved = rotary
                if table not in state.caches:  # one cos/sin cache pair for every layer rotated by these tables
                    index = len(state.caches)
                    state.caches[table] = (op.initializer(ir.tensor(cos, name=f"rotary.{index}.cos_cache")),
                                           op.initializer(ir.tensor(sin, name=f"rotary.{index}.sin_cache")))
                extra = list(state.caches[table])
                attributes |= {"do_rotary": 1, "rotary_interleaved": int(interleaved)}
                packed = packable(q, k, v)
                size = sum(w.const_value.nbytes for w in packed[1]) if packed is not None else 0
                if packed is not None and state.packed_bytes + size > PACK_BUDGET:
                    state.rotary_notes.append(f"q, k and v stay separate MatMuls past {PACK_BUDGET >> 20} MiB of "
                                              "packed weights built in memory")
                    packed = None
                state.packed_bytes += size if packed is not None else 0
            if packed is not None:
                # q, k and v of one input, nothing between projection and attention: one MatMul, packed QKV
                x, weights = packed
                import numpy as np

                stacked = np.concatenate([w.const_value.numpy() for w in weights], axis=1)
                qkv = op.MatMul(x, op.initializer(ir.tensor(stacked, name=f"{weights[0].name}.packed_qkv")))
                query, key, value = qkv, None, None
            else:
                query, key, value = bsd(q), bsd(k), bsd(v)
            out, new_k, new_v = op.GroupQueryAttention(
                query, key, value, past_key, past_value, seqlens_k, total, *extra,
                _domain="com.microsoft", _outputs=3, **attributes)
            if gained is None:
                self.pending.append((present_k, new_k, present_v, new_v))
            else:
                self.gained.append((*gained, new_k, new_v))
            state.rewrites.append(AttentionRewrite("", past_key.name or "", heads, kv_heads, head, scale,
                                                   rotary is not None, window, packed is not None))
            return out

    return DecomposedGqa


def _both_rules(instance, rule_class) -> list:
    """The rule as written (a Concat(past, k) cache or none), then one without a cache for graphs where k itself is a
    Concat (a partial rotary's rotated and passed-through halves), sharing what the first records."""
    from onnxscript.rewriter import pattern

    plain = rule_class("DecomposedAttentionWithoutCache", cache=False)
    plain.pending, plain.gained, plain.own_shapes = instance.pending, instance.gained, instance.own_shapes
    return [pattern.RewriteRule(i.pattern, i.rewrite, i.check, name=i.name, remove_nodes=False)
            for i in (instance, plain)]


def fuse_gqa(ir_model, context_length: int | None = None) -> AttentionPass:
    """Rewrite each decomposed attention with a KV cache into GroupQueryAttention; the cache outputs move to the new
    nodes under their names. With `context_length`, a half-split rotary of q and k is folded in (cos/sin caches of
    that many rows, computed by the graph's own subgraph)."""
    import onnx_ir as ir
    from onnxscript.rewriter import pattern

    state = AttentionPass(context_length=context_length)
    rule_class = _rules(state)
    instance = rule_class("DecomposedAttentionWithCache")
    rule_set = pattern.RewriteRuleSet(_both_rules(instance, rule_class), commute=False)
    rule_set.apply_to_model(ir_model)
    for old_k, new_k, old_v, new_v in instance.pending:
        for old, new in ((old_k, new_k), (old_v, new_v)):
            name = old.name
            old.replace_all_uses_with(new, replace_graph_outputs=True)
            old.name = f"{name}_unfused"
            new.name = name
    for index, past_key, past_value, new_k, new_v in instance.gained:
        ir_model.graph.inputs.extend([past_key, past_value])
        for value, kind in ((new_k, "key"), (new_v, "value")):
            value.name = f"present.{index}.{kind}"
            value.shape = ir.Shape(["batch_size", past_key.shape[1], "total_sequence_length", past_key.shape[3]])
            value.type = past_key.type
            ir_model.graph.outputs.append(value)
    state.gained_cache = len(instance.gained)
    if instance.gained:
        # A cache-less export's attention_mask is [batch, sequence] like input_ids, and the graph may read the
        # sequence length off it (torch.onnx does). With a cache it is [batch, past + sequence]: every other Shape of
        # it reads input_ids instead, whose shape it stood for.
        inputs = {value.name: value for value in ir_model.graph.inputs}
        mask, ids = inputs.get("attention_mask"), inputs.get("input_ids")
        if mask is not None and ids is not None:
            for node in list(ir_model.graph):
                if node.op_type == "Shape" and node.inputs[0] is mask and id(node.outputs[0]) not in instance.own_shapes:
                    node.replace_input_with(0, ids)
    for rewrite in state.rewrites:
        rewrite.node = ""
    return state


def fuse_gqa_with_cache(ir_model, options: dict) -> int:
    """The fusion pipeline's step: the GroupQueryAttention nodes written (`options["context_length"]`: fold the
    rotary; `options["notes"]` gets why a rotary stayed beside)."""
    state = fuse_gqa(ir_model, options.get("context_length"))
    options.setdefault("notes", []).extend(dict.fromkeys(state.rotary_notes))
    options.setdefault("attention_notes", []).extend(dict.fromkeys(state.misses))
    options["gained_cache"] = options.get("gained_cache", 0) + state.gained_cache
    return len(state.rewrites)


_SCORE_PATH = {"Add", "Sub", "Mul", "Div", "Where", "Concat", "Cast"}
_OPERAND_PATH = {"Mul", "Div", "Transpose", "Reshape", "Cast"}
PLAIN_REASONS = {
    "mla": "multi-head latent attention: GroupQueryAttention has no latent projection (q and k are a non-rotated part "
           "concatenated with a separately rotated one, k and v expanded from a compressed latent)",
    "sinks": "attention sinks: not written (the softmax runs over a learned sink logit per head beside the scores)",
    "gated": "gated attention output: not written (a sigmoid gate multiplies the attention before the output "
             "projection)",
    "recurrent": "mamba / linear-attention layers (a causal depthwise Conv over the sequence): GroupQueryAttention "
                 "cannot express them and fix writes no cache for their conv and recurrent state, so the attention "
                 "layers beside them are not given a KV cache either",
}


def _scores_matmul(softmax, depth: int = 6):
    """The MatMul of two computed values (q . k^T) upstream of a Softmax's input, or None."""
    frontier = [(softmax.inputs[0], 0)]
    while frontier:
        value, d = frontier.pop()
        node = value.producer() if value is not None else None
        if node is None or d > depth:
            continue
        if node.op_type == "MatMul":
            if all(i is not None and i.producer() is not None for i in node.inputs[:2]):
                return node
            continue
        if node.op_type in _SCORE_PATH:
            frontier.extend((i, d + 1) for i in node.inputs)
    return None


def _split_head(value, depth: int = 4) -> bool:
    """Whether `value` is, through scalings and layout, a Concat of two parts on the last axis."""
    node = value.producer() if value is not None else None
    for _ in range(depth):
        if node is None:
            return False
        if node.op_type == "Concat":
            return len(node.inputs) == 2 and node.attributes.get_int("axis", 0) in (-1, 3)
        if node.op_type == "ScatterND" and len(node.inputs) == 3:
            # k's rotated part written into its tail, one rotated key shared by every head (Expand)
            update = node.inputs[2].producer() if node.inputs[2] is not None else None
            while update is not None and update.op_type in ("Transpose", "Reshape", "Cast"):
                update = update.inputs[0].producer() if update.inputs[0] is not None else None
            return update is not None and update.op_type == "Expand"
        if node.op_type not in _OPERAND_PATH:
            return False
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    return False


def _gated_output(softmax) -> bool:
    """Whether the attention output, Reshape(Transpose(Softmax . V)), is multiplied by a Sigmoid."""
    frontier = [(softmax.outputs[0], 0)]
    while frontier:
        value, d = frontier.pop()
        for user, _ in value.uses():
            if user.op_type == "Mul" and any(i is not None and i.producer() is not None
                                             and i.producer().op_type == "Sigmoid" for i in user.inputs):
                return True
            if d < 5 and user.op_type in ("MatMul", "Transpose", "Reshape", "Where", "Slice", "Cast"):
                frontier.append((user.outputs[0], d + 1))
    return False


def plain_reasons(ir_model) -> list[str]:
    """Why the model's attention is a form GroupQueryAttention (as ortgate writes it) does not express, in plain
    words, read from the graph: multi-head latent attention, attention sinks, a gated output, mamba / linear-attention
    layers beside a cache-less attention. Empty where none of these is seen."""
    found: dict[str, None] = {}
    for node in ir_model.graph:
        if node.op_type != "Softmax":
            continue
        scores = _scores_matmul(node)
        if scores is None:
            continue  # a router's or another softmax, not attention's
        if _split_head(scores.inputs[0]) and _split_head(scores.inputs[1]):
            found["mla"] = None
        users = [user.op_type for user, _ in node.outputs[0].uses()]
        if "Slice" in users and _has_concat_before(node):
            found["sinks"] = None
        if _gated_output(node):
            found["gated"] = None
    inputs = [value.name or "" for value in ir_model.graph.inputs]
    if not any(name.startswith("past_key_values.") for name in inputs) and any(
            node.op_type == "Conv" and node.attributes.get_int("group", 1) > 1 for node in ir_model.graph):
        found["recurrent"] = None
    return [PLAIN_REASONS[key] for key in found]


def _has_concat_before(softmax, depth: int = 3) -> bool:
    frontier = [(softmax.inputs[0], 0)]
    while frontier:
        value, d = frontier.pop()
        node = value.producer() if value is not None else None
        if node is None or d > depth:
            continue
        if node.op_type == "Concat" and node.attributes.get_int("axis", 0) in (-1, 3):
            return True
        frontier.extend((i, d + 1) for i in node.inputs)
    return False


def near_miss(ir_model) -> str | None:
    """Why the GroupQueryAttention rule stopped where it came closest (onnxscript's MatchingTracer), or None."""
    from onnxscript.rewriter import _basics

    state = AttentionPass()
    rule_class = _rules(state)
    rules = _both_rules(rule_class("DecomposedAttentionWithCache"), rule_class)
    tracer = _basics.MatchingTracer()
    for node in list(ir_model.graph):
        if node.op_type == "Reshape":
            for rule in rules:
                rule.try_rewrite(ir_model, ir_model.graph, node, tracer=tracer)
    best = None
    for matches in tracer.best_matches_map.values():
        for info in matches:
            if best is None or info.score() > best.score():
                best = info
    if best is None:
        return None
    return (f"ortgate's GroupQueryAttention rule came closest at {best.root_node.name or best.root_node.op_type}: "
            f"{best.match_result.reason or 'no match'}")


def cache_not_fed_back(model) -> str | None:
    """Why a cache an export writes but never reads is not turned into a KV cache, or None: GroupQueryAttention nodes
    with no past_key / past_value whose present outputs are graph outputs (transformers' OnnxExporter with
    ort_fusions: `cache.layers.N.keys` out, no past in). Their seqlens_k, total_sequence_length, cos/sin caches,
    position ids and attention bias are computed for this call's tokens alone, so giving them a past would mean
    rewriting every one of those inputs; fix does not."""
    outputs = {o.name for o in model.graph.output}
    inputs = {i.name: i for i in model.graph.input}
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    cut = [n for n in nodes if (len(n.input) < 5 or not n.input[3] or not n.input[4])
           and any(name in outputs for name in n.output[1:3])]
    if not cut or any(i.startswith("past") for i in inputs):
        return None
    written = [name for n in cut for name in n.output[1:3] if name in outputs]
    ids = inputs.get("input_ids")
    batch = None
    if ids is not None and ids.type.tensor_type.shape.dim:
        first = ids.type.tensor_type.shape.dim[0]
        batch = first.dim_value if first.HasField("dim_value") else None
    fixed_batch = f"; its batch is fixed at {batch}" if batch else ""
    return (f"the export writes a KV cache ({', '.join(written[:2])}{', ...' if len(written) > 2 else ''}: "
            f"{len(cut)} GroupQueryAttention nodes) but reads none (no past inputs): each step recomputes the whole "
            "sequence. Not rewired: its GroupQueryAttention's seqlens_k, total_sequence_length, cos/sin caches, "
            f"position ids and attention bias are computed for this call's tokens alone{fixed_batch}. Export it "
            "with past_key_values inputs (transformers' exporter given a cache, or onnxruntime-genai's builder)")
