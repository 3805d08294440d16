"""Placement rules (OGK): which provider runs each node, the copies between devices, and CUDA graph capture.

Placement is read from the kernel table (ortgate/knowledge/kernels.json, which names the ORT version it
reflects): a node whose (domain, op_type, opset, input dtypes) has no kernel on the target provider is left to
the CPU provider. An op the table does not list at all is unknown to it, never "no kernel".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ortgate.findings import SESSION_FAILS, Severity
from ortgate.graph.index import DEFAULT_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import cached
from ortgate.knowledge import (
    Support,
    SupportResult,
    cpu_fallback_facts,
    cuda_graph_capture_facts,
    data_dependent_shape_inputs,
    kernel_free_op,
    kernel_table,
    memcpy_ops,
    tensorrt_untaken_domain,
)
from ortgate.knowledge.provider_names import CPU, CUDA, TENSORRT
from ortgate.rules.advice import torch_export_advice
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, layers_text
from ortgate.rules.contracts import input_dtypes, type_violations
from ortgate.rules.provider import cuda_graph_enabled, cuda_graph_option
from ortgate.rules.targets import by_layer, layer_text

MEMCPY_OPS = memcpy_ops()
_FLOAT_DTYPES = frozenset({"float", "float16", "bfloat16", "double"})


# ---- evidence shared by the rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """The kernel table's answer for one node on one provider."""

    node: Node
    result: SupportResult
    computes: bool  # a float tensor goes in: real compute, not shape or index arithmetic


def placements(graph: Graph, provider: str) -> list[Placement]:
    """Every node whose kernel on `provider` is not a plain yes (no kernel, or unknown to the table)."""

    def compute(g: Graph) -> list[Placement]:
        table = kernel_table()
        opsets = g.opsets
        # One answer per (domain, op_type, input dtypes) (a graph has one opset per domain): None where the node
        # runs on `provider` (or without a kernel), else (the table's answer, whether a float tensor goes in).
        answers: dict[tuple, tuple[SupportResult, bool] | None] = {}
        out: list[Placement] = []
        for node, dtypes in zip(g.nodes, input_dtypes(g)):
            key = (node.domain, node.op_type, dtypes)
            try:
                answer = answers[key]
            except KeyError:
                answer = answers[key] = _placement_answer(table, provider, node.domain, node.op_type,
                                                          opsets.get(node.domain), dtypes)
            if answer is not None:
                out.append(Placement(node, *answer))
        return out

    return cached(graph, f"placement.{provider}", compute)


def _placement_answer(table, provider: str, domain: str, op_type: str, opset: int | None,
                      dtypes: tuple[str | None, ...]) -> tuple[SupportResult, bool] | None:
    if kernel_free_op(domain, op_type):
        return None
    result = table.supports(provider, domain, op_type, opset, list(dtypes))
    if result.status is Support.YES:
        return None
    return result, any(d in _FLOAT_DTYPES for d in dtypes)


def cpu_bound(graph: Graph, provider: str) -> list[Placement]:
    """Nodes the kernel table says `provider` has no kernel for: ORT gives them to the CPU provider. A node whose input
    type its op's contract does not allow is op-input-type's (no provider has a kernel for it)."""
    owned = {id(n) for found in type_violations(graph).values() for n, *_ in found}
    return [p for p in placements(graph, provider) if p.result.status is Support.NO and id(p.node) not in owned]



def _count(nodes: list[Node]) -> str:
    """'3 nodes in layers 0-2', '1 node', ..."""
    where = layers_text(nodes)
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}{f' {where}' if where else ''}"


def _group(items: list[Placement]) -> dict[tuple[str, str], list[Placement]]:
    """(op key, reason) -> placements, in graph order: one finding per op kind and reason."""
    groups: dict[tuple[str, str], list[Placement]] = defaultdict(list)
    for p in sorted(items, key=lambda p: p.node.index):
        groups[(p.node.key, p.result.reason)].append(p)
    return groups


def gpu_targets(ctx: RuleContext) -> dict[str, list[str]]:
    """Non-CPU providers the deployment declares -> the labels of the setups that declare them."""
    targets: dict[str, list[str]] = defaultdict(list)
    for setup in ctx.deployment.setups:
        if setup.provider_name and setup.provider_name != CPU:
            targets[setup.provider_name].append(setup.label)
    return dict(targets)


