"""Session rules (OGS): how the InferenceSession is configured (optimization level, free dimensions)."""

from __future__ import annotations

import re
from collections import defaultdict

from ortgate.lint.context import RuleContext
from ortgate.lint.findings import Severity
from ortgate.lint.graph import Graph
from ortgate.rules.base import rule
from ortgate.rules.provider import cuda_graph_enabled

LEVEL_EFFECTS = {
    "ORT_DISABLE_ALL": "no fusion, no constant folding",
    "ORT_ENABLE_BASIC": "constant folding and redundant-node elimination only: no SimplifiedLayerNormalization, "
                        "SkipLayerNormalization, FusedMatMul, QuickGelu or GQA QKV packing",
    "ORT_ENABLE_EXTENDED": "no layout optimizations (NCHWc) and none of ALL's provider-specific passes",
    "ORT_ENABLE_LAYOUT": "not every pass of ALL",
}


@rule("OGS001", "optimization-level-not-all", Severity.ERROR)
def optimization_level_not_all(ctx: RuleContext):
    """The session's graph optimization level is set below ORT_ENABLE_ALL.

    ## What it checks
    `session.graph_optimization_level` in the policy and `graph_optimization_level` in genai_config.json's
    session options. Unset is fine: ORT's default is ORT_ENABLE_ALL.

    ## Why it costs throughput
    Below EXTENDED, ORT does not fuse RMSNorm into SimplifiedLayerNormalization, residual + norm into
    SkipLayerNormalization, MatMul + Transpose/scale into FusedMatMul, or pack Q/K/V into
    GroupQueryAttention on CUDA; below ALL it skips layout and provider-specific passes. Each skipped fusion
    is extra kernels and memory traffic on every token.

    ## Bad
    ```yaml
    session:
      graph_optimization_level: ORT_ENABLE_BASIC
    ```

    ## Good
    ```yaml
    session:
      graph_optimization_level: ORT_ENABLE_ALL
    ```

    ## Fix
    `so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL` (Python), or
    `"graph_optimization_level": "ORT_ENABLE_ALL"` in genai_config.json's session_options (or delete the
    key: ALL is the default).
    """
    for setup in ctx.deployment.setups:
        level = setup.optimization_level
        if level is None or level.value == "ORT_ENABLE_ALL":
            continue
        effect = LEVEL_EFFECTS.get(level.value, "fewer optimizations")
        yield ctx.finding(
            f"{setup.label}: graph_optimization_level is {level.value} ({effect})",
            location=level.location,
            fix="Set graph_optimization_level to ORT_ENABLE_ALL (ORT's default).",
            properties={"level": level.value},
        )


# How exporters name the dims of an LLM's inputs. The query dims are pinned for a decode deployment;
# KV-cache dims grow every step and can only be pinned with a static (shared past/present) KV buffer.
_BATCH_DIM = re.compile(r"^(batch|batch_size|batchsize|bs|b|n|num_seqs?|batch_dim)$|batch", re.IGNORECASE)
_KV_DIM = re.compile(r"past|total|cache|kv|key|max_seq|present|context", re.IGNORECASE)
_QUERY_DIM = re.compile(r"^(s|seq|seqlen|seq_len|sequence|sequence_length|query_length|q_len|input_len|"
                        r"num_tokens|tokens|sequence_len)$|seq", re.IGNORECASE)


def classify_dim(name: str) -> str:
    """"batch", "query" (tokens in this step), "kv" (past/total length: grows during decode) or "other"."""
    if _KV_DIM.search(name):
        return "kv"
    if _BATCH_DIM.search(name):
        return "batch"
    if _QUERY_DIM.search(name):
        return "query"
    return "other"


def symbolic_input_dims(graph: Graph) -> dict[str, list[str]]:
    """Symbolic dim name -> the inputs ("input_ids[0]") that use it."""
    dims: dict[str, list[str]] = defaultdict(list)
    for info in graph.inputs:
        for axis, dim in enumerate(info.shape or ()):
            if isinstance(dim, str) and dim:
                dims[dim].append(f"{info.name}[{axis}]")
    return dict(dims)


@rule("OGS002", "free-dim-override-missing", Severity.WARNING)
def free_dim_override_missing(ctx: RuleContext):
    """A symbolic batch or sequence dim of a graph input has no free-dimension override.

    ## What it checks
    The policy's `session.free_dimension_overrides` against the symbolic dims of the model's inputs. For a
    decode deployment the dims of the current step — batch (`batch_size`) and query length
    (`sequence_length`) — should be pinned; KV-cache dims (`past_sequence_length`, `total_sequence_length`)
    grow every step and are only reported when genai_config.json declares a static KV buffer
    (`past_present_share_buffer: true`), the one case where they can be pinned (to the maximum length).
    Error when CUDA graph is enabled (capture needs fixed shapes), warning otherwise.

    ## Why it costs throughput
    With a dim pinned, ORT resolves shapes at session creation: shape-computing subgraphs fold away,
    memory planning becomes static and kernels can be selected for the real shape. CUDA graph capture
    replays fixed shapes only, so unpinned dims defeat it.

    ## Bad
    ```yaml
    session: {}            # input_ids: [batch_size, sequence_length]
    ```

    ## Good
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ## Fix
    `so.add_free_dimension_override_by_name("batch_size", 1)` and `("sequence_length", 1)` — one int per dim
    (ORT takes no ranges), under `session.free_dimension_overrides` in the policy. Pin
    `past_sequence_length` / `total_sequence_length` only with a static KV buffer of that length.
    """
    setup = ctx.deployment.policy_setup
    if setup is None:
        return
    dims = symbolic_input_dims(ctx.model)
    static_kv = bool(ctx.inputs.genai and ctx.inputs.genai.past_present_share_buffer)
    severity = Severity.ERROR if cuda_graph_enabled(setup) else Severity.WARNING
    for name, uses in sorted(dims.items()):
        if name in setup.free_dimension_overrides:
            continue
        kind = classify_dim(name)
        if kind in ("batch", "query"):
            what = "batch" if kind == "batch" else "query-length"
            yield ctx.finding(
                f"{what} dim {name!r} ({', '.join(uses[:3])}{', ...' if len(uses) > 3 else ''}) has no free-dimension "
                "override" + (": CUDA graph capture needs fixed shapes" if severity is Severity.ERROR else ""),
                location=setup.missing(f"session.free_dimension_overrides.{name}"),
                severity=severity,
                fix=f"Add `{name}: <value>` under session.free_dimension_overrides "
                    f"(so.add_free_dimension_override_by_name({name!r}, value)); 1 for single-sequence decode.",
                properties={"dim": name, "kind": kind},
            )
        elif kind == "kv" and static_kv:
            yield ctx.finding(
                f"KV-cache dim {name!r} is not pinned although genai_config.json declares a static KV buffer "
                "(past_present_share_buffer): pin it to the buffer length",
                location=setup.missing(f"session.free_dimension_overrides.{name}"),
                severity=Severity.INFO,
                fix=f"Add `{name}: <max_length>` under session.free_dimension_overrides.",
                properties={"dim": name, "kind": kind},
            )
