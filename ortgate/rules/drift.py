"""Drift rules (OGC): two declarations of one deployment that disagree.

The policy says how the session should be built (and is what `ortgate run` builds); onnxruntime-genai builds its
session from genai_config.json. When both are given, every setting the policy declares must hold in
genai_config.json too, or production does not run what CI checked.
"""

from __future__ import annotations

from typing import Any

from ortgate.config.deployment import ORT_DEFAULT_OPTIMIZATION_LEVEL, SessionSetup, Setting, config_text
from ortgate.findings import Finding, Kind, Location, Severity
from ortgate.knowledge import is_known_session_config_key, provider_catalog, session_config_key
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext

_BOOL_TEXT = {"1": True, "true": True, "0": False, "false": False}


def _where(location: Location) -> str:
    return f"{location.file}:{location.line}" if location.line else location.file


def _option_value(provider: str, key: str, setting: Setting | None) -> tuple[Any, str]:
    """(comparable value, how to say it) of a provider option, the catalog default when unset."""
    catalog = provider_catalog(provider)
    option = catalog.option(key) if catalog else None
    if setting is None:
        if option is None:
            return None, "leaves it unset"
        text = option.default_string
        said = f"leaves it unset (default {text!r})"
    else:
        text = str(setting.value)
        said = f"has {text!r}"
    if option is not None and option.type == "bool" and text.strip().lower() in _BOOL_TEXT:
        return _BOOL_TEXT[text.strip().lower()], said
    return text.strip(), said


def _config_value(key: str, setting: Setting | None) -> tuple[Any, str]:
    if setting is None:
        info = session_config_key(key)
        default = info.default if info else None
        return default, (f"leaves it unset (default {default!r})" if default is not None else "leaves it unset")
    text = config_text(setting.value)
    return text, f"has {text!r}"


def _session_value(setting: Setting | None) -> tuple[Any, str]:
    if setting is None:
        return None, "leaves it unset (ORT's default)"
    value = setting.value
    if isinstance(value, str) and value.strip().lower() in _BOOL_TEXT:
        value = _BOOL_TEXT[value.strip().lower()]
    return value, f"has {setting.value!r}"


@rule("OGC001", "config-drift", Severity.ERROR, needs=("policy", "genai_config"))
def config_drift(ctx: RuleContext):
    """genai_config.json configures the session differently from the policy.

    ## What it checks
    When both a policy and genai_config.json are given, each setting the policy declares against what
    genai_config.json makes onnxruntime-genai do: the execution provider, every provider option the policy sets
    (booleans compared as ORT parses them, unset = the catalog's default), `graph_optimization_level` and the
    session config entries. The finding points at genai_config.json's line and names the policy's file and line.
    A key the provider or ORT does not have, or a value it cannot parse, on either side, is not compared: the
    rule that says so owns it (unknown-provider-option, provider-option-c-api-only, provider-option-unverified,
    provider-option-invalid-value, unknown-session-config-key), and copying it would spread it. The thread and
    memory options are session-option-drift's. The fix names the side to change: genai_config.json, unless the
    policy's value is one a session or provider rule rejects (optimization-level-not-all's ORT_ENABLE_BASIC,
    cuda-graph-disabled's `enable_cuda_graph: "0"`): then the policy, toward the value that rule asks for, and
    both files when genai_config.json's value is rejected too. Its `change` property says which.

    ## Why it costs throughput
    The policy is what CI checks (and what `ortgate run` measures); genai_config.json is what production runs.
    The genai builder writes `enable_cuda_graph: "0"` unless told otherwise, so a policy that requires CUDA
    graph can pass every check while production launches every kernel one by one.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```json
    {"model": {"decoder": {"session_options": {"provider_options": [{"cuda": {"enable_cuda_graph": "0"}}]}}}}
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}
    ```

    ```json
    {"model": {"decoder": {"session_options": {"provider_options": [{"cuda": {"enable_cuda_graph": "1"}}]}}}}
    ```

    ## Fix
    Make genai_config.json say what the policy says (rebuild with the genai builder's
    `--extra_options enable_cuda_graph=1`, or edit `model.decoder.session_options`), or change the policy if
    it is the one that is wrong; never copy a value another rule rejects from one file into the other.
    """
    policy, genai = ctx.deployment.policy_setup, ctx.deployment.genai_setup
    if policy is None or genai is None:
        return
    if policy.provider is not None and policy.provider_name != genai.provider_name:
        yield _drift(ctx, "execution provider", genai.provider, policy.provider, f"has {genai.provider_name!r}",
                     f"has {policy.provider_name!r}", genai,
                     fix=f"List {policy.provider_name} first in genai_config.json's provider_options.")
        return  # options of different providers are not comparable
    yield from _provider_option_drift(ctx, policy, genai)
    if policy.optimization_level is not None:
        want = policy.optimization_level.value
        have = genai.effective_optimization_level
        if want != have:
            said = (f"has {have!r}" if genai.optimization_level
                    else f"leaves it unset (default {ORT_DEFAULT_OPTIMIZATION_LEVEL!r})")
            yield _drift(ctx, "graph_optimization_level", genai.optimization_level, policy.optimization_level,
                         said, f"has {want!r}", genai, path="model.decoder.session_options.graph_optimization_level",
                         fix=f"Set \"graph_optimization_level\": \"{want}\" in genai_config.json's session_options.")
    for key, wanted in sorted(policy.config_entries.items()):
        found = genai.config_entries.get(key)
        if not is_known_session_config_key(key):
            continue  # unknown-session-config-key's: never advise copying a key ORT does not read
        want_value, want_said = _config_value(key, wanted)
        have_value, have_said = _config_value(key, found)
        if want_value != have_value:
            yield _drift(ctx, f"session config entry {key}", found, wanted, have_said, want_said, genai,
                         path=f"model.decoder.session_options.{key}",
                         fix=f"Add \"{key}\": \"{want_value}\" to genai_config.json's session_options.")