def _declared_by(labels: list[str]) -> str:
    return " and ".join(labels)


def _target(labels: list[str], provider: str) -> str:
    return f"{_declared_by(labels)} target{'s' if len(labels) == 1 else ''} {provider}"


# ---- op-not-on-ep, index-op-not-on-ep -------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuGroup:
    """Nodes of one op kind, for one reason, that a GPU target has no kernel for: ORT runs them on CPU."""

    provider: str
    labels: tuple[str, ...]  # the setups that target the provider
    key: str  # the op key
    reason: str
    nodes: list[Node]
    computes: bool  # a float tensor goes into one of them


def cpu_groups(ctx: RuleContext, graph: Graph) -> list[CpuGroup]:
    """Per GPU target with a kernel table, the nodes it has no kernel for, one group per op kind and reason."""
    table = kernel_table()
    out = []
    for provider, labels in sorted(gpu_targets(ctx).items()):
        if not table.has_provider(provider):
            continue
        for (key, reason), group in _group(cpu_bound(graph, provider)).items():
            out.append(CpuGroup(provider, tuple(labels), key, reason, [p.node for p in group],
                                any(p.computes for p in group)))
    return out


def _cpu_group_finding(ctx: RuleContext, graph: Graph, group: CpuGroup):
    """The one message of op-not-on-ep and index-op-not-on-ep."""
    table = kernel_table()
    nodes = group.nodes
    node = nodes[0]
    dtypes = [graph.dtype(i) if i else None for i in node.inputs]
    cast = set(cpu_fallback_facts().cast_to_float)  # ORT runs these on CPU's float kernel between Casts
    on_cpu = table.supports(CPU, node.domain, node.op_type, graph.opsets.get(node.domain),
                            ["float" if d in cast else d for d in dtypes])
    if on_cpu.status is Support.NO:
        # The fallback has no kernel either: no provider runs the node, and ORT refuses the session outright.
        return ctx.finding(
            f"{group.reason}, and {CPU}, where ORT would put it instead, has none either ({on_cpu.reason}): "
            f"{_count(nodes)} no provider runs, so ORT refuses to create the session (the "
            f"{_target(list(group.labels), group.provider)})",
            node=node, graph=graph, related=nodes[1:], fix=_nowhere_fix(graph, node),
            properties={"provider": group.provider, "op": group.key, "nodes": len(nodes),
                        "kernel_table": table.ort_version, "cpu_kernel": False, SESSION_FAILS: True},
        )
    capture = _capture_providers(ctx).get(group.provider) if group.computes else None
    refused = (f"; {cuda_graph_option(capture[0])} is on, so ORT refuses to create the session (capture needs every "
               f"compute node on {group.provider})" if capture else "")
    return ctx.finding(
        f"{group.reason}: {_count(nodes)} run on {CPU} instead, with Memcpy to and from the GPU around them (the "
        f"{_target(list(group.labels), group.provider)}){refused}",
        node=nodes[0], graph=graph, related=nodes[1:],
        fix=_placement_fix(table, group.provider, nodes[0]),
        properties={"provider": group.provider, "op": group.key, "nodes": len(nodes),
                    "kernel_table": table.ort_version, **({SESSION_FAILS: True} if capture else {})},
    )


