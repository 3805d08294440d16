"""Session rules (OGS): how the InferenceSession is configured (optimization level, free dimensions, config entries)."""

from __future__ import annotations

import difflib
from collections import defaultdict
from dataclasses import dataclass

from ortgate.config.deployment import Setting, config_text
from ortgate.findings import Severity
from ortgate.graph.index import Graph
from ortgate.knowledge import (
    cpu_fallback_facts,
    default_optimization_level,
    is_known_session_config_key,
    optimization_level_skips,
    ort_facts,
    suggest_session_config_key,
)
from ortgate.knowledge.dims import dim_kind, dim_role
from ortgate.knowledge.provider_names import CPU, CUDA
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, judged_setups
from ortgate.rules.provider import cuda_graph_enabled


@rule("OGS001", "optimization-level-not-all", Severity.ERROR, needs=("session",))
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
    for setup in judged_setups(ctx, lambda s: s.optimization_level.value if s.optimization_level else None):
        level = setup.optimization_level
        if level is None or level.value == "ORT_ENABLE_ALL":
            continue
        effect = optimization_level_skips(level.value) or "fewer optimizations"
        default = " (ORT's default)" if default_optimization_level() == "ORT_ENABLE_ALL" else ""
        yield ctx.finding(
            f"{setup.label}: graph_optimization_level is {level.value} ({effect})",
            location=level.location,
            fix=f"Set graph_optimization_level to ORT_ENABLE_ALL{default}.",
            properties={"level": level.value},
        )


def is_static_buffer_dim(name: str) -> bool:
    """A past-length dim that a static KV buffer (past_present_share_buffer) fixes at search.max_length.

    Total length (the attention mask) is not one of them, nor the sliding-window caches, whose length follows
    the window rather than max_length.
    """
    return dim_role(name) == "past"


def symbolic_input_dims(graph: Graph) -> dict[str, list[str]]:
    """Symbolic dim name -> the inputs ("input_ids[0]") that use it."""
    dims: dict[str, list[str]] = defaultdict(list)
    for info in graph.inputs:
        for axis, dim in enumerate(info.shape or ()):
            if isinstance(dim, str) and dim:
                dims[dim].append(f"{info.name}[{axis}]")
    return dict(dims)


def unpinned_step_dims(ctx: RuleContext) -> list[tuple[str, str, list[str]]]:
    """(dim, "batch" | "query", inputs using it) for every symbolic step dim of the model's inputs that the
    policy's session does not pin."""
    setup = ctx.deployment.policy_setup
    if setup is None:
        return []
    out: list[tuple[str, str, list[str]]] = []
    for name, uses in sorted(symbolic_input_dims(ctx.model).items()):
        kind = dim_kind(name)
        if name not in setup.free_dimension_overrides and kind in ("batch", "query"):
            out.append((name, kind, uses))
    return out


def _step_dim_finding(ctx: RuleContext, name: str, kind: str, uses: list[str], consequence: str):
    """The one message of free-dim-override-missing and capture-dim-not-pinned."""
    setup = ctx.deployment.policy_setup
    assert setup is not None  # step dims are unpinned only in a policy's session (unpinned_step_dims)
    what = "batch" if kind == "batch" else "query-length"
    return ctx.finding(
        f"{what} dim {name!r} ({', '.join(uses[:3])}{', ...' if len(uses) > 3 else ''}) has no free-dimension "
        f"override{consequence}",
        location=setup.missing(f"session.free_dimension_overrides.{name}"),
        fix=f"Add `{name}: <value>` under session.free_dimension_overrides "
            f"(so.add_free_dimension_override_by_name({name!r}, value)); 1 for single-sequence decode.",
        properties={"dim": name, "kind": kind},
    )


