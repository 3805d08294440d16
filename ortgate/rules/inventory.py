"""Op inventory rules (OGM): ops the policy requires or forbids, by explicit count."""

from __future__ import annotations

from ortgate.findings import Severity
from ortgate.graph.index import op_key, parse_op_key
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext


@rule("OGM010", "required-ops", Severity.ERROR)
def required_ops(ctx: RuleContext):
    """The graph has fewer nodes of an op than `model.required_ops` demands, or an op `model.forbidden_ops` bans.

    ## What it checks
    Node counts per (domain, op_type) in the executed graph (the optimized dump when given, else the model)
    against the policy's explicit minimums, e.g. `com.microsoft.MoE: 40`, and its list of forbidden ops,
    e.g. `MemcpyToHost`. Keys are `[domain.]op_type`; no domain means the ONNX domain. Subgraph nodes count.

    ## Why it costs throughput
    An explicit inventory is the bluntest guard against a re-export that silently lost a fusion: one
    layer exported without its `GroupQueryAttention` still runs, slower, and still produces the right
    numbers.

    ## Bad
    ```yaml
    model:
      required_ops: {com.microsoft.MoE: 40}   # the graph has 38: two layers fell back to a dense loop
    ```

    ## Good
    ```yaml
    model:
      required_ops: {com.microsoft.MoE: 40, com.microsoft.GroupQueryAttention: 10}
      forbidden_ops: [Loop, NonZero]
    ```

    ## Fix
    Re-export the model so that every layer has the fused op, or correct the count in the policy when the
    architecture changed (hybrid models have fewer attention layers than layers).
    """
    graph = ctx.executed
    for key, expected in sorted((ctx.expect.required_ops or {}).items()):
        domain, op_type = parse_op_key(key)
        found = graph.count(domain, op_type)
        if found < expected.value:
            yield ctx.finding(
                f"{found} {op_key(domain, op_type)} node{'s' if found != 1 else ''} in {graph.path}; "
                f"the policy requires at least {expected.value}",
                location=expected.location,
                fix=f"Re-export so every layer has its {op_type} node, or correct model.required_ops.",
                properties={"op": op_key(domain, op_type), "expected": expected.value, "found": found},
            )
    for key in ctx.expect.forbidden_ops or []:
        domain, op_type = parse_op_key(key)
        nodes = graph.by_op(domain, op_type)
        for node in nodes[:20]:
            yield ctx.finding(
                f"{node.key} is forbidden by the policy (model.forbidden_ops)",
                node=node, graph=graph,
                fix=f"Remove {op_type} from the graph (re-export), or drop it from model.forbidden_ops.",
            )
        if len(nodes) > 20:
            yield ctx.finding(
                f"{len(nodes) - 20} more {op_key(domain, op_type)} nodes are forbidden by the policy",
                location=ctx.policy.where("model", "forbidden_ops") if ctx.policy else None, graph=graph,
                properties={"op": op_key(domain, op_type), "more": len(nodes) - 20},
            )