@rule("OGK001", "op-not-on-ep", Severity.ERROR, needs=("provider",))
def op_not_on_ep(ctx: RuleContext):
    """A compute node has no kernel on the deployment's GPU provider: ORT runs it on CPU, with copies around it.

    ## What it checks
    Every node of the graph ORT will run (the optimized dump when given, else the model) that takes a float
    tensor, by (domain, op_type, opset, input dtypes) against the kernel table of the provider the policy or
    genai_config.json names. Input dtypes are propagated through the graph. Classic catches: a float32
    GroupQueryAttention or float32 QMoE under CUDA (their CUDA kernels take float16/bfloat16 only). One finding per
    op kind, naming the layers; with CUDA graph capture on it also says that ORT refuses the session, and the
    Memcpy nodes around these nodes are this finding's, not memcpy-in-graph's. Integer-only (index/shape) nodes
    are index-op-not-on-ep's. An op the table does not list at all (newer than the table), and a provider without
    a table (TensorRT, CANN, ...), are reported as undecided, naming the ORT version the table reflects.

    ## Why it costs throughput
    ORT silently assigns such a node to the CPU provider and inserts MemcpyToHost / MemcpyFromHost around it: at
    every token the activations cross PCIe, the GPU waits for the CPU kernel, and CUDA graph capture becomes
    impossible. A single fp32 attention node per layer can cost more than the whole GPU step.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float[1, T, 128] qkv, float[1, 2, P, 16] past_k, float[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float[1, T, 64] o, float[1, 2, S, 16] present_k, float[1, 2, S, 16] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Fix
    Export in a dtype the provider's kernel accepts (onnxruntime-genai builder: `-p fp16 -e cuda`, or int4 with
    a float16 activation dtype); for an op the provider lacks entirely, export it as ops the provider has.
    Set `session.disable_cpu_ep_fallback: "1"` so that a regression fails session creation instead of running slow.
    """
    table = kernel_table()
    graph = ctx.executed
    for provider, labels in sorted(gpu_targets(ctx).items()):
        if not table.has_provider(provider):
            yield ctx.undecided(
                f"no kernel table for {provider} (declared by the {_declared_by(labels)}; the table of "
                f"{table.ort_version} covers {', '.join(table.providers())}): node placement not checked",
                graph=graph,
            )
            continue
        unknown = [p for p in placements(graph, provider) if p.result.status in (Support.UNKNOWN_OP, Support.UNKNOWN_TYPE)]
        for (key, reason), group in _group(unknown).items():
            nodes = [p.node for p in group]
            what = (f"{key} is not in the kernel table ({table.ort_version}), so ortgate cannot tell whether "
                    f"{provider} has a kernel for it" if group[0].result.status is Support.UNKNOWN_OP else
                    f"whether {provider} runs {key}: {reason}")
            yield ctx.undecided(f"{what} ({_count(nodes)}); `ortgate run` (profiling) shows each node's provider",
                                graph=graph, node=nodes[0],
                                properties={"provider": provider, "op": key, "nodes": len(nodes),
                                            "status": group[0].result.status.value, "kernel_table": table.ort_version})
    for cpu_group in cpu_groups(ctx, graph):
        if cpu_group.computes:
            yield _cpu_group_finding(ctx, graph, cpu_group)


@rule("OGK004", "index-op-not-on-ep", Severity.WARNING, needs=("provider",))
def index_op_not_on_ep(ctx: RuleContext):
    """An integer-only node (index or shape arithmetic) has no kernel on the deployment's GPU provider.

    ## What it checks
    Every node of the graph ORT will run whose inputs are all integer (or bool) tensors, by (domain, op_type,
    opset, input dtypes) against the kernel table of the provider the policy or genai_config.json names: what
    op-not-on-ep checks for compute nodes. One finding per op kind, naming the layers.

    ## Why it costs throughput
    ORT runs the node on CPU with a copy of its small integer inputs and outputs on each side: a stream
    synchronisation per copy at every token. GPU providers keep some shape arithmetic on CPU on purpose, and CUDA
    graph capture tolerates it, so this is a warning, not an error; pinning the step dims (free-dimension
    overrides) often folds such nodes away.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 18]>
    tokens (int64[batch_size, sequence_length] input_ids) => (int64 count)
    {
      shape = Shape(input_ids)
      count = ReduceProd<keepdims = 0>(shape)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 18]>
    tokens (float[batch_size, sequence_length] mask) => (float count)
    {
      count = ReduceSum<keepdims = 0>(mask)
    }
    ```

    ## Fix
    Pin the dims the arithmetic depends on (session.free_dimension_overrides) so ORT folds it at session creation,
    or compute it in a dtype the provider has a kernel for.
    """
    graph = ctx.executed
    for group in cpu_groups(ctx, graph):
        if not group.computes:
            yield _cpu_group_finding(ctx, graph, group)


def _nowhere_fix(graph: Graph, node: Node) -> str:
    """What to do about a node no provider has a kernel for, in the terms of the exporter that wrote it."""
    return torch_export_advice(graph, node) or (
        "Export the model in a dtype some provider's kernel accepts, or export the op as ops that have kernels.")