@rule("OGS002", "free-dim-override-missing", Severity.WARNING, needs=("session", "policy"))
def free_dim_override_missing(ctx: RuleContext):
    """A symbolic batch or sequence dim of a graph input has no free-dimension override.

    ## What it checks
    The policy's `session.free_dimension_overrides` against the symbolic dims of the model's inputs. For a
    decode deployment the dims of the current step — batch (`batch_size`) and query length
    (`sequence_length`) — should be pinned. KV-cache dims (`past_sequence_length`, `total_sequence_length`)
    grow every step and are not reported here (static-kv-dim-not-pinned covers a static KV buffer); sizes such
    as `kv_cache_dim` (the head size) are not lengths. With CUDA graph capture on, an unpinned step dim is
    capture-dim-not-pinned's error instead.

    ## Why it costs throughput
    With a dim pinned, ORT resolves shapes at session creation: shape-computing subgraphs fold away,
    memory planning becomes static and kernels can be selected for the real shape.

    ## Bad
    ```yaml
    session: {graph_optimization_level: ORT_ENABLE_ALL}   # input_ids: [batch_size, sequence_length]
    ```

    ## Good
    ```yaml
    session:
      graph_optimization_level: ORT_ENABLE_ALL
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ## Fix
    `so.add_free_dimension_override_by_name("batch_size", 1)` and `("sequence_length", 1)` — one int per dim
    (ORT takes no ranges), under `session.free_dimension_overrides` in the policy. Pin
    `past_sequence_length` only with a static KV buffer, to its length (see free-dim-override-conflict).
    """
    setup = ctx.deployment.policy_setup
    if setup is None or cuda_graph_enabled(setup):
        return
    for name, kind, uses in unpinned_step_dims(ctx):
        yield _step_dim_finding(ctx, name, kind, uses, "")


@rule("OGS008", "capture-dim-not-pinned", Severity.ERROR, needs=("session", "policy"))
def capture_dim_not_pinned(ctx: RuleContext):
    """CUDA graph capture is on, but a symbolic batch or sequence dim of a graph input has no free-dimension override.

    ## What it checks
    With `enable_cuda_graph` on in the policy: the policy's `session.free_dimension_overrides` against the
    symbolic step dims of the model's inputs, batch (`batch_size`) and query length (`sequence_length`), as
    free-dim-override-missing does without capture.

    ## Why it costs throughput
    A captured CUDA graph replays the shapes of its capture: ORT's CUDA provider requires every run to feed the
    shapes it captured with. A step dim left free is a promise nothing keeps, and a run with another batch or
    length breaks the replay, so the deployment ends up without CUDA graph, or failing.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    session: {}            # input_ids: [batch_size, sequence_length]
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ## Fix
    Pin batch and query length under `session.free_dimension_overrides` to the sizes the captured graph runs
    (1 and 1 for single-sequence decode); one session (or `gpu_graph_id`) per batch size.
    """
    setup = ctx.deployment.policy_setup
    if setup is None or not cuda_graph_enabled(setup):
        return
    for name, kind, uses in unpinned_step_dims(ctx):
        yield _step_dim_finding(ctx, name, kind, uses, ": CUDA graph capture needs fixed shapes")


@rule("OGS009", "static-kv-dim-not-pinned", Severity.INFO, needs=("session", "policy", "genai_config"))
def static_kv_dim_not_pinned(ctx: RuleContext):
    """A KV-cache dim is not pinned although genai_config.json declares a static KV buffer that fixes its length.

    ## What it checks
    With genai_config.json's `past_present_share_buffer: true`, the model's symbolic `past_*` input dims (not
    `total_sequence_length`, not sliding-window caches, whose lengths do not follow the buffer) against the
    policy's `session.free_dimension_overrides`. The buffer is allocated at `search.max_length`, so the dim is
    fixed in fact and can be pinned.

    ## Why it costs throughput
    A pinned past length lets ORT plan memory and fold shape arithmetic for the real shape, and is what lets a
    CUDA graph capture the decode step with the shared buffer. Without the pin the session still works: this is
    information about a free win.

    ## Bad
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ```json
    {"model": {"decoder": {}}, "search": {"past_present_share_buffer": true, "max_length": 4096}}
    ```

    ## Good
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1, past_sequence_length: 4096}
    ```

    ```json
    {"model": {"decoder": {}}, "search": {"past_present_share_buffer": true, "max_length": 4096}}
    ```

    ## Fix
    Pin the dim to genai_config.json's `search.max_length` under `session.free_dimension_overrides`.
    """
    setup = ctx.deployment.policy_setup
    genai = ctx.inputs.genai
    if setup is None or genai is None or not genai.past_present_share_buffer:
        return
    for name in sorted(symbolic_input_dims(ctx.model)):
        if name in setup.free_dimension_overrides or dim_kind(name) != "kv" or not is_static_buffer_dim(name):
            continue
        yield ctx.finding(
            f"KV-cache dim {name!r} is not pinned although genai_config.json declares a static KV buffer "
            "(past_present_share_buffer): pin it to the buffer length",
            location=setup.missing(f"session.free_dimension_overrides.{name}"),
            fix=f"Add `{name}: {genai.max_length or '<search.max_length>'}` under session.free_dimension_overrides.",
            properties={"dim": name, "kind": "kv"},
        )


