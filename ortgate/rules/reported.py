"""Failures users of ONNX Runtime's LLM serving report in public issues, seen in the graph, the session config and
the declared releases before any session is made. Each fact, its source and the releases it applies to are data
(knowledge/deployment_facts.json); the releases are the policy's `execution_provider.onnxruntime_version` and
`execution_provider.onnxruntime_genai_version`. A rule whose fact depends on a release says nothing when the
release is not declared."""

from __future__ import annotations

from ortgate.config.deployment import SessionSetup
from ortgate.cost.repairs import RepairKind
from ortgate.findings import Location, Severity
from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.attention import LINEAR_ATTENTION_OPS
from ortgate.knowledge import input_position
from ortgate.knowledge.deployment_facts import deployment_fact
from ortgate.knowledge.provider_names import CUDA
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext
from ortgate.rules.placement import gpu_targets
from ortgate.rules.provider import cuda_graph_enabled, option_keys

TRUE = ("1", "true", "True")


def declared_release(ctx: RuleContext, package: str) -> tuple[str | None, Location | None]:
    """The release of `package` ("onnxruntime" / "onnxruntime-genai") the policy declares, and where."""
    policy = ctx.policy
    if package == "onnxruntime":
        ort = ctx.deployment.ort  # the one resolution: --ort-version, else the policy's; an assumed one is not declared
        return (ort.version, ort.location) if ort.pinned else (None, None)
    key = "onnxruntime_genai_version"
    if policy is None:
        return None, None
    value = policy.get("execution_provider", key)
    return (str(value), policy.where("execution_provider", key)) if value is not None else (None, None)


def _cuda_setups(ctx: RuleContext) -> list[SessionSetup]:
    return [s for s in ctx.deployment.setups if s.provider_name == CUDA]


def _on_cuda(ctx: RuleContext) -> str | None:
    labels = gpu_targets(ctx).get(CUDA)
    return " and ".join(dict.fromkeys(labels)) if labels else None


# ---- onnxruntime-genai and CUDA graph -------------------------------------------------------------------------


@rule("OGP010", "genai-cuda-graph-unsupported", Severity.ERROR, needs=("provider", "policy"))
def genai_cuda_graph_unsupported(ctx: RuleContext):
    """CUDA graph is on for onnxruntime-genai 0.8.0 to 0.13.x, which refuse it: the model never loads.

    ## What it checks
    A CUDA session with `enable_cuda_graph` on (genai_config.json's provider options, or the policy's) when the
    policy declares an `execution_provider.onnxruntime_genai_version` of 0.8.0 up to 0.14.0 (not included). Those
    releases throw "Graph Capture is currently unsupported for CUDA" when the generator is created; 0.14.0 lifted
    it (onnxruntime-genai#2070). Without a declared genai release nothing is said.

    ## Why it costs throughput
    The deployment does not start. Upgrading instead of switching capture off keeps what capture is worth: 20-45%
    faster decode on Qwen3.5 when 0.14.0 lifted it (onnxruntime-genai#2070).

    ## Bad
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1"}
      onnxruntime_genai_version: 0.13.2
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1"}
      onnxruntime_genai_version: 0.14.0
    ```

    ## Fix
    Upgrade onnxruntime-genai to 0.14.0 or later; on an older release set `enable_cuda_graph` to "0".

    ## References
    - [microsoft/onnxruntime-genai#2070](https://github.com/microsoft/onnxruntime-genai/issues/2070): 0.14.0 lifted
      "Graph Capture is currently unsupported for CUDA"
    """
    version, where = declared_release(ctx, "onnxruntime-genai")
    fact = deployment_fact("genai_cuda_graph_unsupported")
    if version is None or where is None or version not in fact.applies_to:
        return
    for setup in _cuda_setups(ctx):
        if not cuda_graph_enabled(setup):
            continue
        setting = setup.provider_options["enable_cuda_graph"]
        yield ctx.finding(
            f"{setup.label}: enable_cuda_graph is on, and onnxruntime-genai {version} (declared at "
            f"{where.file}:{where.line}) throws \"Graph Capture is currently unsupported for CUDA\" when the "
            f"generator is created ({fact.applies_to.span}; {fact.source})",
            location=setting.location,
            fix=f"Upgrade onnxruntime-genai to {fact.applies_to.until} or later, or set enable_cuda_graph to \"0\".",
            properties={"genai_version": version, "fixed_in": fact.applies_to.until},
        )


