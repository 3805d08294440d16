"""Will the session load on the deployment's ONNX Runtime release and provider: com.microsoft ops, inputs and
attributes the release does not define (knowledge/op_schemas.json, read from each release's wheel), and node forms
the provider refuses (knowledge/ort_cpu_limits.json, re-proved on the installed release by
tests/test_ort_release_claims.py). The release is the deployment's (config.deployment.OrtRelease): `--ort-version`,
the policy's `execution_provider.onnxruntime_version`, else the release ortgate assumes in every install."""

from __future__ import annotations

from ortgate.cost.repairs import RepairKind
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
from ortgate.knowledge.provider_names import CPU, CUDA, TRT_RTX
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, layers_text

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
    1.32.0), and an ai.onnx opset newer than the release loads (1.31.1 refuses opset 27, 1.32.0 opset 29; probed
    on each wheel). The release is the policy's `execution_provider.onnxruntime_version` (or `--ort-version`), else
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
    from ortgate.graph.index import DEFAULT_DOMAIN
    from ortgate.knowledge.op_schemas import max_model_opset

    ort = ctx.deployment.ort
    version = ort.judged_as
    graph = ctx.model
    stamped, newest = graph.opsets.get(DEFAULT_DOMAIN), max_model_opset(version)
    if stamped is not None and newest is not None and stamped > newest[0]:
        yield ctx.finding(
            f"the model imports ai.onnx opset {stamped}; {release_text(ctx)} loads models up to opset {newest[0]} "
            f"(seen on {newest[1]}'s wheel), so the session fails to load ('ONNX Runtime only *guarantees* "
            "support for models stamped with official released onnx opset versions')",
            graph=graph,
            fix=f"Export at opset {newest[0]} or lower, or deploy a release that loads opset {stamped}.",
            properties={"what": "opset", "opset": stamped, "max_model_opset": newest[0], "release": ort.version},
        )
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
        if not history.variadic and last >= input_count(node.op_type, version):
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
      1.23.1 to 1.32.0 and re-proved on the installed release by a one-node model): `swiglu_fusion=2`,
      `activation_type` geglu or relu2 (CUDA only) and, on 1.32.0, `swiglu_limit_after_activation=1` refuse the
      session at creation; separate `fc3_experts_weights` load and fail at the first run ("FC3 is not implemented
      for CPU MoE"). A com.microsoft op the release defines without a CPU kernel (SwiGLU, MoEPacked, RMSNormRotary,
      MatMulPacked ... in 1.32.0; MoE before 1.23.1) cannot be placed at all.
    - CUDA, on onnxruntime 1.31.1 and later (knowledge/ort_cuda_contracts.json, the strings of the
      onnxruntime-gpu 1.31.1 wheel's CUDA provider): QMoE with separate fc3 weights (except block-scaled FP8),
      zero points with a block size below 32 or per-column scales, nvfp4 with a block size other than 16; a
      MatMulNBits with prepacked weights (`weight_prepacked=1`) outside the wheel's compact fpA_intB set
      (float16/bfloat16 activations, INT2 at block 64 or INT4/INT8 at block 32, scales only: no zero points,
      bias or g_idx). Where the policy names a device (`throughput.device`), its compute capability
      (knowledge/devices.json, NVIDIA's table) decides two more: prepacked fpA_intB needs 7.5 or later for float16
      and 8.0 or later for bfloat16 activations, and a QMoE with FP4 experts (`quant_type` fp4 or nvfp4) 9.0 or
      later ("FP4 MoE GEMM requires SM90+": the wheel's error string, not run on a GPU). Without a device these
      are not judged.
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
    if provider == CUDA:
        yield from _cuda_refusals(ctx, graph, nodes)
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


def _cuda_refusals(ctx: RuleContext, graph: Graph, nodes: list[Node]):
    from ortgate.knowledge.cuda_contracts import cuda_contracts
    from ortgate.knowledge.deployment_facts import at_least

    facts = cuda_contracts()
    if not at_least(ctx.deployment.ort.judged_as, facts.since):
        return
    cc = compute_capability(ctx)
    found: dict[str, list[Node]] = {}
    for node in nodes:
        if node.op_type == "QMoE":
            quant = _text(node.attr("quant_type", "int"))
            block = node.attr("block_size", 0)
            zero_points = any(node.input(i) for i in (11, 12, 13))
            if node.input(8) and quant != "fp8":
                found.setdefault("separate_fc3", []).append(node)
            if zero_points and isinstance(block, int) and 0 < block < 32:
                found.setdefault("zero_points_small_block", []).append(node)
            if zero_points and isinstance(block, int) and block <= 0:
                found.setdefault("zero_points_row_wise", []).append(node)
            if quant == "nvfp4" and block != 16:
                found.setdefault("nvfp4_block", []).append(node)
            if quant in facts.fp4_qmoe.quant_types and cc is not None and cc < facts.fp4_qmoe.min_compute_capability:
                found.setdefault("fp4_compute_capability", []).append(node)
        elif node.op_type == "MatMulNBits" and node.attr("weight_prepacked", 0) == 1:
            if _outside_fpa_intb(graph, node, facts):
                found.setdefault("fpa_intb", []).append(node)
            elif cc is not None and cc < facts.fpa_intb_compute_capability.get(graph.dtype(node.input(0)) or "", 0.0):
                found.setdefault("fpa_intb_compute_capability", []).append(node)
    for key, hit in found.items():
        if key in ("fpa_intb_compute_capability", "fp4_compute_capability"):
            yield _compute_capability_refusal(ctx, graph, key, hit, facts)
            continue
        message = facts.matmulnbits_fpa_intb.message if key == "fpa_intb" else facts.refusal(key).message
        op = hit[0].op_type
        yield ctx.finding(
            f"{_where(hit)}: com.microsoft.{op} in a form the CUDA provider of {release_text(ctx)} refuses: "
            f"'{message}' ({facts.source})",
            node=hit[0], graph=graph, related=hit[1:],
            fix=("Quantize for the compact fpA_intB set (float16/bfloat16, INT4/INT8 block 32 or INT2 block 64, "
                 "scales only), or write raw weights (weight_prepacked=0)." if key == "fpa_intb" else
                 "Re-quantize the experts in a form the CUDA QMoE takes (gate and up in fc1, zero points only with "
                 "blocks of 32 or more, nvfp4 at block 16)."),
            properties={"refusal": key, "release": ctx.deployment.ort.version, "nodes": len(hit)},
        )


def compute_capability(ctx: RuleContext) -> float | None:
    """The compute capability of the policy's device (`throughput.device`, knowledge/devices.json); None when the
    policy names no device or the catalog gives it none (not an NVIDIA GPU): then nothing that needs it is judged."""
    tp = ctx.inputs.throughput
    device = tp.device if tp is not None else None
    return device.compute_capability.value if device is not None else None


def _compute_capability_refusal(ctx: RuleContext, graph: Graph, key: str, hit: list[Node], facts):
    tp = ctx.inputs.throughput
    assert tp is not None and tp.device is not None
    device = tp.device
    cc = device.compute_capability
    if key == "fp4_compute_capability":
        need = facts.fp4_qmoe.min_compute_capability
        quant = _text(hit[0].attr("quant_type", "int"))
        what = f"QMoE with FP4 experts (quant_type={quant})"
        message = facts.fp4_qmoe.message
        fix = ("Deploy on compute capability 9.0 or later (H100, H200, B200), or quantize the experts as INT4/INT8 "
               "for this device.")
    else:
        dtype = graph.dtype(hit[0].input(0)) or "?"
        need = facts.fpa_intb_compute_capability[dtype]
        what = f"MatMulNBits with prepacked weights (fpA_intB) and {dtype} activations"
        message = facts.matmulnbits_fpa_intb.message
        fix = ("Deploy on a device the compact fpA_intB build supports, use float16 activations (7.5 or later), or "
               "write raw weights (weight_prepacked=0).")
    return ctx.finding(
        f"{_where(hit)}: com.microsoft.{what} on {device.label} (compute capability {cc.value:.1f}, NVIDIA's table): "
        f"the CUDA provider of {release_text(ctx)} needs compute capability {need:.1f} or later for it: "
        f"'{message}' ({facts.source})",
        node=hit[0], graph=graph, related=hit[1:],
        fix=fix,
        properties={"refusal": key, "release": ctx.deployment.ort.version, "device": device.name,
                    "compute_capability": cc.value, "compute_capability_source": cc.source,
                    "required_compute_capability": need, "nodes": len(hit)},
    )


def _outside_fpa_intb(graph: Graph, node: Node, facts) -> bool:
    contract = facts.matmulnbits_fpa_intb
    dtype = graph.dtype(node.input(0))
    form = (node.attr("bits", 4), node.attr("block_size", 0))
    return (any(node.input(i) for i in (3, 4, 5))
            or (dtype is not None and dtype not in contract.activation_dtypes)
            or not any(form == (f.bits, f.block_size) for f in contract.forms))


def _refused(node: Node, refusal) -> bool:
    if refusal.input is not None:
        history = op_history(node.op_type)
        formal = history.inputs.get(refusal.input) if history else None
        return formal is not None and bool(node.input(formal.position))
    value = node.attributes.get(refusal.attribute)
    return value is not None and str(value.decode() if isinstance(value, bytes) else value) in refusal.values


# ---- configuration the release checks at session creation ---------------------------------------------------------


@rule("OGS013", "session-key-refused", Severity.ERROR, needs=("session",), policy_only=True)
def session_key_refused(ctx: RuleContext):
    """A session config entry the deployment's ONNX Runtime release refuses when the session is created.

    ## What it checks
    The policy's `session.config_entries` and genai_config.json's session options, on the deployment's release
    (knowledge/ort_session_keys.json, each seen on a 1.32.0 CPU session and re-proved by a test):
    from 1.32.0 a `session.moe.offload.*` key that is not one of its 25 keys (a typo), a prototype
    `moe.cpu_offload.*` key, and a value outside what the key takes (`session.moe.offload.mode`
    disabled/auto/required, `placement` static/adaptive, `gpu_budget_bytes` auto or bytes, `cpu_threads`,
    `session.kernel_dispatch_policy` auto/latency/memory/safe, `ep.enable_weightless_mode` 0/1/2). Before
    1.32.0 these keys are stored and never read (unknown-session-config-key says so).

    ## Why it costs throughput
    The deployment does not start: ORT 1.32.0 fails session creation with INVALID_ARGUMENT for every model,
    whereas 1.31.1 silently ignored the same entry, so an upgrade that passed CI on the old release stops
    production.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: "1.32.0"}
    session:
      config_entries: {session.moe.offload.gpu_budget_byte: "8000000000"}
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: "1.32.0"}
    session:
      config_entries: {session.moe.offload.gpu_budget_bytes: "8000000000"}
    ```

    ## Fix
    Spell the key as ORT 1.32 does (the finding names the keys it knows), move `moe.cpu_offload.*` settings to
    `session.moe.offload.*`, or give a value the key takes.
    """
    from ortgate.knowledge.session_keys import refused_key

    ort = ctx.deployment.ort
    for setup in ctx.deployment.setups:
        for key, setting in sorted(setup.config_entries.items()):
            value = setup.config_entry(key) or ""
            refused = refused_key(key, value, ort.judged_as)
            if refused is None:
                continue
            why, source = refused
            yield ctx.finding(
                f"{setup.label}: session config entry {key!r} is refused by {release_text(ctx)} when the session is "
                f"created: {why}",
                location=setting.location,
                fix="Use a key and value the release takes (session.moe.offload.* has 25 keys; see "
                    "`ortgate explain session-key-refused`), or remove the entry.",
                properties={"key": key, "value": value, "release": ort.version, "source": source},
            )


@rule("OGP013", "moe-offload-unsupported", Severity.ERROR, needs=("session",))
def moe_offload_unsupported(ctx: RuleContext):
    """MoE expert offload is required (`session.moe.offload.mode=required`) for a deployment it cannot serve.

    ## What it checks
    With `session.moe.offload.mode` set to `required` (ONNX Runtime 1.32.0's MoE expert offload), what the
    offload needs (knowledge/ort_session_keys.json, from the 1.32.0 library's error strings): the CUDA provider;
    MoE / QMoE nodes with float16 or bfloat16 activations; no `use_sparse_mixer=1`; no
    `swiglu_limit_after_activation=1`; and for QMoE with integer weights only the forms (4 bits,
    weights_prepacked=1, block 32), (3 bits, weights_prepacked=0, block 32/64/128) or (2 bits,
    weights_prepacked=1, block 32/64/128); compute capability 8.0 or later, judged where the policy names a
    device (`throughput.device`, knowledge/devices.json), not judged without one.
    With `mode=auto` (or the `on` / `1` ORT also accepts) nothing is said: whether ORT then runs without offload
    was not verified.

    ## Why it costs throughput
    The deployment was sized for offloaded experts (a GPU budget smaller than the experts); with `required` ORT
    refuses the session instead of running it.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: "1.32.0"}
    session:
      config_entries: {session.moe.offload.mode: required}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float[T, 8] x, float[T, 4] logits) => (float[T, 8] y)
    <float[4, 16, 8] fc1, float[4, 8, 8] fc2>
    {
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: "1.32.0"}
    session:
      config_entries: {session.moe.offload.mode: required}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] x, float16[T, 4] logits) => (float16[T, 8] y)
    <float16[4, 16, 8] fc1, float16[4, 8, 8] fc2>
    {
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
    }
    ```

    ## Fix
    Export the experts in a form the offload takes (float16/bfloat16 activations, a listed integer form), run on
    CUDA, or set `session.moe.offload.mode` to `auto` or `disabled`.
    """
    from ortgate.knowledge.deployment_facts import at_least
    from ortgate.knowledge.session_keys import offload

    facts = offload()
    ort = ctx.deployment.ort
    if not at_least(ort.judged_as, "1.32.0"):
        return  # the release does not read the key: unknown-session-config-key's
    graph = ctx.inputs.executed
    for setup in ctx.deployment.setups:
        mode = setup.config_entry(facts.mode_key)
        if mode is None or mode.lower() != "required":
            continue
        where = setup.config_entries[facts.mode_key].location
        reasons: dict[str, list[Node]] = {}
        if setup.provider_name != facts.provider:
            reasons[f"it runs only on {facts.provider}, not {setup.provider_name}"] = []
        elif (cc := compute_capability(ctx)) is not None and cc < facts.min_compute_capability:
            assert ctx.inputs.throughput is not None and ctx.inputs.throughput.device is not None
            reasons[f"it needs compute capability {facts.min_compute_capability:.1f} or later, and "
                    f"{ctx.inputs.throughput.device.label} has {cc:.1f}"] = []
        for node in [n for n in _ms_nodes(graph) if n.op_type in ("MoE", "QMoE")]:
            dtype = graph.dtype(node.input(0))
            if dtype is not None and dtype not in facts.activation_dtypes:
                reasons.setdefault(f"it takes {' or '.join(facts.activation_dtypes)} activations, not {dtype}",
                                   []).append(node)
            if node.attr("use_sparse_mixer", 0) == 1:
                reasons.setdefault("it does not take use_sparse_mixer=1", []).append(node)
            if node.attr("swiglu_limit_after_activation", 0) == 1:
                reasons.setdefault("it does not take swiglu_limit_after_activation=1", []).append(node)
            if node.op_type == "QMoE" and _text(node.attr("quant_type", "int")) == "int":
                form = (node.attr("expert_weight_bits", 4), node.attr("weights_prepacked", -1),
                        node.attr("block_size", 0))
                if not any(form[0] == f.bits and form[1] == f.weights_prepacked and form[2] in f.block_sizes
                           for f in facts.int_forms):
                    reasons.setdefault(f"it does not take QMoE int weights as (bits {form[0]}, weights_prepacked "
                                       f"{form[1]}, block {form[2]})", []).append(node)
        for why, nodes in reasons.items():
            yield ctx.finding(
                f"{setup.label}: session.moe.offload.mode=required, but the MoE expert offload of "
                f"{release_text(ctx)} cannot serve this deployment: {why}"
                + (f" ({_where(nodes)})" if nodes else "") + "; the session is refused",
                location=where if not nodes else None, node=nodes[0] if nodes else None,
                graph=graph if nodes else None, related=nodes[1:],
                fix="Export the experts in a form the offload takes, or set session.moe.offload.mode to auto or "
                    "disabled.",
                properties={"reason": why, "nodes": len(nodes), "source": facts.source},
            )


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)




@rule("OGP014", "trt-rtx-plugin-only", Severity.WARNING, needs=("provider",))
def trt_rtx_plugin_only(ctx: RuleContext):
    """NvTensorRTRTXExecutionProvider on ONNX Runtime 1.32.0 or later, which ships it only as a plugin the
    application registers.

    ## What it checks
    A deployment on `NvTensorRTRTXExecutionProvider` whose release (the policy's
    `execution_provider.onnxruntime_version`, `--ort-version`, else the one ortgate assumes) is 1.32.0 or later.
    From 1.32.0 the provider "is only available as a plugin EP registered by the application"
    (onnxruntime_inference_collection.py of the 1.32.0 wheel): naming it in `providers=[...]` alone no longer
    finds it, and TensorRT RTX falls back to CUDA only if CUDA is listed too.

    ## Why it costs throughput
    A session that does not find its provider runs where ORT places it instead: on CPU, at a fraction of the
    GPU's speed, unless the application registered the plugin library first.

    ## Bad
    ```yaml
    execution_provider: {name: NvTensorRTRTXExecutionProvider, onnxruntime_version: "1.32.0"}
    ```

    ## Good
    ```yaml
    execution_provider: {name: NvTensorRTRTXExecutionProvider, onnxruntime_version: "1.31.1"}
    ```

    ## Fix
    Register the TensorRT RTX plugin EP library in the application (`onnxruntime.register_execution_provider_library`)
    before creating the session, and check with `ortgate run` that the nodes run on it.
    """
    from ortgate.knowledge.deployment_facts import at_least

    ort = ctx.deployment.ort
    if not at_least(ort.judged_as, "1.32.0"):
        return
    for setup in ctx.deployment.setups:
        if setup.provider_name == TRT_RTX and setup.provider is not None:
            yield ctx.finding(
                f"{setup.label}: {TRT_RTX} on {release_text(ctx)} is only available as a plugin EP the application "
                "registers; naming it among the providers alone does not load it",
                location=setup.provider.location,
                fix="Register the plugin EP library before creating the session (register_execution_provider_library).",
                properties={"provider": TRT_RTX, "release": ort.version},
            )


# ---- CUDA graph capture preflight (the onnxruntime-gpu 1.31.1 CUDA provider's capture constraints) ------------------

CAPTURE_SOURCE = "the strings of onnxruntime-gpu 1.31.1's libonnxruntime_providers_cuda.so"
CAPTURE_SINCE = "1.31.1"  # the release whose CUDA provider was read; older ones are not judged


# The CUDA mempool arena's settings (the strings of the 1.31.1 Python binding); capture falls back to BFCArena.
MEMPOOL_OPTIONS = ("use_cuda_mempool", "cuda_mempool_release_threshold", "cuda_mempool_bytes_to_keep_on_shrink")


def _capture_setups(ctx: RuleContext):
    from ortgate.knowledge.deployment_facts import at_least
    from ortgate.rules.provider import cuda_graph_enabled

    if not at_least(ctx.deployment.ort.judged_as, CAPTURE_SINCE):
        return []
    return [s for s in ctx.deployment.setups if s.provider_name == CUDA and cuda_graph_enabled(s)]


def _runtime_g_idx(graph: Graph) -> list[Node]:
    return [n for n in graph.by_op(MS_DOMAIN, "MatMulNBits") if n.input(4) and not graph.is_constant(n.input(4))]


@rule("OGK010", "cuda-graph-capture-refused", Severity.ERROR, needs=("provider",))
def cuda_graph_capture_refused(ctx: RuleContext):
    """CUDA graph capture is on, and the CUDA provider refuses something the deployment asks of it during capture.

    ## What it checks
    With `enable_cuda_graph` on for the CUDA provider (policy or genai_config.json), on onnxruntime 1.31.1 or
    later (the release whose CUDA provider was read: its error strings):
    - `session.enable_moe_expert_counting=1` with MoE / QMoE nodes: "MoE expert counting is not supported during
      CUDA graph capture";
    - a MatMulNBits whose `g_idx` (input 4) is computed at run time rather than a weight: "runtime group_index
      inputs are not supported during capture".

    ## Why it costs throughput
    The captured step fails instead of replaying: the deployment loses CUDA graph (the largest single win at
    batch-1 decode) or does not start.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    session:
      config_entries: {session.enable_moe_expert_counting: "1"}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] x, float16[T, 4] logits) => (float16[T, 8] y)
    <float16[4, 16, 8] fc1, float16[4, 8, 8] fc2>
    {
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] x, float16[T, 4] logits) => (float16[T, 8] y)
    <float16[4, 16, 8] fc1, float16[4, 8, 8] fc2>
    {
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
    }
    ```

    ## Fix
    Count experts in a separate profiling session without CUDA graph; store `g_idx` as a weight (or quantize
    without act-order) for a captured deployment.
    """
    graph = ctx.inputs.executed
    for setup in _capture_setups(ctx):
        counting = setup.config_entry("session.enable_moe_expert_counting")
        moe = [n for n in _ms_nodes(graph) if n.op_type in ("MoE", "QMoE")]
        if counting in ("1", "true", "True") and moe:
            yield ctx.finding(
                f"{setup.label}: CUDA graph capture with session.enable_moe_expert_counting=1 and {_where(moe)} of "
                f"MoE / QMoE: 'MoE expert counting is not supported during CUDA graph capture' ({CAPTURE_SOURCE})",
                location=setup.config_entries["session.enable_moe_expert_counting"].location,
                fix="Count experts in a profiling session without CUDA graph.",
                properties={"constraint": "moe_expert_counting", "nodes": len(moe)},
            )
        g_idx = _runtime_g_idx(graph)
        if g_idx:
            yield ctx.finding(
                f"{setup.label}: CUDA graph capture with {_where(g_idx)} of MatMulNBits whose g_idx is computed at "
                f"run time: 'runtime group_index inputs are not supported during capture' ({CAPTURE_SOURCE})",
                node=g_idx[0], graph=graph, related=g_idx[1:],
                fix="Store g_idx as a weight, or quantize without act-order.",
                properties={"constraint": "runtime_g_idx", "nodes": len(g_idx)},
            )


@rule("OGK011", "cuda-graph-capture-degraded", Severity.WARNING, needs=("provider",))
def cuda_graph_capture_degraded(ctx: RuleContext):
    """CUDA graph capture is on, and a kernel the deployment relies on takes a slower or unprofiled path under
    capture.

    ## What it checks
    With `enable_cuda_graph` on for the CUDA provider, on onnxruntime 1.31.1 or later (its CUDA provider's strings):
    - MatMulNBits on the fpA_intB GEMM (prepacked weights, `weight_prepacked=1`, or `ep.cuda.fpa_intb_gemm=1`):
      "The M bucket was not profiled before CUDA graph capture; run a warmup inference outside capture first" —
      each decode shape needs a warm-up run before the step is captured;
    - PagedAttention: "cuDNN paged SDPA graph unavailable ... during CUDA graph capture": the captured step uses
      the other paged attention path;
    - the CUDA mempool arena (`use_cuda_mempool`, `cuda_mempool_release_threshold`,
      `cuda_mempool_bytes_to_keep_on_shrink` among the provider options): "CUDA Mempool Arena allocator is not
      compatible with requested CUDA Graph Capture ... Falling back to default BFCArena": the settings are ignored.

    ## Why it costs throughput
    A GEMM captured with an unprofiled tactic, or attention on its fallback path, is replayed at that speed for
    every token the deployment serves.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    proj (float16[1, 64] a) => (float16[1, 64] y)
    <uint8[64, 2, 16] b, float16[128] scales>
    {
      y = com.microsoft.MatMulNBits<K = 64, N = 64, bits = 4, block_size = 32, weight_prepacked = 1>(a, b, scales)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    proj (float16[1, 64] a) => (float16[1, 64] y)
    <uint8[64, 2, 16] b, float16[128] scales>
    {
      y = com.microsoft.MatMulNBits<K = 64, N = 64, bits = 4, block_size = 32>(a, b, scales)
    }
    ```

    ## Fix
    Run one warm-up inference per decode shape before the first captured step (onnxruntime-genai does one
    generator step), or tune the tactics offline (`onnxruntime.tools.fpa_intb_tune`, 1.32.0); for PagedAttention,
    measure both paths with `ortgate run`.
    """
    graph = ctx.inputs.executed
    for setup in _capture_setups(ctx):
        forced = setup.config_entry("ep.cuda.fpa_intb_gemm") in ("1", "true", "True")
        fpa = [n for n in graph.by_op(MS_DOMAIN, "MatMulNBits") if forced or n.attr("weight_prepacked", 0) == 1]
        if fpa:
            yield ctx.finding(
                f"{setup.label}: CUDA graph capture with {_where(fpa)} of MatMulNBits on the fpA_intB GEMM: 'The M "
                "bucket was not profiled before CUDA graph capture; run a warmup inference outside capture first' "
                f"({CAPTURE_SOURCE})",
                node=fpa[0], graph=graph, related=fpa[1:],
                fix="Run a warm-up inference per decode shape before capture, or tune offline (fpa_intb_tune).",
                properties={"constraint": "fpa_intb_m_bucket", "nodes": len(fpa)},
            )
        mempool = [k for k in MEMPOOL_OPTIONS if k in setup.provider_options]
        if mempool:
            yield ctx.finding(
                f"{setup.label}: CUDA graph capture with the CUDA mempool arena ({', '.join(mempool)}): 'CUDA Mempool "
                "Arena allocator is not compatible with requested CUDA Graph Capture ... Falling back to default "
                f"BFCArena' ({CAPTURE_SOURCE}): the mempool settings are ignored",
                location=setup.provider_options[mempool[0]].location,
                fix="Drop the mempool settings for a captured deployment, or size the BFC arena instead.",
                properties={"constraint": "cuda_mempool_arena", "options": mempool},
            )
        paged = graph.by_op(MS_DOMAIN, "PagedAttention")
        if paged:
            yield ctx.finding(
                f"{setup.label}: CUDA graph capture with {_where(paged)} of PagedAttention: 'cuDNN paged SDPA graph "
                f"unavailable ... during CUDA graph capture' ({CAPTURE_SOURCE}): the captured step takes the other "
                "paged attention path",
                node=paged[0], graph=graph, related=paged[1:],
                fix="Measure the captured and uncaptured step with `ortgate run` (ORT_ENABLE_CUDNN_FLASH_ATTENTION=0 "
                    "selects the non-cuDNN path outright).",
                properties={"constraint": "paged_attention_cudnn", "nodes": len(paged)},
            )


@rule("OGK012", "cuda-kernel-fallback", Severity.WARNING, needs=("provider",))
def cuda_kernel_fallback(ctx: RuleContext):
    """A node the CUDA provider runs, but not on its fast kernel: which path it gets, why, and what that path is
    reported to cost.

    ## What it checks
    On the CUDA provider, on onnxruntime 1.31.1 and later (knowledge/ort_cuda_contracts.json):
    - GroupQueryAttention with a head size above 256: no fused CUDA attention, the unfused path (Gemma-4's head
      size 512 layers cost 4.3% of its whole decode on H200, onnxruntime/mobius#263);
    - MXFP4 QMoE (`quant_type=fp4`) with an expert shape outside k % 64 == 0 and n % 16 == 0: the interleaved GEMV
      cannot take it and the persistent MoE weights take twice the memory (the memory estimate counts the
      second copy: part `mxfp4_repack`).
    Each finding carries the reported figure and its source; the decode estimate does not price these paths (the
    figures are whole-model ones). A QMoE off the GEMV fast path is qmoe-gemv-fast-path-missed's, which is priced.

    ## Why it costs throughput
    The node is fused and runs on the GPU, so nothing else flags it, but it takes the slow path for every token.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 2048] qkv, float16[1, 1, P, 512] past_k, float16[1, 1, P, 512] past_v,
               int32[1] seqlens_k, int32[1] total_len) => (float16[1, T, 1024] o, float16[1, 1, S, 512] present_k,
               float16[1, 1, S, 512] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 2, kv_num_heads = 1>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 512] qkv, float16[1, 1, P, 128] past_k, float16[1, 1, P, 128] past_v,
               int32[1] seqlens_k, int32[1] total_len) => (float16[1, T, 256] o, float16[1, 1, S, 128] present_k,
               float16[1, 1, S, 128] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 2, kv_num_heads = 1>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Fix
    Pad MXFP4 expert shapes to k % 64 and n % 16, and measure the attention layers with `ortgate run --profile`;
    a head size above 256 is the model's.
    """
    from ortgate.knowledge.cuda_contracts import cuda_contracts
    from ortgate.knowledge.deployment_facts import at_least

    facts = cuda_contracts()
    if ctx.deployment.provider != CUDA or not at_least(ctx.deployment.ort.judged_as, facts.since):
        return
    graph = ctx.inputs.executed
    wide: list[tuple[Node, int]] = []
    mxfp4: list[Node] = []
    gemv = facts.qmoe_gemv
    for node in _ms_nodes(graph):
        if node.op_type == "GroupQueryAttention":
            head = _head_size(graph, node)
            if head is not None and head > facts.gqa_fused_head_size.max:
                wide.append((node, head))
        elif node.op_type == "QMoE" and graph.dtype(node.input(0)) in gemv.activation_dtypes:
            if _text(node.attr("quant_type", "int")) == "fp4":
                shape = graph.shape(node.input(2))
                n, k2 = (shape[1], shape[2]) if shape is not None and len(shape) == 3 else (None, None)
                if isinstance(n, int) and isinstance(k2, int):
                    if (2 * k2) % facts.mxfp4_shape.k_multiple or n % facts.mxfp4_shape.n_multiple:
                        mxfp4.append(node)
    if wide:
        nodes = [n for n, _ in wide]
        heads = sorted({h for _, h in wide})
        fact = facts.gqa_fused_head_size
        yield ctx.finding(
            f"{_where(nodes)}: GroupQueryAttention with head size {', '.join(map(str, heads))} on {CUDA} "
            f"({release_text(ctx)}): above {fact.max} no fused CUDA attention runs it, the unfused path does "
            f"(reported: {fact.slowdown:.1%} of a whole model's decode; {fact.source})",
            node=nodes[0], graph=graph, related=nodes[1:],
            fix="Measure the attention layers with `ortgate run --profile`; the head size is the model's.",
            properties={"tier": "unfused attention", "head_sizes": heads, "reported_slowdown": fact.slowdown,
                        "source": fact.source, "nodes": len(nodes)},
        )
    if mxfp4:
        yield ctx.finding(
            f"{_where(mxfp4)}: MXFP4 QMoE on {CUDA} ({release_text(ctx)}) with an expert shape outside k % "
            f"{facts.mxfp4_shape.k_multiple} == 0 and n % {facts.mxfp4_shape.n_multiple} == 0: "
            f"'{facts.mxfp4_shape.message}' ({facts.source})",
            node=mxfp4[0], graph=graph, related=mxfp4[1:],
            fix="Pad the expert dims to k % 64 == 0 and n % 16 == 0.",
            properties={"tier": "MXFP4 outside interleaved GEMV", "nodes": len(mxfp4)},
        )


def _head_size(graph: Graph, node: Node) -> int | None:
    heads, kv = node.attr("num_heads", 0), node.attr("kv_num_heads", 0)
    shape = graph.shape(node.input(0))
    if not heads or not shape or not isinstance(shape[-1], int):
        return None
    width = shape[-1]
    packed = not node.input(1)
    parts = heads + 2 * kv if packed else heads
    return width // parts if parts and width % parts == 0 else None


@rule("OGK013", "qmoe-gemv-fast-path-missed", Severity.WARNING, needs=("provider", "moe"), price=RepairKind.qmoe_gemv,
      price_all=True)
def qmoe_gemv_fast_path_missed(ctx: RuleContext):
    """A float16/bfloat16 QMoE on CUDA whose weights are outside the batch-1 GEMV fast path: decode runs the
    grouped GEMM.

    ## What it checks
    On the CUDA provider, on onnxruntime 1.27.0 and later (the releases with the fast path): every QMoE with
    float16 or bfloat16 activations and integer weights (`quant_type=int`) whose `expert_weight_bits` is not 4 or
    8, or whose `block_size` is not 0 (per-column), 32, 64 or 128 (knowledge/ort_cuda_contracts.json). Priced: the
    fast path made GPT-OSS-20B decode
    about 15% faster on H200 (microsoft/onnxruntime#29037, #29038); the cost model applies that speed-up to each
    such node at batch-1 decode (ortgate's reading: a MoE-bound decode), and the finding's price is what the fast
    path saves.

    ## Why it costs throughput
    At batch 1 the experts' GEMMs are matrix-vector products; the GEMV kernel reads the quantized weights once at
    full bandwidth, the grouped GEMM pads to tiles and launches more.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe (float16[T, 64] x, float16[T, 4] logits) => (float16[T, 64] y)
    <uint8[4, 256, 16] w1, float16[4, 256, 1] s1, uint8[4, 64, 16] w2, float16[4, 64, 1] s2>
    {
      y = com.microsoft.QMoE<k = 2, expert_weight_bits = 2, block_size = 64, activation_type = "swiglu", swiglu_fusion = 1>(
          x, logits, w1, s1, , w2, s2)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe (float16[T, 64] x, float16[T, 4] logits) => (float16[T, 64] y)
    <uint8[4, 256, 32] w1, float16[4, 256, 2] s1, uint8[4, 64, 32] w2, float16[4, 64, 2] s2>
    {
      y = com.microsoft.QMoE<k = 2, expert_weight_bits = 4, block_size = 32, activation_type = "swiglu", swiglu_fusion = 1>(
          x, logits, w1, s1, , w2, s2)
    }
    ```

    ## Fix
    Re-quantize the experts as INT4 or INT8 with block 32, 64 or 128 (or per-column); the onnxruntime-genai
    builder's `int4` and `int8` QMoE schemes write such forms.

    ## References
    - [microsoft/onnxruntime#29037](https://github.com/microsoft/onnxruntime/issues/29037),
      [#29038](https://github.com/microsoft/onnxruntime/issues/29038): the CUDA QMoE batch-1 GEMV fast path
      and the decode speed-up it gave GPT-OSS-20B on an H200
    """
    from ortgate.cost.estimate import qmoe_off_gemv
    from ortgate.knowledge.cuda_contracts import cuda_contracts
    from ortgate.knowledge.deployment_facts import at_least

    facts = cuda_contracts()
    gemv = facts.qmoe_gemv
    if ctx.deployment.provider != CUDA or not at_least(ctx.deployment.ort.judged_as, gemv.since):
        return
    graph = ctx.inputs.executed
    slow_qmoe = [n for n in graph.by_op(MS_DOMAIN, "QMoE") if qmoe_off_gemv(graph, n)]
    if slow_qmoe:
        yield ctx.finding(
            f"{_where(slow_qmoe)}: QMoE with {slow_qmoe[0].attr('expert_weight_bits', 4)}-bit weights at block "
            f"{slow_qmoe[0].attr('block_size', 0)} on {CUDA} ({release_text(ctx)}): outside the batch-1 GEMV fast "
            f"path (INT{'/INT'.join(map(str, gemv.bits))}, block {'/'.join(map(str, gemv.block_sizes))}), decode "
            f"runs the grouped GEMM (reported: the fast path is worth about {gemv.speedup:.0%} of decode; "
            f"{gemv.source})",
            node=slow_qmoe[0], graph=graph, related=slow_qmoe[1:],
            fix="Re-quantize the experts as INT4 or INT8 with block 32, 64 or 128 (or per-column).",
            properties={"tier": "grouped GEMM", "reported_speedup_of_fast_path": gemv.speedup,
                        "source": gemv.source, "nodes": len(slow_qmoe)},
        )


TIER_OPS = ("QMoE", "MoE", "MatMulNBits", "GroupQueryAttention")
NOT_PRICED = "its cost beside the fast path is not priced: no published figure"


@rule("OGK014", "cuda-kernel-tier", Severity.INFO, needs=("provider",))
def cuda_kernel_tier(ctx: RuleContext):
    """The CUDA kernel tier of every QMoE, MoE, MatMulNBits and GroupQueryAttention node, and what decides it.

    Each tier is the fast path, a fallback, the default kernel, refused or not decided, with the condition that
    decides it and whether the cost model prices it.

    ## What it checks
    On the CUDA provider, on onnxruntime 1.31.1 and later (knowledge/ort_cuda_contracts.json, the strings of the
    onnxruntime-gpu 1.31.1 wheel's CUDA provider), one finding per op kind the model holds, counting its nodes per
    tier:
    - QMoE with float16/bfloat16 activations: integer experts at INT4/INT8 with block 0, 32, 64 or 128 take the
      batch-1 GEMV fast path; other integer forms the grouped GEMM (priced: qmoe-gemv-fast-path-missed, the fast
      path is worth about 15% of decode, microsoft/onnxruntime#29037, #29038); MXFP4 (`quant_type=fp4`) the
      dequant/GEMV path (the native FP4 CUTLASS GEMM is opt-in), twice the resident weights outside k % 64 and
      n % 16; other forms, and float32 activations, are not decided.
    - MoE: no tier of the CUDA MoE kernel is known: not decided.
    - MatMulNBits: prepacked weights (`weight_prepacked=1`) in the compact fpA_intB set run fpA_intB (outside it the
      session is refused: provider-refuses-node); raw weights run fpA_intB only with the session config entry
      `ep.cuda.fpa_intb_gemm=1` (microsoft/onnxruntime#29585), else the default MatMulNBits kernel; float32
      activations never take fpA_intB.
    - GroupQueryAttention: head size 256 or less runs fused attention, above it the unfused path (reported 4.3% of
      Gemma-4's whole decode on H200, onnxruntime/mobius#263, not priced per node).
    A node without a CUDA kernel for its dtypes (a float32 GroupQueryAttention) is op-not-on-ep's, not judged here.
    A path without a published figure says "not priced". Where the policy names a device, its compute capability
    decides the FP4 and fpA_intB forms it refuses (provider-refuses-node).

    ## Why it costs throughput
    A fused node on a slow kernel runs on the GPU, so nothing else shows it; the tier is what decides its time.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    proj (float16[1, 64] a) => (float16[1, 64] y)
    <uint8[64, 2, 16] b, float16[128] scales>
    {
      y = com.microsoft.MatMulNBits<K = 64, N = 64, bits = 4, block_size = 32>(a, b, scales)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CPUExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    proj (float16[1, 64] a) => (float16[1, 64] y)
    <uint8[64, 2, 16] b, float16[128] scales>
    {
      y = com.microsoft.MatMulNBits<K = 64, N = 64, bits = 4, block_size = 32>(a, b, scales)
    }
    ```

    ## Fix
    Nothing to fix where every node is on its fast path. Otherwise follow the tier's condition: re-quantize QMoE
    experts as INT4/INT8 at block 32, 64 or 128; write MatMulNBits prepacked in the compact fpA_intB set or set
    `ep.cuda.fpa_intb_gemm=1` and measure with `ortgate run`.

    ## References
    - [microsoft/onnxruntime#29037](https://github.com/microsoft/onnxruntime/issues/29037),
      [#29038](https://github.com/microsoft/onnxruntime/issues/29038): the CUDA QMoE batch-1 GEMV fast path
    - [microsoft/onnxruntime#29585](https://github.com/microsoft/onnxruntime/issues/29585): raw weights on
      fpA_intB only with the session config entry `ep.cuda.fpa_intb_gemm=1`
    """
    from ortgate.knowledge.cuda_contracts import cuda_contracts
    from ortgate.knowledge.deployment_facts import at_least

    facts = cuda_contracts()
    if ctx.deployment.provider != CUDA or not at_least(ctx.deployment.ort.judged_as, facts.since):
        return
    graph = ctx.inputs.executed
    from ortgate.rules.placement import cpu_bound

    opt_in = any(s.config_entry(facts.fpa_intb_opt_in.key) == "1" for s in ctx.deployment.setups)
    on_cpu = {id(p.node) for p in cpu_bound(graph, CUDA)}  # no CUDA kernel for its dtypes: op-not-on-ep's
    by_op: dict[str, dict[tuple[str, str, str, str], list[Node]]] = {}
    for node in _ms_nodes(graph):
        if node.op_type in TIER_OPS and id(node) not in on_cpu:
            tier = _kernel_tier(graph, node, facts, opt_in)
            by_op.setdefault(node.op_type, {}).setdefault(tier, []).append(node)
    for op in TIER_OPS:
        tiers = by_op.get(op)
        if not tiers:
            continue
        nodes = [n for hit in tiers.values() for n in hit]
        parts = [f"{len(hit)} on {name} ({kind}: {condition}; {price})"
                 for (name, kind, condition, price), hit in sorted(tiers.items(), key=lambda t: -len(t[1]))]
        yield ctx.finding(
            f"{_where(nodes)}: com.microsoft.{op} on {CUDA}, onnxruntime {ctx.deployment.ort.version}: "
            + "; ".join(parts),
            node=nodes[0], graph=graph, related=nodes[1:],
            fix=(None if all(kind in ("fast path", "not decided") for (_, kind, _, _) in tiers) else
                 "A fallback's or default's condition says what moves its nodes to the fast path; measure with "
                 "`ortgate run --profile`."),
            properties={"op": op, "tiers": [
                {"tier": name, "kind": kind, "condition": condition, "price": price, "nodes": len(hit)}
                for (name, kind, condition, price), hit in sorted(tiers.items())]},
        )


def _kernel_tier(graph: Graph, node: Node, facts, opt_in: bool) -> tuple[str, str, str, str]:
    """(tier, "fast path" | "fallback" | "default" | "refused" | "not decided", the deciding condition, its price)."""
    from ortgate.cost.estimate import qmoe_off_gemv

    dtype = graph.dtype(node.input(0))
    if node.op_type == "QMoE":
        gemv = facts.qmoe_gemv
        if dtype not in gemv.activation_dtypes:
            return ("unknown kernel", "not decided", (f"{dtype or 'unknown'} activations: the knowledge holds CUDA QMoE "
                    "tiers for float16/bfloat16 only"), "not priced")
        quant = _text(node.attr("quant_type", "int"))
        bits, block = node.attr("expert_weight_bits", 4), node.attr("block_size", 0)
        if quant == "int":
            if qmoe_off_gemv(graph, node):
                return ("grouped GEMM", "fallback", (f"INT{bits} at block {block} is outside the batch-1 GEMV fast "
                        f"path (INT{'/INT'.join(map(str, gemv.bits))}, block {'/'.join(map(str, gemv.block_sizes))})"),
                        (f"priced by qmoe-gemv-fast-path-missed: the fast path is worth about {gemv.speedup:.0%} of "
                        "batch-1 decode, microsoft/onnxruntime#29037, #29038"))
            return ("batch-1 GEMV", "fast path", f"INT{bits} at block {block}", "the estimate's baseline")
        if quant == "fp4":
            shape = graph.shape(node.input(2))
            n, k2 = (shape[1], shape[2]) if shape is not None and len(shape) == 3 else (None, None)
            if isinstance(n, int) and isinstance(k2, int) and (
                    (2 * k2) % facts.mxfp4_shape.k_multiple or n % facts.mxfp4_shape.n_multiple):
                return ("MXFP4 outside the interleaved GEMV", "fallback", (f"expert shape outside k % "
                        f"{facts.mxfp4_shape.k_multiple} == 0 and n % {facts.mxfp4_shape.n_multiple} == 0: twice "
                        "the resident expert weights"), "not priced: the figure is memory, not time")
            return ("MXFP4 dequant/GEMV", "default", (f"'{facts.fp4_dequant_gemv.message}' (opt in: "
                    f"{facts.fp4_dequant_gemv.opt_in_env})"), NOT_PRICED)
        return ("unknown kernel", "not decided", f"quant_type={quant}: no CUDA tier for it in the knowledge",
                "not priced")
    if node.op_type == "MoE":
        return ("the CUDA MoE kernel", "not decided", "no fast path or fallback of it is known", "not priced")
    if node.op_type == "MatMulNBits":
        if dtype is not None and dtype not in facts.matmulnbits_fpa_intb.activation_dtypes:
            return ("default MatMulNBits kernel", "default", f"{dtype} activations never take fpA_intB", NOT_PRICED)
        if node.attr("weight_prepacked", 0) == 1:
            if _outside_fpa_intb(graph, node, facts):
                return ("none", "refused", "prepacked outside the compact fpA_intB set (provider-refuses-node)",
                        "not priced: the session fails")
            return ("fpA_intB (prepacked)", "fast path", "prepacked in the compact fpA_intB set", "the estimate's baseline")
        if opt_in:
            return ("fpA_intB (opt-in)", "fast path", f"raw weights with {facts.fpa_intb_opt_in.key}=1",
                    "the estimate's baseline")
        return ("default MatMulNBits kernel", "default", (f"raw weights; fpA_intB is opt-in ({facts.fpa_intb_opt_in.key}"
                "=1, microsoft/onnxruntime#29585)"), NOT_PRICED)
    head = _head_size(graph, node)
    fused = facts.gqa_fused_head_size
    if head is None:
        return ("unknown kernel", "not decided", "head size not known from the graph", "not priced")
    if head > fused.max:
        return ("unfused attention", "fallback", f"head size {head} > {fused.max}",
                (f"not priced per node (reported: {fused.slowdown:.1%} of a whole model's decode, "
                f"{fused.source.split(' (')[0]})"))
    return ("fused attention", "fast path", f"head size {head} <= {fused.max}", "the estimate's baseline")