def comparable_option(provider: str, key: str, *settings: Setting | None) -> bool:
    """Whether config-drift may compare this provider option: the provider's catalog verifies the key for Python
    and genai alike, and every value given parses. Anything else is another rule's finding."""
    catalog = provider_catalog(provider)
    option = catalog.option(key) if catalog else None
    if option is None or not option.python_api:
        return False
    return all(s is None or option.validate(s.value) is None for s in settings)


def _provider_option_drift(ctx: RuleContext, policy: SessionSetup, genai: SessionSetup):
    provider = policy.provider_name
    if provider is None:
        return
    for key, wanted in sorted(policy.provider_options.items()):
        have = genai.provider_options.get(key)
        if not comparable_option(provider, key, wanted, have):
            continue
        want_value, want_said = _option_value(provider, key, wanted)
        have_value, have_said = _option_value(provider, key, have)
        if want_value != have_value:
            yield _drift(ctx, f"{provider} option {key}", have, wanted, have_said, want_said, genai,
                         path=f"model.decoder.session_options.provider_options.{key}",
                         fix=f"Set \"{key}\": \"{wanted.value}\" in genai_config.json's provider options.")


# SessionOptions attributes genai_config.json can set too.
GENAI_SESSION_ATTRIBUTES = ("intra_op_num_threads", "inter_op_num_threads", "enable_mem_pattern", "enable_cpu_mem_arena")


@rule("OGC002", "session-option-drift", Severity.WARNING, needs=("policy", "genai_config"))
def session_option_drift(ctx: RuleContext):
    """genai_config.json sets a thread or memory session option differently from the policy.

    ## What it checks
    When both a policy and genai_config.json are given, each of `intra_op_num_threads`, `inter_op_num_threads`,
    `enable_mem_pattern` and `enable_cpu_mem_arena` the policy sets, against genai_config.json's session options
    (unset = ORT's default). The finding points at genai_config.json's line and names the policy's.

    ## Why it costs throughput
    CI measures the policy's session and production runs genai_config.json's: thread counts and memory patterns
    change CPU-side speed and memory, so the measured figures do not hold where the model serves. It changes no
    kernel choice, so it is a warning.

    ## Bad
    ```yaml
    session: {intra_op_num_threads: 8}
    ```

    ```json
    {"model": {"decoder": {"session_options": {"intra_op_num_threads": 2}}}}
    ```

    ## Good
    ```yaml
    session: {intra_op_num_threads: 8}
    ```

    ```json
    {"model": {"decoder": {"session_options": {"intra_op_num_threads": 8}}}}
    ```

    ## Fix
    Set the same value in genai_config.json's `model.decoder.session_options`, or change the policy.
    """
    policy, genai = ctx.deployment.policy_setup, ctx.deployment.genai_setup
    if policy is None or genai is None:
        return
    for key, wanted in sorted(policy.session_attributes.items()):
        if key not in GENAI_SESSION_ATTRIBUTES:
            continue
        have = genai.session_attributes.get(key)
        want_value, want_said = _session_value(wanted)
        have_value, have_said = _session_value(have)
        if want_value != have_value:
            yield _drift(ctx, f"session option {key}", have, wanted, have_said, want_said, genai,
                         path=f"model.decoder.session_options.{key}",
                         fix=f"Set \"{key}\": {wanted.value!r} in genai_config.json's session_options.")