@rule("OGP011", "cuda-graph-recurrent-state", Severity.WARNING, needs=("provider",))
def cuda_graph_recurrent_state(ctx: RuleContext):
    """CUDA graph capture over a hybrid model whose linear-attention state is fed back in place: reported to
    corrupt the state.

    ## What it checks
    A CUDA session with CUDA graph on, over a graph whose linear-attention ops (GatedDeltaNet, CausalConvWithState
    and the like) take their recurrent or convolution state from graph inputs that the step writes back. The warm-up
    runs before capture advance that state (microsoft/onnxruntime#32243, open), and replaying the graph captured for
    another input shape (multimodal prompts) corrupted text (onnxruntime-genai#2446, fixed by backing up the state
    and a single buffer in #2452). No release is known here to fix #32243, so the warning stands on every release.

    ## Why it costs throughput
    Capture is worth 20-45% of the decode step on these models, and wrong text is worse than slow text: a run must
    check the outputs with capture on before the speed counts.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float16[batch, 1, 64] x, float16[batch, 64, 3] past_conv) => (float16[batch, 1, 64] y,
                                                                     float16[batch, 64, 3] present_conv)
    <float16[64, 1, 4] w>
    {
      y, present_conv = com.microsoft.CausalConvWithState (x, w, past_conv)
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float16[batch, 1, 64] x, float16[batch, 64, 3] past_conv) => (float16[batch, 1, 64] y,
                                                                     float16[batch, 64, 3] present_conv)
    <float16[64, 1, 4] w>
    {
      y, present_conv = com.microsoft.CausalConvWithState (x, w, past_conv)
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "0"}}
    ```

    ## Fix
    Compare the outputs with and without capture (`ortgate run` on the device) before turning it on; on
    onnxruntime-genai use a release with #2452, and follow microsoft/onnxruntime#32243.

    ## References
    - [microsoft/onnxruntime#32243](https://github.com/microsoft/onnxruntime/issues/32243): the warm-up runs before
      capture advance a recurrent state (open)
    - [microsoft/onnxruntime-genai#2446](https://github.com/microsoft/onnxruntime-genai/issues/2446): replaying the
      graph captured for another input shape corrupted text;
      [#2452](https://github.com/microsoft/onnxruntime-genai/issues/2452) backs up the state and keeps a single buffer
    """
    states = _recurrent_state_inputs(ctx.inputs.executed)
    if not states:
        return
    fact = deployment_fact("cuda_graph_recurrent_state")
    for setup in _cuda_setups(ctx):
        if not cuda_graph_enabled(setup):
            continue
        shown = ", ".join(states[:3]) + (f" and {len(states) - 3} more" if len(states) > 3 else "")
        yield ctx.finding(
            f"{setup.label}: CUDA graph capture is on over linear-attention state fed back in place ({shown}): "
            f"{fact.what} ({fact.source})",
            location=setup.provider_options["enable_cuda_graph"].location,
            fix="Check the outputs with capture on against capture off on the device before relying on it.",
            properties={"states": len(states)},
        )


def _recurrent_state_inputs(graph: Graph) -> list[str]:
    inputs = graph.input_names
    found: list[str] = []
    for d, o in LINEAR_ATTENTION_OPS:
        for node in graph.by_op(d, o):
            found.extend(name for name in node.inputs if name in inputs and name not in found)
    return found


# ---- QMoE on CUDA ---------------------------------------------------------------------------------------------


def _qmoe_nodes(ctx: RuleContext) -> list[Node]:
    return [n for n in ctx.inputs.executed.by_op(MS_DOMAIN, "QMoE") if n.graph is None]


