"""How the ONNX Runtime session is configured: the evidence about the session, with where each value was set.

There may be two declarations of one deployment: the policy's `session` / `execution_provider` blocks (what a
Python `InferenceSession` is built from, and what `ortgate run` builds) and onnxruntime-genai's
genai_config.json (what the genai runtime builds). Config rules check each; `config-drift` compares them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from ortgate.config.genai import GENAI_NAMED_SESSION_OPTIONS, GenaiConfig
from ortgate.config.policy import Policy
from ortgate.config.source import format_key_path
from ortgate.errors import InputError
from ortgate.findings import Location
from ortgate.knowledge import default_optimization_level
from ortgate.knowledge.provider_names import CPU

ORT_DEFAULT_OPTIMIZATION_LEVEL = default_optimization_level()


@dataclass(frozen=True)
class Setting:
    """One deployment setting's value and where it was declared."""

    value: Any
    location: Location


@dataclass
class SessionSetup:
    """One declared session: its provider, provider options and session options, each with its location."""

    origin: str  # "policy" | "genai_config"
    file: str
    provider: Setting | None = None  # canonical EP name, e.g. CUDAExecutionProvider
    provider_options: dict[str, Setting] = field(default_factory=dict)
    optimization_level: Setting | None = None  # None: not set, ORT's default (ORT_ENABLE_ALL) applies
    free_dimension_overrides: dict[str, Setting] = field(default_factory=dict)
    config_entries: dict[str, Setting] = field(default_factory=dict)
    anchor: Location | None = None  # where to point when a setting is missing
    free_dimension_overrides_by_denotation: dict[str, Setting] = field(default_factory=dict)
    # SessionOptions attributes: intra_op_num_threads, inter_op_num_threads, execution_mode, enable_mem_pattern, ...
    session_attributes: dict[str, Setting] = field(default_factory=dict)
    custom_op_libraries: list[Setting] = field(default_factory=list)

    @property
    def provider_name(self) -> str | None:
        return self.provider.value if self.provider else None

    @property
    def effective_optimization_level(self) -> str:
        return self.optimization_level.value if self.optimization_level else ORT_DEFAULT_OPTIMIZATION_LEVEL

    def option(self, key: str) -> str | None:
        setting = self.provider_options.get(key)
        return None if setting is None else option_text(setting.value)

    def config_entry(self, key: str) -> str | None:
        setting = self.config_entries.get(key)
        return None if setting is None else option_text(setting.value)

    def missing(self, key_path: str) -> Location:
        """Location for a finding about a key that is absent: the enclosing block, named by the key path."""
        anchor = self.anchor or Location(self.file)
        return Location(anchor.file, anchor.line, key_path)

    @property
    def label(self) -> str:
        return "policy" if self.origin == "policy" else "genai_config.json"

    def ort_session_options(self, *, provider: str | None = None) -> tuple[Any, list[tuple[str, dict[str, str]]]]:
        """`onnxruntime.SessionOptions` and the `providers` list exactly as this setup declares them.

        `provider` runs the same session options on another provider (without this setup's provider options,
        which belong to the declared one). Custom-op libraries are not registered here: loading a library runs
        its code, which the caller decides.
        """
        import onnxruntime as ort

        so = ort.SessionOptions()
        if self.optimization_level is not None:
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, str(self.optimization_level.value))
        for name, setting in self.free_dimension_overrides.items():
            if isinstance(setting.value, list):  # read only so that free-dim-override-range can explain it
                raise InputError(f"{setting.location.key_path}: {setting.value} is a range; ORT pins a dim to one "
                                 "integer (see `ortgate explain free-dim-override-range`)", setting.location.file,
                                 line=setting.location.line)
            so.add_free_dimension_override_by_name(name, int(setting.value))
        for denotation, setting in self.free_dimension_overrides_by_denotation.items():
            so.add_free_dimension_override_by_denotation(denotation, int(setting.value))
        for key, setting in self.config_entries.items():
            so.add_session_config_entry(key, config_text(setting.value))
        for name, setting in self.session_attributes.items():
            value = setting.value
            if name == "execution_mode":
                value = getattr(ort.ExecutionMode, str(value))
            setattr(so, name, value)
        declared = self.provider_name or CPU
        if provider is None or provider == declared:
            options = {key: option_text(s.value) for key, s in self.provider_options.items()}
            return so, [(declared, options)]
        return so, [(provider, {})]