def _drift(ctx: RuleContext, what: str, have: Setting | None, wanted: Setting, have_said: str, want_said: str,
           genai: SessionSetup, *, fix: str, path: str | None = None):
    """The one message of config-drift and session-option-drift. `fix` makes genai_config.json say what the policy
    says; the advice names the side to change, and never the value a session or provider rule rejects: when the
    policy's value is one, the policy is the side to change (toward the rule's value)."""
    location = have.location if have is not None else genai.missing(path or "model.decoder.session_options")
    setting = what.split()[-1]
    policy_objection = _objection(ctx, "policy", wanted.location, setting)
    genai_objection = _objection(ctx, "genai_config", location, setting)
    where = _where(wanted.location)
    # The stronger objection decides (an error that asks for another value outweighs a warning to check one).
    if policy_objection is not None and genai_objection is not None:
        if policy_objection.severity > genai_objection.severity:
            genai_objection = None
        elif genai_objection.severity > policy_objection.severity:
            policy_objection = None
    if policy_objection is not None:
        rejects = f"{policy_objection.code} {policy_objection.rule}"
        if genai_objection is not None:
            change = "both"
            advice = (f"Change both files: {rejects} rejects the policy's value ({where}) and genai_config.json's; "
                      f"{policy_objection.fix or ''}")
        else:
            change = "policy"
            theirs = have_said.removeprefix("has ")
            advice = (f"Change the policy ({where}), not genai_config.json: {rejects} rejects the policy's value, and "
                      f"genai_config.json's value ({theirs}) is one it accepts. {policy_objection.fix or ''}")
    else:
        change = "genai_config"
        other = "" if genai_objection is not None else f" (or change the policy at {where} if it is the one that is wrong)"
        advice = f"Change genai_config.json: {fix.rstrip('.')}{other}."
    return ctx.finding(
        f"genai_config.json and the policy disagree on {what}: genai_config.json {have_said}, the policy "
        f"({where}) {want_said}",
        location=location,
        fix=advice,
        properties={"setting": what, "genai_config": have_said, "policy": want_said,
                    "policy_location": where, "change": change},
    )


# Rules that judge one declared setting: what they find in one side's declaration judged alone says whether that
# side's value is one to copy.
_JUDGING_FAMILIES = ("session", "provider")


def _objection(ctx: RuleContext, origin: str, location: Location, setting: str) -> Finding | None:
    """The first finding a session or provider rule makes about `setting` at `location` when `origin`'s
    declaration (the policy's or genai_config.json's) is judged alone; None when no rule objects."""
    for found in _side_findings(ctx, origin):
        if found.kind is not Kind.VIOLATION or found.severity < Severity.WARNING:
            continue
        same = found.location == location or (
            found.location.file == location.file and found.location.line == location.line and setting in found.message)
        if same:
            return found
    return None


def _side_findings(ctx: RuleContext, origin: str) -> list[Finding]:
    cache = ctx.inputs.__dict__.setdefault("_drift_side_findings", {})
    if origin not in cache:
        from dataclasses import replace

        from ortgate.config.deployment import Deployment
        from ortgate.rules import all_rules
        from ortgate.rules.context import RuleContext as Context

        setup = next((s for s in ctx.deployment.setups if s.origin == origin), None)
        found: list[Finding] = []
        if setup is not None:
            alone = replace(ctx.inputs, deployment=Deployment([setup]))
            for judge in (r for r in all_rules() if r.family in _JUDGING_FAMILIES):
                try:
                    found.extend(judge.check(Context(alone, judge)))
                except Exception:  # a judge that cannot decide objects to nothing
                    continue
        cache[origin] = found
    return cache[origin]