@rule("OGK007", "qmoe-block-size-cuda", Severity.ERROR, needs=("provider", "moe"))
def qmoe_block_size_cuda(ctx: RuleContext):
    """A QMoE node's `block_size` is not one the CUDA QMoE kernels take (32, 64, 128, or 0 for per-column
    scales).

    ## What it checks
    Every com.microsoft QMoE node of a deployment on the CUDA provider: its `block_size` attribute against the
    block sizes of the CUDA kernels (onnxruntime-genai's builder writes only 32, 64 or 128 for CUDA, default 32;
    0 is one scale per output column). Another block size failed session creation (microsoft/onnxruntime#29035).
    A float32 QMoE, which has no CUDA kernel at all, is `op-not-on-ep`'s.

    ## Why it costs throughput
    The session does not start, or, where the provider falls back, the experts run on the CPU with a Memcpy either
    side: 97% of the step in CPU QMoE in the report.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float16[1, 1, 64] x, float16[1, 1, 4] router) => (float16[1, 1, 64] y)
    <uint8[4, 64, 16] w1, float16[4, 64, 2] s1, uint8[4, 64, 16] w2, float16[4, 64, 2] s2>
    {
      y = com.microsoft.QMoE <k = 2, expert_weight_bits = 4, block_size = 16, activation_type = "silu">
          (x, router, w1, s1, "", w2, s2, "")
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float16[1, 1, 64] x, float16[1, 1, 4] router) => (float16[1, 1, 64] y)
    <uint8[4, 64, 16] w1, float16[4, 64, 1] s1, uint8[4, 64, 16] w2, float16[4, 64, 1] s2>
    {
      y = com.microsoft.QMoE <k = 2, expert_weight_bits = 4, block_size = 32, activation_type = "silu">
          (x, router, w1, s1, "", w2, s2, "")
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ## Fix
    Re-quantize the experts with block size 32 (the builder's default for CUDA), 64 or 128.

    ## References
    - [microsoft/onnxruntime#29035](https://github.com/microsoft/onnxruntime/issues/29035): a QMoE block size other than
      32, 64 or 128 failed session creation on CUDA
    """
    on = _on_cuda(ctx)
    if on is None:
        return
    fact = deployment_fact("qmoe_cuda_block_sizes")
    allowed = {int(v) for v in fact.values}
    bad = [n for n in _qmoe_nodes(ctx) if (n.int_attr("block_size", 0) or 0) not in allowed]
    if not bad:
        return
    sizes = sorted({n.int_attr("block_size", 0) or 0 for n in bad})
    yield ctx.finding(
        f"{len(bad)} QMoE node{'s' if len(bad) != 1 else ''} with block_size {', '.join(map(str, sizes))} on "
        f"{CUDA} ({on}): the CUDA QMoE kernels take block sizes 32, 64 and 128 (0: per-column scales); "
        f"{fact.source}",
        node=bad[0], graph=ctx.inputs.executed, related=bad,
        fix="Re-quantize the experts with block size 32, 64 or 128.",
        properties={"block_sizes": sizes, "nodes": len(bad)},
    )


@rule("OGK008", "qmoe-cuda-kernel-set", Severity.WARNING, needs=("provider", "policy", "moe"))
def qmoe_cuda_kernel_set(ctx: RuleContext):
    """A QMoE form that ONNX Runtime 1.30's default CUDA kernel set may not compile: bfloat16 activations, zero
    points, or blocks above 32.

    ## What it checks
    On the CUDA provider, when the policy declares `execution_provider.onnxruntime_version` 1.30 or later: every
    QMoE node with bfloat16 activations, zero-point inputs (fc1/fc2/fc3_zero_points), or a `block_size` of 64 or
    128. The 1.30 release notes say the default CUDA build compiles a compact fpA-intB kernel set (float16
    activations, int4/int8 weights, scales only, block 32) and that the rest needs the build's FULL kernel flag;
    whether the PyPI wheels set it was not found, so this warns. Without a declared release nothing is said. The
    notes name expert biases too; they are not flagged, since onnxruntime-genai's builder writes bias inputs on
    every CUDA QMoE it exports and no failure with them is reported.

    ## Why it costs throughput
    A QMoE without a fast kernel either fails at session creation or runs a slow path; MoE layers are most of a
    fine-grained MoE's decode step.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float16[1, 1, 64] x, float16[1, 1, 4] router) => (float16[1, 1, 64] y)
    <uint8[4, 64, 16] w1, float16[4, 64, 1] s1, uint8[4, 64, 16] w2, float16[4, 64, 1] s2>
    {
      y = com.microsoft.QMoE <k = 2, expert_weight_bits = 4, block_size = 64, activation_type = "silu">
          (x, router, w1, s1, "", w2, s2, "")
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: 1.31.1}
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float16[1, 1, 64] x, float16[1, 1, 4] router) => (float16[1, 1, 64] y)
    <uint8[4, 64, 16] w1, float16[4, 64, 2] s1, uint8[4, 64, 16] w2, float16[4, 64, 2] s2>
    {
      y = com.microsoft.QMoE <k = 2, expert_weight_bits = 4, block_size = 32, activation_type = "silu">
          (x, router, w1, s1, "", w2, s2, "")
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: 1.31.1}
    ```

    ## Fix
    Quantize for the default set (float16 activations, scales only, block 32), or run an ONNX Runtime build with
    the full kernel set and waive the finding naming it.
    """
    on = _on_cuda(ctx)
    version, _ = declared_release(ctx, "onnxruntime")
    fact = deployment_fact("qmoe_cuda_default_kernels")
    if on is None or version is None or version not in fact.applies_to:
        return
    graph = ctx.inputs.executed
    reasons: dict[str, list[Node]] = {}
    for node in _qmoe_nodes(ctx):
        if graph.dtype(node.input(0)) == "bfloat16":
            reasons.setdefault("bfloat16 activations", []).append(node)
        zero_points = [input_position(MS_DOMAIN, "QMoE", f"fc{i}_zero_points") for i in (1, 2, 3)]
        if any(p is not None and node.input(p) for p in zero_points):
            reasons.setdefault("zero points", []).append(node)
        block = node.int_attr("block_size", 0) or 0
        if block > 32 and block in (64, 128):
            reasons.setdefault(f"block_size {block}", []).append(node)
    for why, nodes in reasons.items():
        yield ctx.finding(
            f"{len(nodes)} QMoE node{'s' if len(nodes) != 1 else ''} with {why} on {CUDA} ({on}), ONNX Runtime "
            f"{version}: {fact.what} ({fact.source})",
            node=nodes[0], graph=graph, related=nodes,
            fix="Quantize for the default kernel set (float16, scales only, block 32), or use a full-kernel build.",
            properties={"reason": why, "nodes": len(nodes), "onnxruntime_version": version},
        )