def _input_dim_kinds(graph: Graph) -> dict[str, str]:
    return {name: dim_kind(name) for name in symbolic_input_dims(graph)}


def nearest_dim(name: str, dims: list[str]) -> str | None:
    """The input dim an override most likely meant: a close name of the same kind (batch/query/kv) first."""
    kind = dim_kind(name)
    same_kind = [d for d in dims if dim_kind(d) == kind]
    for pool, cutoff in ((same_kind, 0.4), (dims, 0.6)):
        hit = difflib.get_close_matches(name, pool, n=1, cutoff=cutoff)
        if hit:
            return hit[0]
    return same_kind[0] if len(same_kind) == 1 else None


def _output_only_dims(graph: Graph) -> set[str]:
    return {d for info in graph.outputs for d in (info.shape or ()) if isinstance(d, str) and d}


@rule("OGS003", "free-dim-override-unknown", Severity.ERROR, needs=("session", "policy"))
def free_dim_override_unknown(ctx: RuleContext):
    """A free-dimension override names a dim that no graph input has: ORT ignores it without a word.

    ## What it checks
    Every name under the policy's `session.free_dimension_overrides` against the symbolic dims of the model's
    graph inputs (not outputs, not intermediate values: ORT applies overrides to inputs only), with the nearest
    real dim as a suggestion (a dim of the same kind — batch, query length, KV cache — first).

    ## Why it costs throughput
    `add_free_dimension_override_by_name` accepts any name; a name no input uses does nothing. The dim the
    override was meant for stays dynamic: no static shapes, no folded shape subgraphs, no CUDA graph with
    fixed shapes, and nothing reports it. The seed's `seq_len` is such a name: exporters call the dim
    `sequence_length`.

    ## Bad
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, seq_len: 1}     # inputs: [batch_size, sequence_length]
    ```

    ## Good
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ## Fix
    Use the dim names of the model's inputs (`ortgate` lists them in the finding; Netron or
    `[i.shape for i in sess.get_inputs()]` shows them too).
    """
    setup = ctx.deployment.policy_setup
    if setup is None or not setup.free_dimension_overrides:
        return
    dims = sorted(symbolic_input_dims(ctx.model))
    output_dims = _output_only_dims(ctx.model)
    for name, setting in sorted(setup.free_dimension_overrides.items()):
        if name in dims:
            continue
        hint = nearest_dim(name, dims)
        where = " (it appears on graph outputs only: overrides apply to inputs)" if name in output_dims else ""
        known = ", ".join(dims) if dims else "none: every input dim is static"
        yield ctx.finding(
            f"free-dimension override {name!r} names no dim of a graph input{where}: ORT ignores it silently"
            f"{f'; did you mean {hint!r}?' if hint else ''} (input dims: {known})",
            location=setting.location,
            fix=(f"Rename the override to {hint!r}." if hint else "Remove the override or use an input dim name."),
            properties={"dim": name, "suggestion": hint, "input_dims": dims},
        )


def _is_range(value) -> bool:
    return isinstance(value, list)


def _pinned(setting) -> int | None:
    value = setting.value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class PinConflict:
    """A free-dimension pin that the decode loop's inputs cannot satisfy."""

    dim: str
    kind: str  # "batch" | "query" | "kv"
    value: int
    setting: Setting
    why: str
    fix: str
    properties: tuple[tuple[str, object], ...] = ()


def _pins(ctx: RuleContext) -> list[tuple[str, str, int, Setting]]:
    """(dim, kind, value, setting) for every integer pin of an input dim (names no input has, and ranges, are other
    rules')."""
    setup = ctx.deployment.policy_setup
    if setup is None:
        return []
    kinds = _input_dim_kinds(ctx.model)
    return [(name, kinds[name], value, setting) for name, setting in sorted(setup.free_dimension_overrides.items())
            if name in kinds and (value := _pinned(setting)) is not None]