def _placement_fix(table, provider: str, node: Node) -> str:
    if table.op(provider, node.domain, node.op_type) is None:
        return (f"{provider} has no {node.key} kernel at any dtype: export it as ops {provider} has kernels for, "
                "or accept the CPU round trip with a waiver.")
    return ("Export the model in a dtype the kernel accepts (e.g. float16: `-p fp16` with the onnxruntime-genai "
            "builder).")


# ---- cuda-graph-blocker --------------------------------------------------------------------------------------


def value_dependent(graph: Graph, value: str) -> bool:
    """True if `value` depends on the VALUES of runtime tensors, not only on input shapes and constants.

    Shape/Size outputs count as shape-only (a data-dependent shape upstream is reported where it arises).
    """
    return _value_dependent(graph, value, cached(graph, "placement.value_dependent", _new_memo))


def _new_memo(graph: Graph) -> dict[str, bool]:
    return {}


def _value_dependent(graph: Graph, value: str, memo: dict[str, bool]) -> bool:
    found = memo.get(value)
    if found is not None:
        return found
    stack, on_stack = [value], {value}
    while stack:
        current = stack[-1]
        if current in memo:
            stack.pop()
            on_stack.discard(current)
            continue
        node = graph.producer(current)
        if not current or graph.is_constant(current):
            memo[current] = False
        elif node is None:
            memo[current] = True  # a graph input (or a value from outside the model): runtime data
        elif node.domain == DEFAULT_DOMAIN and node.op_type in ("Shape", "Size"):
            memo[current] = False
        else:
            pending = [i for i in node.inputs if i and i not in memo and i not in on_stack]
            if pending:
                stack.extend(pending)
                on_stack.update(pending)
                continue
            memo[current] = any(memo.get(i, False) for i in node.inputs if i)
        stack.pop()
        on_stack.discard(current)
    return memo[value]


def data_dependent_shape_nodes(graph: Graph) -> list[tuple[Node, list[str]]]:
    """Nodes whose output shape follows runtime tensor values, with the inputs that carry those values."""
    ops = cuda_graph_capture_facts().data_dependent_shape_ops.ops
    memo: dict[str, bool] = cached(graph, "placement.value_dependent", _new_memo)
    out = []
    for node in graph.by_op_type(*ops):
        positions = data_dependent_shape_inputs(node.domain, node.op_type) or ()
        inputs = node.inputs
        driving = [inputs[i] for i in positions
                   if i < len(inputs) and inputs[i] and _value_dependent(graph, inputs[i], memo)]
        if driving:
            out.append((node, driving))
    return out


def _capture_providers(ctx: RuleContext) -> dict[str, list]:
    """Providers that capture a CUDA graph in this deployment -> the setups that turn it on."""
    out: dict[str, list] = defaultdict(list)
    for setup in ctx.deployment.setups:
        if cuda_graph_enabled(setup) and setup.provider_name is not None:
            out[setup.provider_name].append(setup)
    return dict(out)


@rule("OGK002", "cuda-graph-blocker", Severity.ERROR, needs=("provider",))
def cuda_graph_blocker(ctx: RuleContext):
    """CUDA graph capture is on, but the graph holds something that makes capture fail or impossible.

    ## What it checks
    With `enable_cuda_graph` (CUDA) or `trt_cuda_graph_enable` (TensorRT) on in the policy or genai_config.json:
    - control-flow nodes (If, Loop, Scan): session creation fails;
    - Memcpy nodes in the optimized dump that no missing kernel explains: session creation fails ("all compute
      graph nodes have not been partitioned to the CUDA EP");
    - TensorRT: every node must run on TensorRT. TensorRT's parser takes ai.onnx ops, not com.microsoft contrib
      ops: MoE, QMoE and GroupQueryAttention go to the CUDA provider, so a TensorRT CUDA graph is impossible
      for these models;
    - data-dependent output shapes: NonZero, Unique, Compress, NonMaxSuppression, and TopK / Range / Expand /
      Reshape / ConstantOfShape / Slice / Tile / OneHot / Pad / Resize whose size inputs depend on tensor
      values rather than on shapes and constants. Their kernels read the value on the host in the middle of
      the step and their output size can change between tokens; a captured graph replays the sizes of the
      capture.
    Compute nodes without a CUDA kernel, and the copies around them, are op-not-on-ep's finding, which says that
    capture refuses the session.

    ## Why it costs throughput
    CUDA graph removes the per-kernel launch overhead that dominates small-batch decode. When capture cannot
    happen the session either fails to start (and gets rolled back to a config without CUDA graph) or, for
    data-dependent shapes, replays stale sizes.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    step (float16[1, 64] h, bool is_prompt) => (float16[1, 64] y)
    {
      y = If(is_prompt) <
        then_branch = prompt () => (float16[1, 64] a) { a = Identity(h) },
        else_branch = decode () => (float16[1, 64] b) { b = Neg(h) }
      >
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    step (float16[1, 64] h) => (float16[1, 64] y)
    {
      y = Neg(h)
    }
    ```

    ## Fix
    Export the decode graph without control flow (separate prompt and decode models, or genai's builder);
    export in float16/bfloat16 so every compute node has a CUDA kernel; use the fused MoE op instead of a
    NonZero/gather expert loop. For TensorRT, capture with the CUDA provider instead (`enable_cuda_graph`).
    """
    for provider, setups in sorted(_capture_providers(ctx).items()):
        on = f"{cuda_graph_option(setups[0])} is on in the {_declared_by([s.label for s in setups])}"
        for blocker in capture_blockers(ctx, provider):
            yield ctx.finding(
                f"{on}, but {blocker.what}: {blocker.consequence}",
                node=blocker.nodes[0], graph=blocker.graph, related=blocker.nodes[1:], fix=blocker.fix,
                properties={"provider": provider, "blocker": blocker.kind, **blocker.properties},
            )