# ---- ONNX-domain Attention on CUDA ----------------------------------------------------------------------------


@rule("OGK009", "onnx-attention-cuda-decode", Severity.WARNING, needs=("provider", "attention"), price=RepairKind.onnx_attention,
      price_all=True)
def onnx_attention_cuda_decode(ctx: RuleContext):
    """ONNX-domain Attention (opset 23/24) on the CUDA provider, which has none of GroupQueryAttention's decode
    kernels: about 34 us against 10 us per layer and step.

    ## What it checks
    Every ai.onnx Attention node of a deployment on the CUDA provider. The CUDA provider runs it with a generic
    kernel; com.microsoft GroupQueryAttention has the decode fast paths (about 34 us against 10 us per decode step
    and layer, microsoft/onnxruntime#28352, #29714). The message prices the difference over the graph's Attention
    layers, and its share of the estimated step when a device is named; the cost model counts it too (the step as
    exported pays it on CUDA, and the finding's price and the with-fixes estimate are what GroupQueryAttention
    saves).

    ## Why it costs throughput
    24 us per layer and step: 1.2 ms per token on a 48-layer model, 10-20% of a fine-grained MoE's decode step.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 23]>
    g (float16[1, 4, 1, 16] q, float16[1, 2, 1, 16] k, float16[1, 2, 1, 16] v) => (float16[1, 4, 1, 16] y)
    {
      y = Attention <is_causal = 1> (q, k, v)
    }
    ```

    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 23]>
    g (float16[1, 4, 1, 16] q, float16[1, 2, 1, 16] k, float16[1, 2, 1, 16] v) => (float16[1, 4, 1, 16] y)
    {
      y = Attention <is_causal = 1> (q, k, v)
    }
    ```

    ```yaml
    execution_provider: {name: CPUExecutionProvider}
    ```

    ## Fix
    Export attention as com.microsoft GroupQueryAttention (onnxruntime-genai's builder does), or let `ortgate
    fix` rewrite it where it can.

    ## References
    - [microsoft/onnxruntime#28352](https://github.com/microsoft/onnxruntime/issues/28352),
      [#29714](https://github.com/microsoft/onnxruntime/issues/29714): the ONNX-domain Attention's CUDA decode against
      GroupQueryAttention's fast paths
    """
    on = _on_cuda(ctx)
    if on is None:
        return
    graph = ctx.inputs.executed
    nodes = [n for n in graph.by_op(DEFAULT_DOMAIN, "Attention") if n.graph is None]
    if not nodes:
        return
    fact = deployment_fact("onnx_attention_cuda_decode")
    slow, fast = fact.values[0], fact.values[1]
    extra_ms = len(nodes) * (slow - fast) / 1e3
    est = ctx.inputs.estimate
    share = ""
    if est is not None and est.as_exported.expected_s > 0:
        share = (f", {extra_ms / (est.as_exported.expected_s * 1e3):.0%} of the estimated "
                 f"{est.as_exported.expected_s * 1e3:.2f} ms step on {est.device.name}")
    yield ctx.finding(
        f"{len(nodes)} ONNX-domain Attention node{'s' if len(nodes) != 1 else ''} on {CUDA} ({on}): {fact.what}; "
        f"about {extra_ms:.2f} ms more per decode step than GroupQueryAttention{share} (an estimate; {fact.source})",
        node=nodes[0], graph=graph, related=nodes,
        fix="Export attention as com.microsoft GroupQueryAttention.",
        properties={"nodes": len(nodes), "ms_per_step_extra": round(extra_ms, 4), "estimate": True},
    )