def pin_conflicts(ctx: RuleContext) -> list[PinConflict]:
    genai = ctx.inputs.genai
    share_buffer = genai.past_present_share_buffer if genai is not None else None
    max_length = genai.max_length if genai is not None else None
    out = []
    pins = _pins(ctx)
    for name, kind, value, setting in pins:
        if kind != "kv":
            continue
        if share_buffer is not True:
            said = ("genai_config.json does not set past_present_share_buffer: true" if genai is not None
                    else "nothing declares a static KV buffer (no genai_config.json)")
            out.append(PinConflict(
                name, kind, value, setting,
                f"{said}: the past grows by one token every decode step and ORT rejects inputs whose {name} is not "
                f"{value}",
                f"Remove the {name} override (pin batch_size and sequence_length only), or use a static KV buffer "
                "(past_present_share_buffer: true) and pin it to the buffer length.",
                (("static_kv_buffer", share_buffer),)))
        elif is_static_buffer_dim(name) and max_length is not None and value != max_length:
            out.append(PinConflict(
                name, kind, value, setting,
                f"the static KV buffer holds search.max_length = {max_length} tokens (past_present_share_buffer): "
                f"every fed past tensor has {max_length}",
                f"Pin {name} to {max_length}, or change search.max_length in genai_config.json.",
                (("max_length", max_length),)))
    for kind in ("batch", "query"):
        same_kind = [(name, value, setting) for name, k, value, setting in pins if k == kind]
        for name, value, setting in same_kind[1:]:
            first, first_value, _ = same_kind[0]
            if value != first_value:
                out.append(PinConflict(
                    name, kind, value, setting,
                    f"{first!r} is pinned to {first_value} and every run feeds one {kind} size to all inputs: no "
                    "input set satisfies both",
                    f"Pin {name} and {first} to the same value.", (("conflicts_with", first),)))
    return out


def _conflict_finding(ctx: RuleContext, conflict: PinConflict):
    """The one message of free-dim-override-conflict and kv-dim-pinned."""
    what = {"kv": "KV-cache dim", "batch": "batch dim", "query": "query-length dim"}[conflict.kind]
    return ctx.finding(
        f"{what} {conflict.dim!r} is pinned to {conflict.value}, but {conflict.why}",
        location=conflict.setting.location, fix=conflict.fix,
        properties={"dim": conflict.dim, "kind": conflict.kind, "value": conflict.value, **dict(conflict.properties)},
    )


@rule("OGS004", "free-dim-override-conflict", Severity.ERROR, needs=("session", "policy"))
def free_dim_override_conflict(ctx: RuleContext):
    """Free-dimension overrides that cannot all hold while the model decodes.

    ## What it checks
    What a conflict means in ORT terms: ORT checks every fed input against the pinned dims at each Run
    ("Got invalid dimensions for input ..."), so a pin must hold at every step of the deployment.
    - A KV-cache dim (`past_sequence_length`, `total_sequence_length`, `past_sliding_length`, ...) is pinned
      while genai_config.json does not declare a static KV buffer: the past grows by one token every step, so
      only one step could ever run. (Without a genai_config.json to say, it is kv-dim-pinned's warning.)
    - With a static KV buffer (`past_present_share_buffer: true`), a pinned `past_*` dim differs from
      `search.max_length`, the length onnxruntime-genai allocates the buffer with.
    - Two dims of one kind that every run feeds with the same size (two batch dims, or two query-length dims,
      both on inputs) are pinned to different values.

    Which dims to pin for decode: the dims of the current step — batch (`batch_size`) and query length
    (`sequence_length` = 1). `past_sequence_length` only with a static KV buffer, to its length; never
    `total_sequence_length` without one.

    ## Why it costs throughput
    A conflicting pin makes the session reject real inputs at run time (or never match them), so the
    deployment either fails or is rolled back to an unpinned config without static shapes and CUDA graph.

    ## Bad
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1, past_sequence_length: 1024}
    ```

    ```json
    {"model": {"decoder": {}}, "search": {"past_present_share_buffer": false, "max_length": 1024}}
    ```

    ## Good
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ```json
    {"model": {"decoder": {}}, "search": {"past_present_share_buffer": false, "max_length": 1024}}
    ```

    ## Fix
    Pin only the step dims; pin KV dims only with `past_present_share_buffer: true` in genai_config.json and
    to `search.max_length`; give dims of one kind the same value.
    """
    for conflict in pin_conflicts(ctx):
        if conflict.kind != "kv" or ctx.inputs.genai is not None:  # without genai_config.json: kv-dim-pinned's
            yield _conflict_finding(ctx, conflict)