@dataclass(frozen=True)
class CaptureBlocker:
    """Something in the graph that makes CUDA graph capture fail or impossible."""

    kind: str  # control_flow | not_on_tensorrt | memcpy | data_dependent_shape
    what: str
    consequence: str
    nodes: list[Node]
    graph: Graph
    fix: str
    properties: dict = field(default_factory=dict)


def capture_blockers(ctx: RuleContext, provider: str) -> list[CaptureBlocker]:
    graph = ctx.executed
    out = [CaptureBlocker("control_flow", f"the graph has a control-flow node ({node.op_type})",
                          "ORT refuses to create the session (control flow cannot be captured)", [node], graph,
                          "Export the decode step without control flow (e.g. separate prompt and decode graphs).")
           for node in graph.by_op_type(*cuda_graph_capture_facts().control_flow_ops)
           if node.graph is None]  # nested control flow sits inside a main-graph one, which is reported
    if provider == TENSORRT:
        out += _tensorrt_blockers(graph)
    if ctx.optimized is not None:
        copies = unexplained_copies(ctx, ctx.optimized)
        if copies:
            out.append(CaptureBlocker(
                "memcpy", f"the optimized graph has {len(copies)} Memcpy node(s) ({_memcpy_summary(copies)})",
                "ORT refuses to create a CUDA-graph session with copies between devices", copies, ctx.optimized,
                "Make the nodes the copies serve run on the GPU (the finding's related nodes), then dump again.",
                {"nodes": len(copies)}))
    for key, group in _group_by_op(data_dependent_shape_nodes(graph)).items():
        nodes = [n for n, _ in group]
        driving = sorted({v for _, vs in group for v in vs})
        out.append(CaptureBlocker(
            "data_dependent_shape", f"{key} ({_count(nodes)}) has an output shape that depends on tensor values "
            f"({', '.join(driving[:4])}{', ...' if len(driving) > 4 else ''})",
            "its kernel reads them on the host during the step and a captured graph replays the sizes of the capture",
            nodes, graph, "Replace the data-dependent construct (e.g. a NonZero/gather expert loop by "
            "com.microsoft.MoE), or compute the size from shapes and constants only.", {"op": key, "nodes": len(nodes)}))
    return out


def _group_by_op(items: list[tuple[Node, list[str]]]) -> dict[str, list[tuple[Node, list[str]]]]:
    groups: dict[str, list[tuple[Node, list[str]]]] = defaultdict(list)
    for node, values in items:
        groups[node.key].append((node, values))
    return groups