# ---- the deployment's batch against literal dims ---------------------------------------------------------------


def deployment_batch(ctx: RuleContext) -> tuple[int, Location] | None:
    """The largest batch the deployment declares (throughput.batch_size, runner.batch_size, the batch_size free
    dimension override) and where, or None."""
    found: list[tuple[int, Location]] = []
    policy = ctx.policy
    if policy is not None:
        for path in (("throughput", "batch_size"), ("runner", "batch_size")):
            value = policy.get(*path)
            if isinstance(value, int) and not isinstance(value, bool):
                found.append((value, policy.where(*path)))
    for setup in ctx.deployment.setups:
        setting = setup.free_dimension_overrides.get("batch_size")
        if setting is not None and isinstance(setting.value, int) and not isinstance(setting.value, bool):
            found.append((setting.value, setting.location))
    return max(found, key=lambda x: x[0]) if found else None


@rule("OGS011", "rotary-position-ids-batch-one", Severity.ERROR)
def rotary_position_ids_batch_one(ctx: RuleContext):
    """A RotaryEmbedding's `position_ids` has a literal first dim 1 while the deployment runs a larger batch: every
    batched run fails.

    ## What it checks
    The `position_ids` input of every com.microsoft RotaryEmbedding (in the model and in ORT's optimized dump):
    a rank-2 shape whose first dim is the literal 1, against the batch the deployment declares
    (`throughput.batch_size`, `runner.batch_size`, a `batch_size` free-dimension override). ORT's rotary fusion
    wrote `position_ids` as [1, S] (microsoft/onnxruntime#29618, #29632, from #27590): at batch 2 the kernel
    fails "dimension 0 should be of size batch_size". A 1-D `position_ids` of shape [1] is the offset form and fine.

    ## Why it costs throughput
    Batching is where serving throughput comes from; a graph that only runs at batch 1 caps it at one sequence.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float[batch, seq, 64] x, int64[1, seq] position_ids) => (float[batch, seq, 64] y)
    <float[256, 8] cos, float[256, 8] sin>
    {
      y = com.microsoft.RotaryEmbedding <num_heads = 4> (x, position_ids, cos, sin)
    }
    ```

    ```yaml
    runner: {batch_size: 4}
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    g (float[batch, seq, 64] x, int64[batch, seq] position_ids) => (float[batch, seq, 64] y)
    <float[256, 8] cos, float[256, 8] sin>
    {
      y = com.microsoft.RotaryEmbedding <num_heads = 4> (x, position_ids, cos, sin)
    }
    ```

    ```yaml
    runner: {batch_size: 4}
    ```

    ## Fix
    Re-export with `position_ids` shaped [batch_size, sequence_length] (or fuse with an ORT release past #29632),
    or deploy at batch 1.

    ## References
    - [microsoft/onnxruntime#29618](https://github.com/microsoft/onnxruntime/issues/29618),
      [#29632](https://github.com/microsoft/onnxruntime/issues/29632): the rotary fusion's [1, S] position_ids fail at
      batch 2 and above; [#27590](https://github.com/microsoft/onnxruntime/issues/27590): the change it came from
    """
    batch = deployment_batch(ctx)
    if batch is None or batch[0] <= 1:
        return
    fact = deployment_fact("rotary_position_ids_batch_one")
    position = input_position(MS_DOMAIN, "RotaryEmbedding", "position_ids")
    for graph in ctx.inputs.graphs:
        bad = []
        for node in graph.by_op(MS_DOMAIN, "RotaryEmbedding"):
            name = node.input(position) if position is not None else ""
            shape = graph.shape(name) if name else None
            if shape is not None and len(shape) == 2 and shape[0] == 1:
                bad.append(node)
        if not bad:
            continue
        yield ctx.finding(
            f"{len(bad)} RotaryEmbedding node{'s' if len(bad) != 1 else ''} take position_ids of shape "
            f"{list(graph.shape(bad[0].input(position or 1)) or [])} (first dim the literal 1) while the deployment "
            f"runs batch {batch[0]} ({batch[1].file}:{batch[1].line}): {fact.what} ({fact.source})",
            node=bad[0], graph=graph, related=bad,
            fix="Re-export with position_ids [batch_size, sequence_length], or deploy at batch 1.",
            properties={"batch_size": batch[0], "nodes": len(bad)},
        )


