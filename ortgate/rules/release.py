"""Will the session load on the deployment's ONNX Runtime release and provider: com.microsoft ops, inputs and
attributes the release does not define (knowledge/op_schemas.json, read from each release's wheel), and node forms
the provider refuses (knowledge/ort_cpu_limits.json, re-proved on the installed release by
tests/test_ort_release_claims.py). The release is the deployment's (config.deployment.OrtRelease): `--ort-version`,
the policy's `execution_provider.onnxruntime_version`, else the release ortgate assumes in every install."""

from __future__ import annotations

from ortgate.findings import Severity
from ortgate.graph.index import MS_DOMAIN, Graph, Node
from ortgate.knowledge.op_schemas import (
    attribute_defined,
    cpu_refusals,
    first_release,
    has_cpu_kernel,
    input_count,
    op_defined,
    op_history,
)
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, layers_text

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
# GroupQueryAttention input 16 (query_seqlens, 1.32.0): "honored by the CPU and CUDA execution providers; other EPs
# must reject the node" (the 1.32.0 schema's description).
QUERY_SEQLENS = 16
QUERY_SEQLENS_PROVIDERS = (CPU, CUDA)


def _ms_nodes(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.domain == MS_DOMAIN]


def release_text(ctx: RuleContext) -> str:
    """'onnxruntime 1.31.1 (the policy's execution_provider.onnxruntime_version)' for a finding."""
    ort = ctx.deployment.ort
    return f"onnxruntime {ort.version} ({ort.origin})"


def _where(nodes: list[Node]) -> str:
    text = layers_text(nodes)
    count = f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}"
    return f"{count} {text}" if text else count


@rule("OGX010", "op-unknown-to-release", Severity.ERROR)
def op_unknown_to_release(ctx: RuleContext):
    """A com.microsoft op, attribute or input the deployment's ONNX Runtime release does not define: the session
    fails to load.

    ## What it checks
    Every com.microsoft node of the model against the schemas the deployment's release registers
    (knowledge/op_schemas.json, read from each onnxruntime wheel from 1.20.0 to 1.32.0 by
    scripts/gen_op_contracts.py --releases): an op the release does not define (MoEGroupRouter, SwiGLU, MoEPacked
    ... before 1.32.0), an attribute it does not define (MoE `swiglu_limit_after_activation` before 1.32.0, QMoE
    `block_size` before 1.23.2), an input beyond its inputs (GroupQueryAttention `query_seqlens`, input 16, before
    1.32.0). The release is the policy's `execution_provider.onnxruntime_version` (or `--ort-version`), else
    the release ortgate assumes (1.31.1), which the finding names. Ops no covered release defines are
    op-contract-unknown's.

    ## Why it costs throughput
    The deployment does not start: ORT refuses the model at session creation ("is not a registered
    function/op", "Unrecognized attribute", "has input size ... not in range"). A model written by a newer
    exporter or builder than the runtime it ships with passes every test on the developer's machine and fails in
    production.

    ## Bad
    ```yaml
    execution_provider: {name: CPUExecutionProvider, onnxruntime_version: "1.31.1"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    router (float[T, 8] logits, float[8] bias) => (float[T, 8] probs)
    {
      probs = com.microsoft.MoEGroupRouter<top_k = 2, n_group = 2, topk_group = 1>(logits, bias)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CPUExecutionProvider, onnxruntime_version: "1.32.0"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    router (float[T, 8] logits, float[8] bias) => (float[T, 8] probs)
    {
      probs = com.microsoft.MoEGroupRouter<top_k = 2, n_group = 2, topk_group = 1>(logits, bias)
    }
    ```

    ## Fix
    Deploy the release the finding names (and pin it in execution_provider.onnxruntime_version), or re-export
    for the release you deploy (an older builder or exporter release, or without the new attribute or input).
    """
    ort = ctx.deployment.ort
    version = ort.judged_as
    graph = ctx.model
    groups: dict[tuple[str, str], list[Node]] = {}
    for node in _ms_nodes(graph):
        history = op_history(node.op_type)
        if history is None:
            continue  # no covered release defines it: op-contract-unknown's
        if not op_defined(node.op_type, version):
            groups.setdefault((node.op_type, ""), []).append(node)
            continue
        for name in node.attributes:
            if not attribute_defined(node.op_type, name, version):
                groups.setdefault((node.op_type, f"attribute:{name}"), []).append(node)
        last = max((i for i, name in enumerate(node.inputs) if name), default=-1)
        if last >= input_count(node.op_type, version):
            groups.setdefault((node.op_type, f"input:{last}"), []).append(node)
    for (op, what), nodes in groups.items():
        history = op_history(op)
        assert history is not None
        if not what:
            first = first_release(history.releases)
            thing, error = f"com.microsoft.{op}", "is not a registered function/op"
        elif what.startswith("attribute:"):
            name = what.split(":", 1)[1]
            first = first_release(history.attributes.get(name, ()))
            thing, error = f"attribute {name!r} of com.microsoft.{op}", f"Unrecognized attribute: {name}"
        else:
            position = int(what.split(":", 1)[1])
            formal = next((n for n, f in history.inputs.items() if f.position == position), None)
            first = first_release(history.inputs[formal].releases) if formal else None
            thing = f"input {position}{f' ({formal})' if formal else ''} of com.microsoft.{op}"
            error = "has input size ... not in range"
        since = f"defined from onnxruntime {first}" if first else "defined by no covered release"
        yield ctx.finding(
            f"{_where(nodes)}: {thing} is not defined in {release_text(ctx)}, so the session fails to load "
            f"('{error}'); {since}",
            node=nodes[0], graph=graph, related=nodes[1:],
            fix=(f"Deploy onnxruntime {first} or later and pin it in execution_provider.onnxruntime_version, or "
                 "re-export for the release you deploy." if first else "Re-export for the release you deploy."),
            properties={"op": op, "what": what or "op", "release": ort.version, "defined_from": first,
                        "nodes": len(nodes)},
        )


