"""Model rules (OGM): MoE routing, GroupQueryAttention configuration and tensor-parallel splits against the policy
and the model family."""

from __future__ import annotations

from typing import Any

from ortgate.config.expectations import Expected
from ortgate.findings import Location, Severity
from ortgate.graph.index import MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.attention import gqa_nodes
from ortgate.graph.patterns.common import is_op, matmul_weight
from ortgate.graph.patterns.moe import fused_moe_nodes, moe_blocks
from ortgate.graph.patterns.projections import gated_mlps, projection_dims
from ortgate.knowledge import Support, kernel_table
from ortgate.knowledge.families import family_labels, family_names, swiglu_parameters_text
from ortgate.knowledge.fusions import attribute_default
from ortgate.knowledge.moe import moe_inputs
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, layers_text
from ortgate.rules.norms import close, resolved_family

MOE_ROUTING_FIX = (
    "Re-export the MoE nodes with the model's routing: k = num_experts_per_tok, normalize_routing_weights = "
    f"norm_topk_prob (1 for {', '.join(family_labels(lambda f: bool(f.norm_topk_prob)))}), use_sparse_mixer=1 only "
    f"for {', '.join(family_labels(lambda f: bool(f.use_sparse_mixer)))}, activation_type=swiglu for SiLU-gated "
    "experts with activation_alpha / activation_beta / swiglu_limit as the family's "
    f"({swiglu_parameters_text()}). onnxruntime-genai's builder writes these from config.json. If the policy is "
    "wrong, correct model.top_k / norm_topk_prob / activation / family."
)


def _layers(nodes: list[Node]) -> str:
    text = layers_text(nodes)
    return f" {text}" if text else ""


