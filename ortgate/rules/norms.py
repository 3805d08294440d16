"""RMSNorm rules: decomposed RMSNorms (OGF), residual adds not fused into the norm (OGF), norm epsilons (OGM)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ortgate.cost.repairs import RepairKind
from ortgate.findings import Severity
from ortgate.graph.index import Graph, Node
from ortgate.graph.patterns.norms import EPSILON_NORM_OPS, decomposed_rmsnorms, residual_norms
from ortgate.knowledge.families import ModelFamily, model_family
from ortgate.knowledge.fusions import attribute_default, fusions_version, rmsnorm_form_fused, rmsnorm_form_providers
from ortgate.rules.advice import builder_advice, fusion_fix_advice
from ortgate.rules.base import FixKind, rule
from ortgate.rules.context import RuleContext, layers_text
from ortgate.rules.targets import by_layer, judged_graph, layer_text, ort_pass_note, target

RMSNORM_FIX = (
    "Export every RMSNorm as one SimplifiedLayerNormalization (ONNX domain; axis=-1, epsilon=rms_norm_eps, "
    "stash_type=1) and each residual Add + RMSNorm as com.microsoft SkipSimplifiedLayerNormalization "
    "(its 4th output carries the residual on). ORT's own SimplifiedLayerNormFusion only matches the Pow -> "
    "ReduceMean -> Add -> Sqrt -> Div(x, .) -> Mul form."
)


def rmsnorm_fix(ctx: RuleContext) -> str:
    """RMSNORM_FIX, then what repairs this model: `ortgate fix` (onnxscript's RMSNorm and SkipRMSNorm fusions), and a
    builder for a family it builds, with the deployment's provider."""
    return " ".join(filter(None, (RMSNORM_FIX, fusion_fix_advice("RMSNorm and residual Add + RMSNorm"),
                                   builder_advice(ctx.expect.value("family"), ctx.deployment.provider, "both"))))
_FORM_TEXT = {
    "pow_div": "x / Sqrt(ReduceMean(Pow(x, 2)) + eps) * gamma",
    "pow_div_cast": "x / Sqrt(...) cast back before * gamma (fp16 upcast around the norm)",
    "pow_div_one": "x * (1 / Sqrt(ReduceMean(Pow(x, 2)) + eps)) * gamma (legacy TorchScript export)",
    "pow_div_one_cast": "x * (1 / Sqrt(...)) cast back before * gamma (fp16 upcast around the norm)",
    "pow_reciprocal": "x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2)) + eps)) * gamma (torch.rsqrt)",
    "pow_reciprocal_cast": "x * Reciprocal(Sqrt(...)) with Casts around it (fp16 upcast around the norm)",
    "square_mul": "ReduceMean(x * x) (Mul instead of Pow)",
    "pow_rsqrt_pow": "x * Pow(ReduceMean(Pow(x, 2)) + eps, -0.5)",
}


@rule("OGF004", "rmsnorm-not-fused", Severity.WARNING, price=RepairKind.rmsnorm, fix=FixKind.rmsnorm)
def rmsnorm_not_fused(ctx: RuleContext):
    """An RMSNorm is computed with Pow/ReduceMean/Add/Sqrt/Div or Reciprocal/Mul instead of SimplifiedLayerNormalization.

    ## What it checks
    Every RMSNorm chain in the executed graph: `Pow(x, 2)` or `x * x` -> `ReduceMean` -> `Add(eps)` -> `Sqrt` ->
    `Div(x, .)` or `Reciprocal` + `Mul` (or `Pow(., -0.5)`) -> `Mul(gamma)`, with or without the Casts fp16
    models put around it, hidden-state norms and per-head q_norm/k_norm alike (a per-head norm is fine once it
    is a SimplifiedLayerNormalization). One finding per decoder layer, one for the final norm.

    With an optimized dump (`--optimized`) the dump is judged: what is still decomposed there runs so. Without
    one, the exported model is judged and the finding says whether ORT's SimplifiedLayerNormFusion
    (ORT_ENABLE_EXTENDED, CPU/CUDA/ROCm) rewrites that form for the deployment's provider and level
    (ortgate/knowledge/ort_fusions.json): it matches only `Div(x, Sqrt(...))`, never the `Reciprocal` form
    torch.onnx writes for `torch.rsqrt`, never `x * x`, and a Cast between Div and the scale only on GPUs.
    A layer whose norms ORT is expected to fuse at session creation is rmsnorm-fused-by-ort's information.

    ## Why it costs throughput
    A decomposed RMSNorm is 6-8 elementwise and reduction kernels, each reading and writing the whole hidden
    state; a 48-layer Qwen3 model runs 2 hidden-state norms and 2 q/k norms per layer plus the final norm,
    193 per token. SimplifiedLayerNormalization is one kernel with one read
    and one write, computed in fp32 internally.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    rmsnorm (float[T, 64] x) => (float[T, 64] y)
    <float two = {2.0}, int64[1] axes = {-1}, float eps = {0.000001}, float[64] gamma>
    {
      sq = Pow(x, two)
      ms = ReduceMean<keepdims = 1>(sq, axes)
      mse = Add(ms, eps)
      rms = Sqrt(mse)
      inv = Reciprocal(rms)
      normed = Mul(x, inv)
      y = Mul(gamma, normed)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    rmsnorm (float[T, 64] x) => (float[T, 64] y)
    <float[64] gamma>
    {
      y = SimplifiedLayerNormalization<axis = -1, epsilon = 0.000001, stash_type = 1>(x, gamma)
    }
    ```

    ## Fix
    Run `ortgate fix MODEL -o OUT`: onnxscript's RMSNorm fusion rewrites the forms it matches into
    SimplifiedLayerNormalization and the report says per layer what it left. Or export RMSNorm as
    SimplifiedLayerNormalization (onnxruntime-genai's builder does, for the families it builds), or at least write
    the `Div` form ORT fuses.
    """
    for group in rmsnorm_groups(ctx):
        if not group.ort_fuses:
            yield _rmsnorm_finding(ctx, group)


@dataclass(frozen=True)
class RmsnormGroup:
    """The decomposed RMSNorms of one layer, and whether ORT's SimplifiedLayerNormFusion rewrites them all."""

    graph: Graph
    layer: int | None
    norms: list
    ort_fuses: bool
    why: str


def rmsnorm_groups(ctx: RuleContext) -> list[RmsnormGroup]:
    graph, is_dump = judged_graph(ctx)
    tgt = target(ctx)
    out = []
    for (_, layer), group in by_layer(decomposed_rmsnorms(graph), lambda m: m.last, lambda m: m.layer):
        forms = sorted({m.form for m in group})
        repaired = not is_dump and all(rmsnorm_form_fused(m.form, tgt.provider, tgt.level) and not m.centred
                                       for m in group)
        if any(m.centred for m in group):
            why = ("a LayerNorm's fusion is LayerNormalization (no bias), not SimplifiedLayerNormalization; ORT's "
                   "SimplifiedLayerNormFusion does not take the mean subtraction, and no recorded ORT pass fuses this form")
        elif is_dump:
            why = f"still decomposed in ORT's optimized dump (ORT fused nothing here: form {', '.join(forms)})"
        else:
            fused_elsewhere = set.intersection(*(set(rmsnorm_form_providers(m.form)) for m in group))
            why = ort_pass_note("SimplifiedLayerNormFusion", tgt, repaired, fused_elsewhere)
        out.append(RmsnormGroup(graph, layer, group, repaired, why))
    return out


# (role, what the normalised value feeds) -> how a finding names such norms
_NORM_ROLE_TEXT = {
    ("head", "attention"): "{n} per-head q/k",
    ("head", "projection"): "{n} per-head, feeding a projection (not q/k)",
    ("head", "other"): "{n} per-head, feeding no attention (an output or gated norm, not q/k)",
    ("projection", "attention"): "{n} over a projection's whole output feeding attention (q/k), not per-head",
    ("projection", "projection"): "{n} over a projection's whole output feeding another projection (a low-rank "
                                  "latent: MLA's q/kv latent, a state-space mixer's dt)",
    ("projection", "other"): "{n} over a projection's whole output feeding neither attention nor a projection "
                             "(e.g. a state-space mixer's B/C)",
}
_ROLE_ORDER = {kind: i for i, kind in enumerate(_NORM_ROLE_TEXT)}


def _rmsnorm_finding(ctx: RuleContext, found: RmsnormGroup):
    """The one message of rmsnorm-not-fused and rmsnorm-fused-by-ort."""
    group = found.norms
    heads = sum(1 for m in group if m.head_norm)
    counts = {role: sum(1 for m in group if m.role == role) for role in ("hidden", "head", "projection")}
    kinds = Counter((m.role, m.feeds) for m in group if m.role != "hidden")
    roles = [f"{counts['hidden']} hidden-state"] if counts["hidden"] else []
    roles += [_NORM_ROLE_TEXT[kind].format(n=n) for kind, n in sorted(kinds.items(), key=lambda kv: _ROLE_ORDER[kv[0]])]
    forms = sorted({m.form for m in group})
    chain = " -> ".join(n.op_type for n in group[0].nodes)
    what = "; ".join(_FORM_TEXT.get(f, f) for f in forms)
    centred = sum(1 for m in group if m.centred)
    rms = len(group) - centred
    names = [f"{rms} RMSNorm{'s' if rms != 1 else ''}"] if rms else []
    names += [f"{centred} LayerNorm{'s' if centred != 1 else ''} without bias (x - mean(x), then the RMS chain)"] \
        if centred else []
    instead = " and ".join(n for n, on in (("SimplifiedLayerNormalization", rms), ("LayerNormalization", centred))
                           if on)
    return ctx.finding(
        f"{' and '.join(names)} {layer_text(found.layer)} computed with standard ops "
        f"({', '.join(roles)}): {chain} [{what}] instead of {instead}; {found.why}",
        node=group[0].last, graph=found.graph, layer=found.layer,
        related=[n for m in group for n in m.nodes], fix=rmsnorm_fix(ctx),
        properties={"norms": len(group), "head_norms": heads, "hidden_norms": counts["hidden"],
                    "per_head_norms": counts["head"], "projection_norms": counts["projection"],
                    "forms": ",".join(forms), "ort_fuses": found.ort_fuses, "layer_norms": centred},
    )


@rule("OGF010", "rmsnorm-fused-by-ort", Severity.INFO)
def rmsnorm_fused_by_ort(ctx: RuleContext):
    """A decomposed RMSNorm that ORT's SimplifiedLayerNormFusion is expected to fuse at session creation.

    ## What it checks
    What rmsnorm-not-fused checks, on the exported model (no optimized dump given), for the layers whose every
    decomposed RMSNorm has the form ORT's SimplifiedLayerNormFusion matches for the deployment's provider at its
    optimization level (ortgate/knowledge/ort_fusions.json): `Pow -> ReduceMean -> Add -> Sqrt -> Div(x, .) ->
    Mul`, with a Cast before the scale only on GPU providers.

    ## Why it costs throughput
    If ORT fuses it as expected, nothing: the session runs one SimplifiedLayerNormalization per norm. The
    expectation is the pass's documented match, not an observation; an optimized dump (`--optimized`) confirms it.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    rmsnorm (float[T, 64] x) => (float[T, 64] y)
    <float two = {2.0}, int64[1] axes = {-1}, float eps = {0.000001}, float[64] gamma>
    {
      sq = Pow(x, two)
      ms = ReduceMean<keepdims = 1>(sq, axes)
      mse = Add(ms, eps)
      rms = Sqrt(mse)
      normed = Div(x, rms)
      y = Mul(gamma, normed)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    rmsnorm (float[T, 64] x) => (float[T, 64] y)
    <float[64] gamma>
    {
      y = SimplifiedLayerNormalization<axis = -1, epsilon = 0.000001, stash_type = 1>(x, gamma)
    }
    ```

    ## Fix
    Nothing is required; export SimplifiedLayerNormalization to stop depending on the pass, and lint the
    optimized dump to confirm.
    """
    for group in rmsnorm_groups(ctx):
        if group.ort_fuses:
            yield _rmsnorm_finding(ctx, group)


@rule("OGF005", "skip-rmsnorm-not-fused", Severity.WARNING, price=RepairKind.skip_rmsnorm, fix=FixKind.rmsnorm)
def skip_rmsnorm_not_fused(ctx: RuleContext):
    """A residual Add feeds an RMSNorm instead of one com.microsoft SkipSimplifiedLayerNormalization.

    ## What it checks
    Every residual addition (an `Add` of two computed tensors: the residual stream and an attention or MLP/MoE
    output) whose result goes into an RMSNorm, fused (`SimplifiedLayerNormalization`, ONNX `RMSNormalization`)
    or decomposed, in the executed graph (the optimized dump when given). Per-head q_norm/k_norm never follow a
    residual Add and are not concerned; the first norm of the model reads the embedding and has no Add to fuse.
    One finding per decoder layer, one for the final norm.

    ## Why it costs throughput
    The separate Add writes the new residual to memory and the norm reads it back: one more kernel and a
    full read and write of the hidden state, twice per layer. SkipSimplifiedLayerNormalization adds, normalises
    and returns the sum (output 3) in one pass. ORT cannot repair it: its SkipLayerNormFusion only fuses
    Add + LayerNormalization and never produces SkipSimplifiedLayerNormalization.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    block (float[T, 64] residual, float[T, 64] x) => (float[T, 64] y, float[T, 64] h)
    <float[64, 64] w_o, float[64] gamma>
    {
      attn_out = MatMul(x, w_o)
      h = Add(residual, attn_out)
      y = SimplifiedLayerNormalization<axis = -1, epsilon = 0.000001>(h, gamma)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    block (float[T, 64] residual, float[T, 64] x) => (float[T, 64] y, float[T, 64] h)
    <float[64, 64] w_o, float[64] gamma>
    {
      attn_out = MatMul(x, w_o)
      y, mean, inv_std, h = com.microsoft.SkipSimplifiedLayerNormalization<epsilon = 0.000001>(attn_out, residual, gamma)
    }
    ```

    ## Fix
    Run `ortgate fix MODEL -o OUT`: onnxscript's SkipRMSNorm fusion rewrites the residual adds it matches. Or export
    them as SkipSimplifiedLayerNormalization (onnxruntime-genai's builder does for every norm after the first,
    including the final norm, for the families it builds). Set `epsilon` explicitly: its default is 1e-12.
    """
    graph, is_dump = judged_graph(ctx)
    where = " in ORT's optimized dump" if is_dump else ""
    found = residual_norms(graph)
    for (_, layer), group in by_layer(found, lambda r: r.norm, lambda r: r.layer):
        fused = [r for r in group if r.decomposed is None]
        kinds = []
        if fused:
            kinds.append(" / ".join(sorted({r.norm.op_type for r in fused})))
        if len(group) - len(fused):
            kinds.append("decomposed RMSNorm")
        pairs = ", ".join(f"{r.add.display_name} -> {r.norm.display_name}" for r in group)
        yield ctx.finding(
            f"{len(group)} residual Add{'s' if len(group) > 1 else ''} {layer_text(layer)} feed{'' if len(group) > 1 else 's'} "
            f"{' and '.join(kinds)} ({pairs}){where} instead of one com.microsoft SkipSimplifiedLayerNormalization; "
            f"ORT's optimizer never builds SkipSimplifiedLayerNormalization (ORT {fusions_version()})",
            node=group[0].norm, graph=graph, layer=layer,
            related=[r.add for r in group] + [r.norm for r in group[1:]], fix=rmsnorm_fix(ctx),
            properties={"residual_adds": len(group)},
        )


def expected_epsilon(ctx: RuleContext) -> tuple[float | None, str]:
    """The model's RMSNorm epsilon and where it comes from: the policy's rms_norm_eps, else the family default."""
    declared = ctx.expect.declared("rms_norm_eps")
    if declared is not None and isinstance(declared.value, (int, float)):
        return float(declared.value), f"{declared.describe()} (model.rms_norm_eps)"
    family = resolved_family(ctx)
    if family is not None and family.rms_norm_eps is not None:
        return float(family.rms_norm_eps), f"the {family.name} family uses {family.rms_norm_eps:g} ({family.source('rms_norm_eps')})"
    return None, ""


def resolved_family(ctx: RuleContext) -> ModelFamily | None:
    expected = ctx.expect.family
    return model_family(expected.value) if expected is not None else None


def close(a: float, b: float) -> bool:
    """Equal within 0.1% (attribute floats round-trip through float32)."""
    return abs(a - b) <= 1e-3 * max(abs(a), abs(b), 1e-9)


@rule("OGM003", "norm-epsilon-default", Severity.WARNING)
def norm_epsilon_default(ctx: RuleContext):
    """A fused norm has no epsilon attribute (ORT then uses its own default), or an epsilon the model family does not use.

    ## What it checks
    The RMSNorm nodes of the exported model: com.microsoft `SkipSimplifiedLayerNormalization` (epsilon default
    1e-12 when absent), `SimplifiedLayerNormalization` and ONNX `RMSNormalization` (default 1e-5),
    com.microsoft `GatedRMSNorm` (1e-5), and the `Add(eps)` of decomposed RMSNorms. Defaults are ORT's
    (ortgate/knowledge/ort_fusions.json). The expected epsilon is the policy's `model.rms_norm_eps`, else the
    model family's (ortgate/knowledge/model_families.json: 1e-6 for Qwen3-MoE and Qwen3.5-MoE, 1e-5 for GPT-OSS
    and Mixtral). A missing epsilon is reported when ORT's default differs from it (with no family known, a
    SkipSimplifiedLayerNormalization without epsilon is still reported: no model uses 1e-12); an explicit epsilon
    is reported when it differs. Decomposed norms are compared per role (hidden-state, per-head q/k, latent, ...):
    where some norms of a role have the expected epsilon, the others' own epsilon is the model's arithmetic (a
    model may use several) and is not reported. One finding per op and value.

    ## Why it costs throughput
    It costs correctness, which a gate that trades graphs for speed must guard: with epsilon 1e-12 instead of
    1e-6 every norm divides by a slightly different RMS, small-norm tokens are amplified, fp16 activations can
    overflow, and the logits drift from the reference model. Throughput comparisons between two exports are
    meaningless when they do not compute the same model.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    block (float16[T, 64] x, float16[T, 64] residual) => (float16[T, 64] y, float16[T, 64] h)
    <float16[64] gamma>
    {
      y, mean, inv_std, h = com.microsoft.SkipSimplifiedLayerNormalization(x, residual, gamma)   # epsilon 1e-12
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    block (float16[T, 64] x, float16[T, 64] residual) => (float16[T, 64] y, float16[T, 64] h)
    <float16[64] gamma>
    {
      y, mean, inv_std, h = com.microsoft.SkipSimplifiedLayerNormalization<epsilon = 0.000001>(x, residual, gamma)
    }
    ```

    ## Fix
    Write `epsilon` on every norm node with the model's `rms_norm_eps` (config.json). onnxruntime-genai's builder
    does; a hand-written or rewritten graph often forgets it. If the policy's `model.rms_norm_eps` is wrong,
    correct the policy.
    """
    graph = ctx.model
    expected, source = expected_epsilon(ctx)
    against = f", but {source}" if expected is not None else \
        ", far below the 1e-6 .. 1e-5 RMSNorm epsilons of the model families ortgate knows"
    for (what, absent, value), nodes in epsilon_groups(graph, expected).items():
        where = f" ({layers_text(nodes)})" if any(n.layer is not None for n in nodes) else ""
        how = (f"without an epsilon attribute: ORT {fusions_version()} uses its default {value:g}" if absent
               else f"with epsilon={value:g}")
        yield ctx.finding(
            f"{len(nodes)} {what}{'s' if len(nodes) > 1 else ''}{where} {how}{against}",
            node=nodes[0], graph=graph, related=nodes[1:],
            fix=f"Set epsilon={expected:g} on every {what} (re-export with rms_norm_eps={expected:g}), or correct the "
                "policy's model.rms_norm_eps." if expected is not None
            else f"Set epsilon to the model's rms_norm_eps on every {what}.",
            properties={"epsilon": value, "expected": expected, "absent": absent, "nodes": len(nodes)},
        )


def epsilon_groups(graph: Graph, expected: float | None) -> dict[tuple[str, bool, float], list[Node]]:
    """(what, epsilon absent, epsilon as ORT uses it) -> the RMSNorm nodes whose epsilon is not `expected`: fused
    norms by op ("com.microsoft.SkipSimplifiedLayerNormalization node"), decomposed ones by their Add's constant.
    With nothing expected, only a SkipSimplifiedLayerNormalization without epsilon (1e-12: no model uses it)."""
    groups: dict[tuple[str, bool, float], list[Node]] = {}
    for domain, op_type in EPSILON_NORM_OPS:
        if op_type in ("LayerNormalization", "SkipLayerNormalization"):
            continue  # LayerNorm, not RMSNorm: its epsilon is not rms_norm_eps
        for node in graph.by_op(domain, op_type):
            value = node.attr("epsilon")
            absent = value is None
            if absent:
                value = attribute_default(node.domain, node.op_type, "epsilon")
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            wrong = (not close(float(value), expected) if expected is not None
                     else absent and op_type == "SkipSimplifiedLayerNormalization")
            if wrong:
                groups.setdefault((f"{node.key} node", absent, float(value)), []).append(node)
    if expected is None:
        return groups
    # Compared per norm role: when some norms of a role have the expected epsilon, the others of that role with
    # their own (MiniMax's lightning-attention output norm: 1e-6 beside 1e-5) are the model's arithmetic, not an
    # export's mistake, and are never reported.
    by_role: dict[tuple[str, str], list] = {}
    for norm in decomposed_rmsnorms(graph):
        if norm.epsilon is not None:
            by_role.setdefault((norm.role, norm.feeds), []).append(norm)
    for norms in by_role.values():
        if any(close(n.epsilon, expected) for n in norms):
            continue
        for norm in norms:
            groups.setdefault(("decomposed RMSNorm", False, norm.epsilon), []).append(norm.last)
    return groups