@rule("OGS010", "kv-dim-pinned", Severity.WARNING, needs=("session", "policy"))
def kv_dim_pinned(ctx: RuleContext):
    """A KV-cache dim is pinned, and no genai_config.json says whether the KV buffer is static.

    ## What it checks
    The policy's `session.free_dimension_overrides` for KV-cache dims (`past_sequence_length`,
    `total_sequence_length`, `past_sliding_length`, ...) when no genai_config.json is given. Only a static KV
    buffer (onnxruntime-genai's `past_present_share_buffer: true`, or the serving code's own) keeps the past
    length fixed; with a genai_config.json the question is settled, and a conflict is free-dim-override-conflict's.

    ## Why it costs throughput
    Without a static buffer the past grows by one token every decode step, and ORT rejects every input whose
    pinned dim has another size: only one step could ever run. With one, the pin is right. ortgate cannot tell
    which without the config, so this is a warning.

    ## Bad
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1, past_sequence_length: 1024}
    ```

    ## Good
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ## Fix
    Remove the KV-cache pin, or lint with the genai_config.json that declares the static KV buffer (and pin it
    to `search.max_length`).
    """
    if ctx.inputs.genai is not None:
        return
    for conflict in pin_conflicts(ctx):
        if conflict.kind == "kv":
            yield _conflict_finding(ctx, conflict)


@rule("OGS005", "free-dim-override-range", Severity.ERROR, needs=("session", "policy"), policy_only=True)
def free_dim_override_range(ctx: RuleContext):
    """A free-dimension override is a range: ORT pins a dim to one integer and has no ranges.

    ## What it checks
    Values under the policy's `session.free_dimension_overrides` that are lists, such as the seed's
    `add_free_dimension_override_by_name("batch_size", 1, 128)` written as `batch_size: [1, 128]`.

    ## Why it costs throughput
    `SessionOptions.add_free_dimension_override_by_name(name, value)` takes ONE int: a call with a range raises
    TypeError, so the code path that was meant to "specialise kernels for 1..128" never configures anything.
    A pinned dim is a promise that every run has exactly that size; there is no "bounded dynamic" dim in ORT's
    CUDA provider.

    ## Bad
    ```yaml
    session:
      free_dimension_overrides: {batch_size: [1, 128], sequence_length: [1, 32768]}
    ```

    ## Good
    ```yaml
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}    # decode at batch 1
    ```

    ## Fix
    Pin each dim to the size the deployment runs (decode: `sequence_length: 1`; the batch the server forms).
    Serving several batch sizes means one session (or one CUDA graph, `gpu_graph_id`) per size, or leaving the
    dim free. TensorRT is the one provider that takes shape ranges: `trt_profile_min_shapes` /
    `trt_profile_opt_shapes` / `trt_profile_max_shapes`.
    """
    setup = ctx.deployment.policy_setup
    if setup is None:
        return
    for name, setting in sorted(setup.free_dimension_overrides.items()):
        if not _is_range(setting.value):
            continue
        values = list(setting.value)
        args = ", ".join(str(v) for v in values)
        kind = dim_kind(name)
        pin = 1 if kind == "query" else min(values)
        yield ctx.finding(
            f"free-dimension override {name!r} is a range {values}: ORT pins a dim to ONE int "
            f"(so.add_free_dimension_override_by_name({name!r}, {args}) raises TypeError), so nothing is pinned",
            location=setting.location,
            fix=f"Pin {name} to the one size every run has (e.g. `{name}: {pin}`), or leave it free; for TensorRT "
                "give shape ranges with trt_profile_min_shapes / trt_profile_opt_shapes / trt_profile_max_shapes.",
            properties={"dim": name, "values": values, "kind": kind},
        )