# ---- session options that need another ------------------------------------------------------------------------


@rule("OGS012", "moe-statistics-without-profiling", Severity.WARNING, needs=("session",))
def moe_statistics_without_profiling(ctx: RuleContext):
    """`session.enable_moe_expert_statistics` is on without profiling: the statistics have nowhere to go.

    ## What it checks
    A session config entry `session.enable_moe_expert_statistics` = 1 (policy or genai_config.json) in a session
    whose profiling is off (`session.enable_profiling` config entry, genai's `enable_profiling` session option, or
    the policy's session). The statistics are written into the profiling output (microsoft/onnxruntime#32261).

    ## Why it costs throughput
    The per-expert counters cost time on every MoE node and produce nothing a team can read: a tuning pass that
    meant to find hot experts finds an empty file.

    ## Bad
    ```yaml
    session:
      config_entries: {session.enable_moe_expert_statistics: "1"}
    ```

    ## Good
    ```yaml
    session:
      config_entries: {session.enable_moe_expert_statistics: "1", session.enable_profiling: "1"}
    ```

    ## Fix
    Turn profiling on in the same session, or remove the statistics switch.

    ## References
    - [microsoft/onnxruntime#32261](https://github.com/microsoft/onnxruntime/issues/32261): the MoE statistics are
      written into the profiling output
    """
    fact = deployment_fact("moe_statistics_need_profiling")
    for setup in ctx.deployment.setups:
        setting = setup.config_entries.get("session.enable_moe_expert_statistics")
        if setting is None or str(setting.value) not in TRUE:
            continue
        profiling = setup.config_entry("session.enable_profiling") or setup.config_entry("enable_profiling")
        attribute = setup.session_attributes.get("enable_profiling")
        if (profiling is not None and profiling in TRUE) or (attribute is not None and bool(attribute.value)):
            continue
        yield ctx.finding(
            f"{setup.label}: session.enable_moe_expert_statistics is on and profiling is off: {fact.what} "
            f"({fact.source})",
            location=setting.location,
            fix="Turn profiling on (session.enable_profiling) in the same session, or remove the switch.",
            properties={"key": "session.enable_moe_expert_statistics"},
        )


@rule("OGP012", "provider-option-deprecated", Severity.WARNING, needs=("session",))
def provider_option_deprecated(ctx: RuleContext):
    """A provider option that an ONNX Runtime release deprecated (`enable_skip_layer_norm_strict_mode` since 1.28).

    ## What it checks
    Every provider option of the policy and genai_config.json against the deprecations the provider option
    catalog records (knowledge/provider_options.json, each with its release and source). A deprecated option still
    parses today and stops parsing when it is removed: for the CUDA provider an unknown option makes session
    creation fall back to the CPU.

    ## Why it costs throughput
    When the option is removed, the CUDA provider rejects the session's options and Python's InferenceSession
    falls back to the CPU: decode runs tens of times slower with a warning in a log.

    ## Bad
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_skip_layer_norm_strict_mode: "1"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1"}
    ```

    ## Fix
    Remove the option (its default is what later releases do).
    """
    for setup, catalog, key, setting in option_keys(ctx):
        option = catalog.option(key)
        if option is None or option.deprecated_since is None:
            continue
        yield ctx.finding(
            f"{setup.label}: {setup.provider_name} option {key!r} is deprecated since ONNX Runtime "
            f"{option.deprecated_since}: {option.deprecated_note}",
            location=setting.location,
            fix=f"Remove {key}.",
            properties={"key": key, "deprecated_since": option.deprecated_since},
        )