def _tensorrt_blockers(graph: Graph) -> list[CaptureBlocker]:
    by_key: dict[str, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        if node.graph is None and tensorrt_untaken_domain(node.domain):
            by_key[node.key].append(node)
    return [CaptureBlocker(
        "not_on_tensorrt", f"TensorRT does not take {key} ({_count(nodes)})",
        f"{tensorrt_untaken_domain(nodes[0].domain)}; a TensorRT CUDA graph needs every node on TensorRT, so session "
        "creation fails", nodes, graph,
        f'Capture with the CUDA provider instead ({CUDA}, enable_cuda_graph: "1").',
        {"op": key, "nodes": len(nodes)}) for key, nodes in sorted(by_key.items(), key=lambda kv: kv[1][0].index)]


def _memcpy_summary(copies: list[Node]) -> str:
    counts = Counter(n.op_type for n in copies)
    return ", ".join(f"{op} x{counts[op]}" for op in MEMCPY_OPS if counts[op])


# ---- memcpy-in-graph -----------------------------------------------------------------------------------------


def _cpu_side(graph: Graph, copy: Node) -> list[Node]:
    """The nodes on the CPU side of a copy: consumers of MemcpyToHost, the producer of MemcpyFromHost's input."""
    if copy.op_type == "MemcpyToHost":
        return [c for o in copy.outputs if o for c in graph.consumers(o)]
    producer = graph.producer(copy.input(0))
    return [producer] if producer is not None else []


def unexplained_copies(ctx: RuleContext, graph: Graph) -> list[Node]:
    """Memcpy nodes of `graph` that a missing kernel does not explain: some node they serve is not one op-not-on-ep
    or index-op-not-on-ep reports (those findings own the copies around their nodes)."""
    copies = graph.by_op_type(*MEMCPY_OPS)
    if not copies:
        return []
    explained = {n.index for group in cpu_groups(ctx, graph) for n in group.nodes}
    out = []
    for copy in copies:
        served = [n for n in _cpu_side(graph, copy) if n.op_type not in MEMCPY_OPS]
        if not served or any(n.index not in explained for n in served):
            out.append(copy)
    return out


def _copies_without_capture(ctx: RuleContext) -> list[tuple[Graph, list[Node]]]:
    """(graph, its unexplained copies) for each graph, unless CUDA graph capture is on (then the copies are
    cuda-graph-blocker's: capture refuses the session)."""
    if _capture_providers(ctx):
        return []
    out = []
    for graph in ctx.inputs.graphs:
        copies = unexplained_copies(ctx, graph)
        if copies:
            out.append((graph, copies))
    return out


def _memcpy_finding(ctx: RuleContext, graph: Graph, copies: list[Node], floats: list[Node]):
    """The one message of memcpy-in-graph and index-memcpy-in-graph."""
    served: list[Node] = []
    for copy in copies:
        served.extend(n for n in _cpu_side(graph, copy) if n.op_type not in MEMCPY_OPS and n not in served)
    kinds = Counter(n.key for n in served)
    around = ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])) or "unknown nodes"
    where = layers_text(served)
    what = "float tensors" if floats else "integer tensors only"
    return ctx.finding(
        f"{len(copies)} Memcpy node(s) ({_memcpy_summary(copies)}) move {what} between GPU and CPU around "
        f"{around}{f' {where}' if where else ''}: those nodes run on CPU at every run",
        node=copies[0], graph=graph, related=list(copies[1:]) + served,
        layer=served[0].layer if served else None,
        fix="Give the CPU-side nodes a dtype and op the GPU provider has kernels for, then dump the optimized graph "
            "again to confirm the copies are gone.",
        properties={"copies": len(copies), "float_copies": len(floats), "cpu_nodes": sorted(kinds)},
    )


def _float_copies(graph: Graph, copies: list[Node]) -> list[Node]:
    return [c for c in copies if graph.dtype(c.input(0)) in _FLOAT_DTYPES]


