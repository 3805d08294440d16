"""Drift rules (OGC): two declarations of one deployment that disagree.

The policy says how the session should be built (and is what `ortgate run` builds); onnxruntime-genai builds its
session from genai_config.json. When both are given, every setting the policy declares must hold in
genai_config.json too, or production does not run what CI checked.
"""

from __future__ import annotations

from typing import Any

from ortgate.config.deployment import ORT_DEFAULT_OPTIMIZATION_LEVEL, SessionSetup, Setting, config_text
from ortgate.findings import Location, Severity
from ortgate.knowledge import provider_catalog, session_config_key
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


@rule("OGC001", "config-drift", Severity.ERROR)
def config_drift(ctx: RuleContext):
    """genai_config.json configures the session differently from the policy.

    ## What it checks
    When both a policy and genai_config.json are given, each setting the policy declares against what
    genai_config.json makes onnxruntime-genai do: the execution provider, every provider option the policy sets
    (booleans compared as ORT parses them, unset = the catalog's default), `graph_optimization_level`, the
    session config entries and the thread / memory-pattern options. The finding points at genai_config.json's
    line and names the policy's file and line.

    ## Why it costs throughput
    The policy is what CI checks (and what `ortgate run` measures); genai_config.json is what production runs.
    The genai builder writes `enable_cuda_graph: "0"` unless told otherwise, so a policy that requires CUDA
    graph can pass every check while production launches every kernel one by one.

    ## Bad
    ```text
    policy.yaml:        execution_provider.options.enable_cuda_graph: "1"
    genai_config.json:  "provider_options": [{"cuda": {"enable_cuda_graph": "0"}}]
    ```

    ## Good
    ```text
    policy.yaml:        execution_provider.options.enable_cuda_graph: "1"
    genai_config.json:  "provider_options": [{"cuda": {"enable_cuda_graph": "1"}}]
    ```

    ## Fix
    Make genai_config.json say what the policy says (rebuild with the genai builder's
    `--extra_options enable_cuda_graph=1`, or edit `model.decoder.session_options`), or change the policy if
    it is the one that is wrong.
    """
    policy, genai = ctx.deployment.policy_setup, ctx.deployment.genai_setup
    if policy is None or genai is None:
        return
    if policy.provider is not None and policy.provider_name != genai.provider_name:
        yield _drift(ctx, "execution provider", genai.provider, policy.provider, f"has {genai.provider_name!r}",
                     f"has {policy.provider_name!r}", genai,
                     fix=f"List {policy.provider_name} first in genai_config.json's provider_options.")
        return  # options of different providers are not comparable
    provider = policy.provider_name
    if provider is not None:
        for key, wanted in sorted(policy.provider_options.items()):
            have = genai.provider_options.get(key)
            want_value, want_said = _option_value(provider, key, wanted)
            have_value, have_said = _option_value(provider, key, have)
            if want_value != have_value:
                yield _drift(ctx, f"{provider} option {key}", have, wanted, have_said, want_said, genai,
                             path=f"model.decoder.session_options.provider_options.{key}",
                             fix=f"Set \"{key}\": \"{wanted.value}\" in genai_config.json's provider options.")
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
        have = genai.config_entries.get(key)
        want_value, want_said = _config_value(key, wanted)
        have_value, have_said = _config_value(key, have)
        if want_value != have_value:
            yield _drift(ctx, f"session config entry {key}", have, wanted, have_said, want_said, genai,
                         path=f"model.decoder.session_options.{key}",
                         fix=f"Add \"{key}\": \"{want_value}\" to genai_config.json's session_options.")
    for key, wanted in sorted(policy.session_attributes.items()):
        if key not in ("intra_op_num_threads", "inter_op_num_threads", "enable_mem_pattern", "enable_cpu_mem_arena"):
            continue  # genai_config.json cannot set the others
        have = genai.session_attributes.get(key)
        want_value, want_said = _session_value(wanted)
        have_value, have_said = _session_value(have)
        if want_value != have_value:
            yield _drift(ctx, f"session option {key}", have, wanted, have_said, want_said, genai,
                         path=f"model.decoder.session_options.{key}", severity=Severity.WARNING,
                         fix=f"Set \"{key}\": {wanted.value!r} in genai_config.json's session_options.")


def _drift(ctx: RuleContext, what: str, have: Setting | None, wanted: Setting, have_said: str, want_said: str,
           genai: SessionSetup, *, fix: str, path: str | None = None, severity: Severity | None = None):
    location = have.location if have is not None else genai.missing(path or "model.decoder.session_options")
    return ctx.finding(
        f"genai_config.json and the policy disagree on {what}: genai_config.json {have_said}, the policy "
        f"({_where(wanted.location)}) {want_said}",
        location=location,
        severity=severity,
        fix=fix,
        properties={"setting": what, "genai_config": have_said, "policy": want_said,
                    "policy_location": _where(wanted.location)},
    )