@rule("OGS006", "cpu-fallback-allowed", Severity.WARNING, needs=("provider",))
def cpu_fallback_allowed(ctx: RuleContext):
    """A GPU session lets nodes fall back to CPU silently: session.disable_cpu_ep_fallback is not "1".

    ## What it checks
    The session config entry `session.disable_cpu_ep_fallback` in the policy (`session.config_entries`) and in
    genai_config.json's session_options, for every provider other than CPUExecutionProvider. ORT honours the
    string "1" only. Not reported when the CUDA provider captures a CUDA graph: ORT then already refuses to
    create a session with compute nodes on CPU. A genai_config.json value that differs from the policy's is
    config-drift's finding.

    ## Why it costs throughput
    A node no registered provider has a kernel for runs on the CPU provider, which ORT adds implicitly, with
    Memcpy nodes around it; the only trace is a log warning. A model that ran at GPU speed yesterday can run
    far slower after an export change and every check stays green.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    session: {}
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    session:
      config_entries: {session.disable_cpu_ep_fallback: "1"}
    ```

    ## Fix
    Add `session.disable_cpu_ep_fallback: "1"` under `session.config_entries` (genai_config.json: in
    `session_options`). It is strict: ORT then also fails on shape-computation nodes that the CUDA provider
    keeps on CPU on purpose (Shape -> Gather -> Concat chains); pinning the step dims usually folds them away.
    Do not also list CPUExecutionProvider in the providers: ORT rejects that combination.
    """
    facts = cpu_fallback_facts()
    key, wanted = facts.config_key, facts.enabled_value
    for setup in judged_setups(ctx, lambda s: s.config_entry(key)):
        if setup.provider_name in (None, CPU):
            continue
        setting = setup.config_entries.get(key)
        value = config_text(setting.value) if setting is not None else None
        if value == wanted or (setup.provider_name == CUDA and cuda_graph_enabled(setup)):
            continue
        state = (f"is {value!r} (ORT honours only \"1\")" if setting is not None else "is not set")
        yield ctx.finding(
            f"{setup.label}: {key} {state}: a node without a {setup.provider_name} kernel runs on CPU with copies "
            "around it, with only a log warning",
            location=setting.location if setting is not None else setup.missing(_config_path(setup, key)),
            fix=f'Set {key}: "1" in the session config entries.',
            properties={"provider": setup.provider_name, "key": key, "value": value},
        )


def _config_path(setup, key: str) -> str:
    if setup.origin == "policy":
        return f"session.config_entries.{key}"
    return f"model.decoder.session_options.{key}"


@rule("OGS007", "unknown-session-config-key", Severity.WARNING, needs=("session",), policy_only=True)
def unknown_session_config_key(ctx: RuleContext):
    """A session config entry key ORT does not know: it is stored and never read.

    ## What it checks
    Keys under the policy's `session.config_entries` and the config entries of genai_config.json's
    session_options (every key genai does not map to a SessionOptions field), against the keys ORT defines
    (onnxruntime_session_options_config_keys.h and the strings of the 1.31.1 binary) and the provider-scoped
    `ep.<provider>.<option>` form, with the nearest known key as a suggestion. Keys a later release introduced
    (`session.moe.offload.*` of 1.32, knowledge/deployment_facts.json) are named with that release, and pass when
    the policy's `execution_provider.onnxruntime_version` is that release or later.

    ## Why it costs throughput
    `add_session_config_entry` accepts any key and ORT never reports unused ones: a misspelt
    `session.disable_cpu_ep_falback` leaves CPU fallback on, a misspelt optimizer switch leaves the optimizer
    as it was, and the config looks right in review.

    ## Bad
    ```yaml
    session:
      config_entries: {session.disable_cpu_fallback: "1"}
    ```

    ## Good
    ```yaml
    session:
      config_entries: {session.disable_cpu_ep_fallback: "1"}
    ```

    ## Fix
    Use the key as ORT spells it (the finding suggests the nearest one). Keys ortgate does not know but your
    ORT build does: waive the finding with the build's version in the reason.
    """
    from ortgate.knowledge.deployment_facts import at_least, session_key_added

    ort = ctx.deployment.ort
    declared = ort.version if ort.pinned else None
    for setup in ctx.deployment.setups:
        for key, setting in sorted(setup.config_entries.items()):
            if is_known_session_config_key(key):
                continue
            added = session_key_added(key)
            if added is not None:
                if at_least(ort.judged_as, added.since):
                    continue  # the declared release reads it
                yield ctx.finding(
                    f"{setup.label}: session config key {key!r} was added in ONNX Runtime {added.since} "
                    f"({added.source}); ORT {ort_facts().ort_version} and the releases before {added.since} store "
                    "it and never read it" + (f" (the policy declares {declared})" if declared else ""),
                    location=setting.location,
                    fix=f"Run ONNX Runtime {added.since} or later (and declare it in "
                        "execution_provider.onnxruntime_version), or remove the key.",
                    properties={"key": key, "added_in": added.since},
                )
                continue
            hint = suggest_session_config_key(key)
            yield ctx.finding(
                f"{setup.label}: session config key {key!r} is unknown to ORT {ort_facts().ort_version}"
                f"{f' (did you mean {hint!r}?)' if hint else ''}: ORT stores it and never reads it",
                location=setting.location,
                fix=(f"Rename it to {hint!r}." if hint
                     else "Remove it, or waive the finding if your ORT build reads it."),
                properties={"key": key, "suggestion": hint},
            )