@rule("OGX011", "provider-refuses-node", Severity.ERROR, needs=("provider",))
def provider_refuses_node(ctx: RuleContext):
    """A node the deployment's provider refuses on its release: the session fails to load, or fails at its first
    run.

    ## What it checks
    On the provider the policy or genai_config.json names, for the deployment's release (the policy's
    `execution_provider.onnxruntime_version`, `--ort-version`, else the release ortgate assumes):
    - CPU: the forms ORT's CPU MoE kernel refuses (knowledge/ort_cpu_limits.json, each seen on every CPU wheel from
      1.23.2 to 1.32.0 and re-proved on the installed release by a one-node model): `swiglu_fusion=2`,
      `activation_type` geglu or relu2 (CUDA only) and, on 1.32.0, `swiglu_limit_after_activation=1` refuse the
      session at creation; separate `fc3_experts_weights` load and fail at the first run ("FC3 is not implemented
      for CPU MoE"). A com.microsoft op the release defines without a CPU kernel (SwiGLU, MoEPacked, RMSNormRotary,
      MatMulPacked ... in 1.32.0; MoE before 1.23.2) cannot be placed at all.
    - Any provider but CPU and CUDA: a GroupQueryAttention with `query_seqlens` (input 16), which "other EPs
      must reject" (the 1.32.0 schema).

    ## Why it costs throughput
    The deployment does not start, or starts and fails on its first request. A Gemma-4 MoE built by
    onnxruntime-genai 0.18 (geglu experts) cannot load on ORT's CPU provider at all.

    ## Bad
    ```yaml
    execution_provider: {name: CPUExecutionProvider, onnxruntime_version: "1.31.1"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float[T, 8] x, float[T, 4] logits) => (float[T, 8] y)
    <float[4, 16, 8] fc1, float[4, 8, 8] fc2>
    {
      y = com.microsoft.MoE<k = 2, activation_type = "geglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CPUExecutionProvider, onnxruntime_version: "1.31.1"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float[T, 8] x, float[T, 4] logits) => (float[T, 8] y)
    <float[4, 16, 8] fc1, float[4, 8, 8] fc2>
    {
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
    }
    ```

    ## Fix
    Deploy on a provider that runs the form (CUDA for geglu, relu2, non-interleaved SwiGLU and post-activation
    clipping), or export the form the provider runs: gate and up interleaved in fc1 (`swiglu_fusion=1`, no fc3),
    a SiLU-gated or GELU expert the CPU kernel knows.
    """
    ort = ctx.deployment.ort
    version = ort.judged_as
    provider = ctx.deployment.provider
    graph = ctx.model
    nodes = _ms_nodes(graph)
    if provider == CPU:
        for refusal in cpu_refusals():
            if not refusal.applies(version):
                continue
            hit = [n for n in nodes if n.op_type == refusal.op_type and _refused(n, refusal)]
            if not hit:
                continue
            form = (f"{refusal.attribute}={hit[0].attributes.get(refusal.attribute)}" if refusal.attribute
                    else f"a {refusal.input} input")
            yield ctx.finding(
                f"{_where(hit)}: com.microsoft.{refusal.op_type} with {form} is refused by ORT's CPU kernel on "
                f"{release_text(ctx)}: the session fails at {refusal.stage} ('{refusal.message}')",
                node=hit[0], graph=graph, related=hit[1:],
                fix="Run it on CUDA, or export the form the CPU kernel runs (fc1 with gate and up interleaved, "
                    "swiglu_fusion=1, no fc3).",
                properties={"refusal": refusal.key, "stage": refusal.stage, "release": ort.version,
                            "source": refusal.source, "nodes": len(hit)},
            )
        missing: dict[str, list[Node]] = {}
        for node in nodes:
            if op_defined(node.op_type, version) and not has_cpu_kernel(node.op_type, version):
                missing.setdefault(node.op_type, []).append(node)
        for op, hit in missing.items():
            yield ctx.finding(
                f"{_where(hit)}: com.microsoft.{op} has no CPU kernel in {release_text(ctx)}, so the CPU session "
                "fails to load ('Could not find an implementation')",
                node=hit[0], graph=graph, related=hit[1:],
                fix=f"Deploy on a provider with a {op} kernel, or export it as ops the CPU provider has.",
                properties={"op": op, "stage": "session creation", "release": ort.version, "nodes": len(hit)},
            )
    if provider is not None and provider not in QUERY_SEQLENS_PROVIDERS:
        hit = [n for n in nodes if n.op_type == "GroupQueryAttention" and n.input(QUERY_SEQLENS)]
        if hit:
            yield ctx.finding(
                f"{_where(hit)}: GroupQueryAttention with query_seqlens (input 16) on {provider}: only the CPU and "
                "CUDA providers honour it and other providers must reject the node (the 1.32.0 schema), so the "
                "session fails to load",
                node=hit[0], graph=graph, related=hit[1:],
                fix="Deploy on CPU or CUDA, or export without query_seqlens (one query chunk per sequence).",
                properties={"provider": provider, "nodes": len(hit)},
            )


def _refused(node: Node, refusal) -> bool:
    if refusal.input is not None:
        history = op_history(node.op_type)
        formal = history.inputs.get(refusal.input) if history else None
        return formal is not None and bool(node.input(formal.position))
    value = node.attributes.get(refusal.attribute)
    return value is not None and str(value.decode() if isinstance(value, bytes) else value) in refusal.values