@rule("OGK003", "memcpy-in-graph", Severity.ERROR)
def memcpy_in_graph(ctx: RuleContext):
    """The optimized graph holds MemcpyToHost / MemcpyFromHost nodes that move float tensors between GPU and CPU.

    ## What it checks
    The ORT optimized dump (`--optimized`, written with `optimized_model_filepath` by a session on the target
    provider) for MemcpyToHost and MemcpyFromHost nodes, naming the CPU-side nodes they serve, when at least one
    copies a float tensor. Copies around a node op-not-on-ep or index-op-not-on-ep already reports are that
    finding's; with CUDA graph capture on, the copies are cuda-graph-blocker's; copies of integer tensors only are
    index-memcpy-in-graph's.

    ## Why it costs throughput
    ORT inserts a Memcpy wherever a tensor moves between a GPU node and a CPU node. Each copy synchronizes the
    stream, the CPU node runs at CPU speed, and CUDA graph capture is refused while any Memcpy exists. In a
    decode loop this repeats at every token.

    ## Bad
    ```onnx optimized
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float[1, T, 128] qkv, float[1, 2, P, 16] past_k, float[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float[1, T, 64] o, float[1, 2, S, 16] present_k, float[1, 2, S, 16] present_v)
    {
      qkv_host = MemcpyToHost(qkv)
      o_host, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv_host, , , past_k, past_v, seqlens_k, total_len)
      o = MemcpyFromHost(o_host)
    }
    ```

    ## Good
    ```onnx optimized
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Fix
    Make the CPU-side nodes run on the GPU (usually a dtype the CUDA kernel lacks), then dump the optimized graph
    again to confirm the copies are gone.
    """
    for graph, copies in _copies_without_capture(ctx):
        floats = _float_copies(graph, copies)
        if floats:
            yield _memcpy_finding(ctx, graph, copies, floats)


@rule("OGK005", "index-memcpy-in-graph", Severity.WARNING)
def index_memcpy_in_graph(ctx: RuleContext):
    """The optimized graph holds Memcpy nodes that move integer tensors only (lengths, indices) between GPU and CPU.

    ## What it checks
    What memcpy-in-graph checks, when every unexplained copy carries an integer (or bool) tensor: sequence
    lengths, positions, token ids or shape values that a CPU node reads or produces.

    ## Why it costs throughput
    The tensors are small, but each copy still synchronises the stream at every token, and the CPU node behind it
    runs between GPU kernels. With CUDA graph capture on the copies make capture fail (cuda-graph-blocker).

    ## Bad
    ```onnx optimized
    <ir_version: 10, opset_import: ["" : 21]>
    lengths (int64[1, S] attention_mask) => (int64[1] total)
    <int64[1] axes = {1}>
    {
      mask_host = MemcpyToHost(attention_mask)
      total_host = ReduceSum<keepdims = 0>(mask_host, axes)
      total = MemcpyFromHost(total_host)
    }
    ```

    ## Good
    ```onnx optimized
    <ir_version: 10, opset_import: ["" : 21]>
    lengths (int64[1, S] attention_mask) => (int64[1] total)
    <int64[1] axes = {1}>
    {
      total = ReduceSum<keepdims = 0>(attention_mask, axes)
    }
    ```

    ## Fix
    Pin the step dims (session.free_dimension_overrides) so shape arithmetic folds away, or compute the value in a
    dtype the GPU provider has a kernel for; dump again to confirm.
    """
    for graph, copies in _copies_without_capture(ctx):
        if not _float_copies(graph, copies):
            yield _memcpy_finding(ctx, graph, copies, [])


# ---- ORT's CPU MoE kernel computing a node wrongly --------------------------------------------------------------


def target_ort_release(ctx: RuleContext) -> tuple[str, str]:
    """The ORT release the deployment runs (the one resolution, config.deployment.OrtRelease: --ort-version, the
    policy's execution_provider.onnxruntime_version, else the release ortgate assumes in every install) and where
    that comes from, as a finding says it."""
    ort = ctx.deployment.ort
    return ort.judged_as, ort.origin