def option_text(value: Any) -> str:
    """Provider option values as ORT's Python API receives them (it passes str(value))."""
    return str(value)


def config_text(value: Any) -> str:
    """Session config entry values: YAML booleans become "1" / "0", ORT's spelling for config flags."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def canonical_provider(name: str, location: Location) -> str:
    """The ORT execution provider name; an unknown provider is an input error naming the file and key."""
    from ortgate.knowledge import canonical_provider_name, ort_facts

    canonical = canonical_provider_name(name)
    if canonical is None:
        known = ort_facts().known_providers
        hint = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise InputError(f"{location.key_path}: unknown execution provider {name!r}{suggestion}", location.file,
                         line=location.line)
    return canonical


@dataclass(frozen=True)
class OrtRelease:
    """The ONNX Runtime release the deployment runs, where that comes from, and the release whose knowledge judges
    it. The one source of the release for every rule and price: `--ort-version`, else the policy's
    `execution_provider.onnxruntime_version`, else the release ortgate assumes in every install
    (knowledge/ort_releases.json), never the onnxruntime installed where ortgate runs."""

    version: str
    source: str  # "--ort-version" | "policy" | "assumed"
    location: Location | None = None
    judged_as: str = ""  # the newest known release for a newer one; else `version`

    @property
    def pinned(self) -> bool:
        return self.source != "assumed"

    @property
    def origin(self) -> str:
        """Where the release comes from, as a report says it."""
        if self.source == "--ort-version":
            said = "--ort-version"
        elif self.source == "policy":
            said = "the policy's execution_provider.onnxruntime_version"
        else:
            said = (f"assumed: the policy pins no release and ortgate assumes {self.version} in every install; "
                    "pin it as execution_provider.onnxruntime_version")
        if self.judged_as and self.judged_as != self.version:
            said += f"; newer than ortgate's knowledge, judged as {self.judged_as}"
        return said


def resolve_release(policy: Policy | None, override: str | None = None) -> OrtRelease:
    """The deployment's ONNX Runtime release (see OrtRelease). A value that is not a release, or one older than the
    knowledge covers, is bad input naming the key and the covered range."""
    from ortgate.knowledge.releases import assumed_release, judged_as, release_problem

    key = "execution_provider.onnxruntime_version"
    if override is not None:
        text, source, location = str(override), "--ort-version", None
    elif policy is not None and policy.get("execution_provider", "onnxruntime_version") is not None:
        text, source = str(policy.get("execution_provider", "onnxruntime_version")), "policy"
        location = policy.where("execution_provider", "onnxruntime_version")
    else:
        version = assumed_release()
        return OrtRelease(version, "assumed", None, version)
    problem = release_problem(text)
    if problem is not None:
        if location is None:
            raise InputError(f"--ort-version: {problem}")
        raise InputError(f"{key}: {problem}", location.file, line=location.line)
    return OrtRelease(text, source, location, judged_as(text))


@dataclass
class Deployment:
    """The session setups the inputs declare (the policy's, genai_config.json's), each with its origin, and the
    ONNX Runtime release it runs (`ort`)."""

    setups: list[SessionSetup] = field(default_factory=list)
    ort: OrtRelease = field(default_factory=lambda: resolve_release(None))

    @property
    def policy_setup(self) -> SessionSetup | None:
        return next((s for s in self.setups if s.origin == "policy"), None)

    @property
    def genai_setup(self) -> SessionSetup | None:
        return next((s for s in self.setups if s.origin == "genai_config"), None)

    @property
    def primary(self) -> SessionSetup | None:
        """The setup that names the target provider: the policy's, else genai_config.json's."""
        for setup in (self.policy_setup, self.genai_setup):
            if setup is not None and setup.provider is not None:
                return setup
        return self.policy_setup or self.genai_setup

    @property
    def provider(self) -> str | None:
        primary = self.primary
        return primary.provider_name if primary else None



def setup_from_policy(policy: Policy) -> SessionSetup:
    file = str(policy.path)
    setup = SessionSetup("policy", file, anchor=policy.where("session") if policy.get("session") else policy.where())
    ep = policy.get("execution_provider")
    if ep:
        where = policy.where("execution_provider", "name")
        setup.provider = Setting(canonical_provider(ep["name"], where), where)
        for key, value in (ep.get("options") or {}).items():
            setup.provider_options[key] = Setting(value, policy.where("execution_provider", "options", key))
    session = policy.get("session") or {}
    if "graph_optimization_level" in session:
        setup.optimization_level = Setting(
            session["graph_optimization_level"], policy.where("session", "graph_optimization_level"))
    for name, value in (session.get("free_dimension_overrides") or {}).items():
        setup.free_dimension_overrides[name] = Setting(value, policy.where("session", "free_dimension_overrides", name))
    for key, value in (session.get("config_entries") or {}).items():
        setup.config_entries[key] = Setting(value, policy.where("session", "config_entries", key))
    for name, value in (session.get("free_dimension_overrides_by_denotation") or {}).items():
        setup.free_dimension_overrides_by_denotation[name] = Setting(
            value, policy.where("session", "free_dimension_overrides_by_denotation", name))
    for name in POLICY_SESSION_ATTRIBUTES:
        if name in session:
            setup.session_attributes[name] = Setting(session[name], policy.where("session", name))
    for i, library in enumerate(session.get("custom_op_libraries") or []):
        setup.custom_op_libraries.append(Setting(library, policy.where("session", "custom_op_libraries", i)))
    return setup


# Policy `session:` keys that are attributes of onnxruntime.SessionOptions of the same name.
POLICY_SESSION_ATTRIBUTES = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "enable_mem_pattern",
                             "enable_cpu_mem_arena")


def setup_from_genai(config: GenaiConfig) -> SessionSetup:
    file = str(config.path)
    prefix = ("model", "decoder", "session_options")

    def loc(*key: str | int) -> Location:
        return Location(file, config.line_of(*prefix, *key), format_key_path(prefix + key))

    setup = SessionSetup("genai_config", file, anchor=loc())
    options = config.session_options
    providers = options.get("provider_options") or []
    if providers:
        (name, values), = providers[0].items()
        setup.provider = Setting(canonical_provider(name, loc("provider_options", 0, name)), loc("provider_options", 0, name))
        for key, value in values.items():
            if key != "device_filtering_options":
                setup.provider_options[key] = Setting(value, loc("provider_options", 0, name, key))
    else:
        # genai runs on CPU when no provider is listed.
        setup.provider = Setting(CPU, loc("provider_options"))
    if "graph_optimization_level" in options:
        setup.optimization_level = Setting(options["graph_optimization_level"], loc("graph_optimization_level"))
    for key, value in options.items():
        if key not in GENAI_NAMED_SESSION_OPTIONS and not isinstance(value, (dict, list)):
            setup.config_entries[key] = Setting(value, loc(key))
        elif key in POLICY_SESSION_ATTRIBUTES:
            setup.session_attributes[key] = Setting(value, loc(key))
    return setup


def build_deployment(policy: Policy | None, genai: GenaiConfig | None, ort_version: str | None = None) -> Deployment:
    deployment = Deployment(ort=resolve_release(policy, ort_version))
    if policy is not None and (policy.get("execution_provider") or policy.get("session")):
        deployment.setups.append(setup_from_policy(policy))
    if genai is not None:
        deployment.setups.append(setup_from_genai(genai))
    return deployment