def _int(value: Any) -> int | None:
    """An integer attribute; None for anything else (a hostile graph may write k as text or a list)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _expected_bool(ctx: RuleContext, key: str, family_value: Any, family_label: str) -> tuple[Any, str] | None:
    declared = ctx.expect.declared(key)
    if declared is not None:
        return declared.value, f"{declared.describe()} (model.{key})"
    if family_value is not None:
        return family_value, family_label
    return None


def _fc3(node: Node) -> str:
    return node.input(moe_inputs(node.op_type).fc3_experts_weights)


@rule("OGM001", "moe-routing-mismatch", Severity.ERROR)
def moe_routing_mismatch(ctx: RuleContext):
    """MoE / QMoE routing or activation attributes differ from the policy or the model family.

    ## What it checks
    Every com.microsoft MoE / QMoE node of the exported model (attributes ORT fills in when absent, ORT's schema
    defaults: k=1, normalize_routing_weights=0, activation_type=relu, activation_alpha=1, activation_beta=0):
    - `k` against the policy's `model.top_k` (and the `k` input of TopK in an unfused MoE);
    - `normalize_routing_weights` against the policy's `model.norm_topk_prob`, else the family's
      (ortgate/knowledge/model_families.json), and `use_sparse_mixer` for families routed by a sparse mixer (PhiMoE);
    - the activation against the policy's `model.activation`, else the family's (`swiglu` for gated SiLU experts;
      `activation_type=silu` with fc3 weights is the same math, unmerged), and for SwiGLU the family's
      `activation_alpha`, `activation_beta` and `swiglu_limit` (GPT-OSS: 1.702, 1.0, 7.0).
    The family is the policy's `model.family`, else genai_config.json's `model.type`; an unknown family name is
    reported as undecided. One finding per attribute and value, listing the layers.

    ## Why it costs throughput
    These attributes change what the model computes: a wrong `k` routes each token to too few or too many experts
    (too many costs expert GEMMs on every token), unnormalised weights scale every MoE output, a wrong activation or
    alpha computes a different MLP. Throughput measured on a model that computes something else is no measurement.

    ## Bad
    ```
    y = com.microsoft.MoE(h, logits, fc1, None, fc2, k=2, activation_type="swiglu",
                          normalize_routing_weights=0)            # Qwen3-30B-A3B: top-8, norm_topk_prob=true
    ```

    ## Good
    ```
    y = com.microsoft.MoE(h, logits, fc1, None, fc2, k=8, activation_type="swiglu", swiglu_fusion=1,
                          normalize_routing_weights=1, activation_alpha=1.0, activation_beta=0.0)
    ```

    ## Fix
    Re-export with the routing from the model's config.json (onnxruntime-genai's builder reads it), or correct the
    policy when it is the policy that is wrong.
    """
    graph = ctx.model
    family = resolved_family(ctx)
    family_name = ctx.expect.value("family")
    nodes = fused_moe_nodes(graph)
    blocks = [b for b in moe_blocks(graph) if b.fused is None and b.topk is not None]
    if not nodes and not blocks:
        return
    if family_name and family is None and (ctx.expect.declared("norm_topk_prob") is None
                                           or ctx.expect.declared("activation") is None):
        yield ctx.undecided(
            f"model family {family_name!r} is not in ortgate's model_families.json (known: {', '.join(family_names())}): "
            "normalize_routing_weights and the activation are checked only against the policy's model.norm_topk_prob "
            "and model.activation", graph=graph)
    fam_label = f"the {family.name} family" if family else ""
    checks: dict[tuple[str, Any], dict] = {}

    def mismatch(attr: str, node: Node, have: Any, want: Any, source: str, location: Location | None = None):
        entry = checks.setdefault((attr, have), {"nodes": [], "want": want, "source": source, "location": location})
        entry["nodes"].append(node)

    top_k = ctx.expect.declared("top_k")
    norm = _expected_bool(ctx, "norm_topk_prob", family.norm_topk_prob if family else None,
                          f"{fam_label} renormalises the top-k weights ({family.source('norm_topk_prob')})" if family else "")
    activation = ctx.expect.declared("activation")
    want_act = (activation.value, f"{activation.describe()} (model.activation)") if activation is not None else (
        (family.moe_activation, f"{fam_label} uses {family.moe_activation} experts") if family and family.moe_activation
        else None)

    def default(node: Node, attr: str) -> Any:
        value = node.attr(attr)
        return value if value is not None else attribute_default(MS_DOMAIN, node.op_type, attr)

    for node in nodes:
        k = _int(default(node, "k"))
        if top_k is not None and k is not None and int(k) != int(top_k.value):
            mismatch("k", node, int(k), int(top_k.value), top_k.describe() + " (model.top_k)")
        sparse = _int(default(node, "use_sparse_mixer")) or 0
        if family is not None and family.use_sparse_mixer and sparse != family.use_sparse_mixer:
            mismatch("use_sparse_mixer", node, sparse, family.use_sparse_mixer,
                     f"{fam_label} routes with a sparse mixer ({family.source('use_sparse_mixer')})")
        normalize = _int(default(node, "normalize_routing_weights")) or 0
        if norm is not None and norm[0] is not None and not sparse and bool(normalize) != bool(norm[0]):
            mismatch("normalize_routing_weights", node, normalize, int(bool(norm[0])), norm[1])
        act = str(default(node, "activation_type") or "relu")
        effective = "swiglu" if act == "swiglu" or (act == "silu" and _fc3(node)) else act
        if want_act is not None and effective != want_act[0]:
            mismatch("activation_type", node, act, want_act[0], want_act[1])
        if family is not None and act == "swiglu" and family.moe_activation == "swiglu":
            for attr, want in (("activation_alpha", family.swiglu_alpha), ("activation_beta", family.swiglu_beta)):
                have = _float(default(node, attr))
                if want is not None and have is not None and not close(float(have), float(want)):
                    mismatch(attr, node, float(have), want, f"{fam_label} uses {want:g} ({family.source('swiglu_alpha')})")
            limit = _float(node.attr("swiglu_limit"))
            if (limit is None) != (family.swiglu_limit is None) or (
                    limit is not None and family.swiglu_limit is not None and not close(float(limit), family.swiglu_limit)):
                mismatch("swiglu_limit", node, limit, family.swiglu_limit,
                         f"{fam_label} clamps at {family.swiglu_limit}" if family.swiglu_limit is not None
                         else f"{fam_label} does not clamp")
    for block in blocks:
        k = graph.scalar(block.topk.input(1)) if block.topk is not None else None
        if top_k is not None and isinstance(k, int) and k != int(top_k.value):
            mismatch("TopK k", block.topk, k, int(top_k.value), top_k.describe() + " (model.top_k)")
    for (attr, have), entry in checks.items():
        found = entry["nodes"]
        op = found[0].key if attr != "TopK k" else "TopK"
        shown = "absent" if have is None else have
        yield ctx.finding(
            f"{op} {attr}={shown}{_layers(found)} ({len(found)} node{'s' if len(found) > 1 else ''}), but "
            f"{entry['source']}: expected {entry['want']}",
            node=found[0], graph=graph, related=found[1:], fix=MOE_ROUTING_FIX,
            properties={"attribute": attr, "found": have, "expected": entry["want"], "nodes": len(found)},
        )


def _o_proj_width(graph: Graph, node: Node) -> int | None:
    frontier = list(node.outputs[:1])
    for _ in range(4):
        nxt = []
        for value in frontier:
            for c in graph.consumers(value):
                dims = matmul_weight(graph, c)
                if dims is not None and c.input(0) == value:
                    return dims[0]
                if is_op(c, "Mul", "Reshape", "Cast", "Transpose", "Identity"):
                    nxt.extend(c.outputs[:1])
        frontier = nxt
    return None


def gqa_head_size(graph: Graph, node: Node) -> tuple[int | None, str]:
    """A GroupQueryAttention's head size from the graph: KV cache shapes, the query width, or o_proj's input width."""
    nh, kv = node.attr("num_heads"), node.attr("kv_num_heads")
    for value in (node.input(3), node.input(4), *node.outputs[1:3]):
        shape = graph.shape(value) if value else None
        if shape and len(shape) == 4 and isinstance(shape[3], int):
            return shape[3], f"{value} shape"
    if nh:
        query = graph.shape(node.input(0))
        if query and isinstance(query[-1], int):
            heads = nh + 2 * (kv or 0) if not node.input(1) else nh
            if query[-1] % heads == 0:
                return query[-1] // heads, f"query width {query[-1]} / {heads} heads"
        width = _o_proj_width(graph, node)
        if width and width % nh == 0:
            return width // nh, f"o_proj input width {width} / {nh} heads"
    return None, ""


@rule("OGM002", "gqa-config-mismatch", Severity.ERROR)
def gqa_config_mismatch(ctx: RuleContext):
    """GroupQueryAttention is configured in a way the model or the target provider cannot run as intended.

    ## What it checks
    Every com.microsoft GroupQueryAttention node of the exported model:
    - `num_heads % kv_num_heads != 0` (or more kv heads than q heads): query groups cannot share kv heads evenly;
    - its head size (from the KV cache shapes, the query width, or the input width of o_proj) against the policy's
      `model.head_size` or genai_config.json's `head_size`;
    - float32 inputs while the policy or genai_config.json targets CUDAExecutionProvider: ORT's CUDA kernel is
      float16/bfloat16 only (kernel table), so the node runs on CPU;
    - `local_window_size` against genai_config.json's `sliding_window` (GPT-OSS alternates sliding-window and full
      layers: listed layers need the window, the others -1).
    Heads against the policy (`num_heads`, `kv_num_heads`) are reported by gqa-not-fused.

    ## Why it costs throughput
    A float32 GroupQueryAttention under CUDA falls back to the CPU provider: every layer copies q/k/v and the KV
    cache between device and host, and CUDA graph capture becomes impossible. A wrong head size or group count
    computes a different attention; a sliding layer exported with a full window attends (and caches) the whole
    context instead of 128 tokens.

    ## Bad
    ```
    o = com.microsoft.GroupQueryAttention(q_fp32, k_fp32, v_fp32, ..., num_heads=12, kv_num_heads=8)
    ```

    ## Good
    ```
    o = com.microsoft.GroupQueryAttention(q_fp16, k_fp16, v_fp16, ..., num_heads=32, kv_num_heads=4)
    ```

    ## Fix
    Export for CUDA in float16/bfloat16 (onnxruntime-genai: `-p fp16 -e cuda`), with num_heads / kv_num_heads /
    head size and the sliding window from config.json; correct the policy if it is the policy that is wrong.
    """
    graph = ctx.model
    nodes = gqa_nodes(graph)
    if not nodes:
        return
    head_size = ctx.expect.declared("head_size")
    cuda = [s for s in ctx.deployment.setups if s.provider_name == "CUDAExecutionProvider"]
    genai = ctx.inputs.genai
    window = genai.decoder.get("sliding_window") if genai is not None else None
    sliding = set(genai.sliding_window_layers) if genai is not None else set()
    window_size = window.get("window_size") if isinstance(window, dict) else None
    wrong_size: list[tuple[Node, int, str]] = []
    fp32: list[tuple[Node, str]] = []
    for node in nodes:
        nh, kv = node.attr("num_heads"), node.attr("kv_num_heads")
        if isinstance(nh, int) and isinstance(kv, int) and nh > 0 and kv > 0 and (kv > nh or nh % kv):
            yield ctx.finding(
                f"GroupQueryAttention num_heads={nh} is not a multiple of kv_num_heads={kv}: the query heads cannot be "
                "grouped over the kv heads (ORT rejects the node at run time)",
                node=node, graph=graph,
                fix="Set num_heads and kv_num_heads from config.json (num_attention_heads, num_key_value_heads).",
                properties={"num_heads": nh, "kv_num_heads": kv},
            )
        if head_size is not None:
            size, how = gqa_head_size(graph, node)
            if size is None:
                yield ctx.undecided(
                    f"the head size of {node.display_name} is not in the graph (no static KV cache or query shape, no "
                    f"o_proj behind it) to compare with {head_size.describe()}", graph=graph, node=node)
            elif size != int(head_size.value):
                wrong_size.append((node, size, how))
        if cuda:
            dtype = graph.dtype(node.input(0))
            if dtype is not None:
                result = kernel_table().supports("CUDAExecutionProvider", MS_DOMAIN, "GroupQueryAttention",
                                                 graph.opsets.get(MS_DOMAIN), [dtype])
                if result == Support.NO:
                    fp32.append((node, result.reason))
        if window_size is not None and sliding and node.layer is not None:
            have = _int(node.attr("local_window_size", -1))
            want = int(window_size) if node.layer in sliding else -1
            if have is not None and int(have) != want:
                kind = "a sliding-window layer" if want != -1 else "a full-attention layer"
                line = genai.line_of("model", "decoder", "sliding_window")
                yield ctx.finding(
                    f"GroupQueryAttention in layer {node.layer} has local_window_size={have}, but genai_config.json "
                    f"(line {line}) makes layer {node.layer} {kind}: expected {want}",
                    node=node, graph=graph,
                    fix="Re-export with the model's layer_types / sliding_window (onnxruntime-genai's builder writes "
                        "local_window_size on sliding layers only).",
                    properties={"local_window_size": have, "expected": want},
                )
    if wrong_size:
        node, size, how = wrong_size[0]
        yield ctx.finding(
            f"GroupQueryAttention head size {size} ({how}){_layers([n for n, _, _ in wrong_size])}, but "
            f"{head_size.describe()} (head_size)",
            node=node, graph=graph, related=[n for n, _, _ in wrong_size[1:]],
            fix="Re-export with the model's head_dim, or correct the policy's model.head_size.",
            properties={"head_size": size, "expected": head_size.value},
        )
    if fp32:
        node, reason = fp32[0]
        origins = " and ".join(sorted({s.label for s in cuda}))
        yield ctx.finding(
            f"{len(fp32)} GroupQueryAttention node{'s' if len(fp32) > 1 else ''}{_layers([n for n, _ in fp32])} take "
            f"{graph.dtype(node.input(0))} inputs while {origins} targets CUDAExecutionProvider: {reason}; "
            "they run on CPU with host/device copies around each",
            node=node, graph=graph, related=[n for n, _ in fp32[1:]],
            fix="Export for CUDA in float16 or bfloat16 (onnxruntime-genai: -p fp16 -e cuda).",
            properties={"nodes": len(fp32)},
        )


def _moe_intermediate(graph: Graph) -> int | None:
    for node in fused_moe_nodes(graph):
        if node.op_type != "MoE":
            continue  # QMoE packs and may prepack its weights: shapes do not say the width plainly
        fc2 = graph.value(node.input(moe_inputs(node.op_type).fc2_experts_weights))
        if fc2 is not None and fc2.shape and len(fc2.shape) == 3 and isinstance(fc2.shape[2], int):
            return fc2.shape[2]
    return None


def _mlp_widths(graph: Graph) -> list[int]:
    widths = set()
    for mlp in gated_mlps(graph):
        if mlp.gate is None:
            continue
        dims = projection_dims(graph, mlp.gate)
        if dims:
            widths.add(dims[-1] // 2 if mlp.merged else dims[-1])
    return sorted(widths)


@rule("OGM004", "tensor-parallel-split", Severity.ERROR)
def tensor_parallel_split(ctx: RuleContext):
    """With `model.tensor_parallel: N`, heads, kv heads, experts or intermediate sizes do not split evenly over N ranks.

    ## What it checks
    Only when the policy declares `model.tensor_parallel` N > 1. Tensor parallelism shards attention by heads and
    the MLP/MoE by intermediate columns (and experts by rank in expert parallelism), so each of these must be a
    multiple of N: `num_heads`, `experts`, `moe_intermediate_size` (policy, else the MoE weights) and the gated MLPs'
    intermediate widths (graph). kv heads split as `max(kv_heads // N, 1)` per rank: N <= kv_heads needs
    kv_heads % N == 0; N > kv_heads replicates each kv head on N / kv_heads ranks, which needs N % kv_heads == 0
    (reported as info: each rank holds one kv head, replicated). Values come from the policy, genai_config.json or
    the graph, as `ortgate` resolved them; findings point at the policy's `tensor_parallel` line.

    ## Why it costs throughput
    An uneven split leaves ranks with different shapes: the sharded runtime refuses it, or pads, and the slowest
    rank sets the pace of every all-reduce. Replicated kv heads cost memory and KV-cache bandwidth on every rank
    (the CANN Qwen3-MoE recipe: 4 kv heads over 8 cards means each kv head lives on 2 cards).

    ## Bad
    ```yaml
    model: {num_heads: 32, kv_num_heads: 4, experts: 128, tensor_parallel: 6}
    ```

    ## Good
    ```yaml
    model: {num_heads: 32, kv_num_heads: 4, experts: 128, tensor_parallel: 8}   # kv heads replicated x2
    ```

    ## Fix
    Choose a tensor-parallel degree that divides num_heads, experts and the intermediate sizes (and divides or is a
    multiple of kv_num_heads), or correct the policy's model values.
    """
    tp = ctx.expect.declared("tensor_parallel")
    if tp is None or not isinstance(tp.value, int) or tp.value <= 1:
        return
    n = tp.value
    where = tp.location
    expect = ctx.expect

    def split(label: str, expected: Expected | None, value: int | None = None, origin: str = ""):
        if expected is not None:
            value, origin = expected.value, expected.describe()
        if not isinstance(value, int) or value <= 0 or value % n == 0:
            return None
        return ctx.finding(
            f"{label} {value} ({origin}) does not split over tensor_parallel {n}: {value} / {n} is not whole",
            location=where, fix=f"Use a tensor-parallel degree that divides {label} ({value}), or correct the policy.",
            properties={"value": value, "tensor_parallel": n, "what": label},
        )

    for finding in (split("num_heads", expect.num_heads), split("experts", expect.experts)):
        if finding is not None:
            yield finding
    if expect.moe_intermediate_size is not None:
        finding = split("moe_intermediate_size", expect.moe_intermediate_size)
    else:
        finding = split("moe_intermediate_size", None, _moe_intermediate(ctx.model), "the MoE weights")
    if finding is not None:
        yield finding
    for width in _mlp_widths(ctx.model):
        finding = split("intermediate size", None, width, "a gated MLP's gate projection in the graph")
        if finding is not None:
            yield finding
    kv = expect.kv_num_heads
    if kv is not None and isinstance(kv.value, int) and kv.value > 0:
        heads = kv.value
        if n <= heads and heads % n:
            yield ctx.finding(
                f"kv_num_heads {heads} ({kv.describe()}) does not split over tensor_parallel {n}",
                location=where, fix=f"Use a tensor-parallel degree that divides {heads} or is a multiple of it.",
                properties={"value": heads, "tensor_parallel": n, "what": "kv_num_heads"},
            )
        elif n > heads and n % heads:
            yield ctx.finding(
                f"tensor_parallel {n} is more than kv_num_heads {heads} ({kv.describe()}) but not a multiple of it: "
                "the kv heads cannot be replicated evenly over the ranks",
                location=where, fix=f"Use a multiple of {heads} (or a divisor of it) as the tensor-parallel degree.",
                properties={"value": heads, "tensor_parallel": n, "what": "kv_num_heads"},
            )
        elif n > heads:
            yield ctx.finding(
                f"tensor_parallel {n} > kv_num_heads {heads}: each rank holds max({heads} // {n}, 1) = 1 kv head, every "
                f"kv head replicated on {n // heads} ranks (KV cache and k/v projections duplicated)",
                location=where, severity=Severity.INFO,
                properties={"value": heads, "tensor_parallel": n, "what": "kv_num_heads", "replicas": n // heads},
            )