@rule("OGK006", "moe-cpu-kernel-miscomputes", Severity.ERROR, needs=("provider", "moe"))
def moe_cpu_kernel_miscomputes(ctx: RuleContext):
    """A com.microsoft.MoE node that ORT's CPU kernel computes wrongly on the deployment's ORT release.

    ## What it checks
    On a CPU deployment (the policy's or genai_config.json's provider is CPUExecutionProvider), every
    com.microsoft.MoE node in the position where ORT's planner may give its output its input's buffer: its input
    is computed by a node (not a graph input or initializer), no node after it reads that input again, and its output
    is not a graph output; with normalize_routing_weights=0 (ORT's default). On the releases recorded in
    ortgate/knowledge/ort_moe.json (`cpu_inplace_defect`: seen on 1.28.0, 1.30.0 and 1.31.1, right from 1.32.0) the
    CPU kernel zeroes its output before it reads its input, so it computes such a node from zeros. The release is the
    policy's `execution_provider.onnxruntime_version` (or `--ort-version`), else the release ortgate assumes in every
    install (knowledge/ort_releases.json: 1.31.1), which the finding names; for a release older than any tried, the
    rule says it did not check. The kernel may only take the buffer
    when ORT sees input and output of the same size (static or the same named dims); the rule does not see shapes as
    ORT's planner does and reports every node in that position. One finding per decoder layer.

    ## Why it costs throughput
    It does not: it costs correctness. The session runs at full speed and returns wrong hidden states (72% max
    relative error on one node; the logits of a tiny Qwen2-MoE differed by more than their own scale) without an
    error. Any measurement of such a session measures a model that computes something else.

    ## Bad
    ```yaml
    execution_provider: {name: CPUExecutionProvider, onnxruntime_version: "1.31.1"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float[T, 8] h, float[T, 8] residual) => (float[T, 8] y)
    <float[8, 4] router_w, float[4, 32, 8] fc1, float[4, 8, 16] fc2, float[8] norm_w>
    {
      x = Mul(h, norm_w)
      logits = MatMul(x, router_w)
      moe = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 0>(
          x, logits, fc1, , fc2)
      y = Add(moe, residual)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CPUExecutionProvider, onnxruntime_version: "1.31.1"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float[T, 8] h, float[T, 8] residual) => (float[T, 8] y)
    <float[8, 4] router_w, float[4, 32, 8] fc1, float[4, 8, 16] fc2, float[8] norm_w, bool keep = {1}>
    {
      x = Mul(h, norm_w)
      logits = MatMul(x, router_w)
      moe = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 0>(
          x, logits, fc1, , fc2)
      kept = Where(keep, moe, x)
      y = Add(kept, residual)
    }
    ```

    ## Fix
    Deploy onnxruntime 1.32.0 or later, or keep the MoE input alive past the node: `ortgate fix` writes
    `Where(true, moe_output, moe_input)` after each such node it writes (bit-exact, one elementwise pass; proven on
    1.31.1 at every optimization level). A model whose routing renormalises the top-k (normalize_routing_weights=1)
    is not affected.
    """
    from ortgate.graph.patterns.moe_inplace import inplace_candidates
    from ortgate.knowledge.moe_op import moe_op_facts

    if ctx.deployment.provider != CPU:
        return
    defect = moe_op_facts().inplace_defect
    graph = ctx.model
    hit = [c for c in inplace_candidates(graph) if defect.triggered_by(c.normalize_routing_weights)]
    if not hit:
        return
    release, source = target_ort_release(ctx)
    status = defect.status(release)
    if status == "fixed":
        return
    if status == "unknown":
        why = f"onnxruntime {release} ({source}) is older than any release tried"
        yield ctx.undecided(f"{why}, so the release was not checked: ORT's CPU MoE kernel computes {len(hit)} node(s) here wrongly on "
                            f"{', '.join(defect.releases_seen_affected)} (right from {defect.first_seen_fixed})",
                            graph=graph, node=hit[0].node)
        return
    seen = "seen affected" if status == "affected" else "between releases seen affected, not tried"
    for (_, layer), group in by_layer(hit, lambda c: c.node, lambda c: c.node.layer):  # one finding per layer
        nodes = [c.node for c in group]
        what = "com.microsoft.MoE node" if len(nodes) == 1 else f"{len(nodes)} com.microsoft.MoE nodes"
        reads = "reads" if len(nodes) == 1 else "read"
        yield ctx.finding(
            f"{what} {layer_text(layer)} {reads} an intermediate tensor no later node reads "
            f"({group[0].input!r}) with normalize_routing_weights=0: ORT's CPU kernel on onnxruntime {release} "
            f"({source}; {seen}) may give the output the input's buffer and zeroes it before reading it, so "
            f"{'it computes a wrong output' if len(nodes) == 1 else 'they compute wrong outputs'}; right from "
            f"onnxruntime {defect.first_seen_fixed}",
            node=nodes[0], graph=graph, layer=layer, related=nodes[1:],
            fix=f"Deploy onnxruntime >= {defect.first_seen_fixed}, or keep each MoE input alive past its node "
                f"({defect.workaround.form}; `ortgate fix` writes it)",
            properties={"release": release, "status": status, "nodes": len(nodes)},
        )
