"""Building ONNX Runtime sessions from the policy's SessionSetup, and proving each setting took effect.

ORT's Python API hides failures: a provider whose libraries are missing is skipped with a log line, and an
option the provider rejects makes `InferenceSession` print "EP Error ... Falling back" (to stdout) and build a
CPU session. So the runner (1) probes whether the requested provider can be created on this machine at all,
(2) captures what ORT prints while creating the session, and (3) compares `get_providers()`,
`get_provider_options()` and the input shapes with what the policy asked for.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ortgate.config.deployment import SessionSetup
from ortgate.errors import InputError
from ortgate.evidence import DimCheck, DumpEvidence, OptionCheck, ProviderCheck
from ortgate.graph.index import Graph
from ortgate.knowledge import cpu_fallback_facts, cuda_providers, normalize_option_value
from ortgate.knowledge.provider_names import CPU

RECORD_PLACEMENT_KEY = "session.record_ep_graph_assignment_info"  # makes get_provider_graph_assignment_info work
DUMP_EXTERNAL_DATA_KEY = "session.optimized_model_external_initializers_file_name"
DUMP_EXTERNAL_MIN_SIZE_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"
# ORT refuses to save a graph holding nodes an EP compiled (TensorRT, CANN graph mode, ...):
# "Unable to serialize model as it contains compiled nodes."
_COMPILED_NODES = re.compile(r"compiled nodes", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ORT_LOG = re.compile(r"\[([EWF]):onnxruntime[^\]]*\]\s*(.*)")
MAX_MESSAGES = 20
MAX_MESSAGE_CHARS = 500


class SessionCreationError(InputError):
    """ORT could not create the session (bad model, missing kernel, conflicting options, ...)."""

    def __init__(self, session: str, detail: str, path: str | Path):
        self.session = session  # "policy" | "default" | "reference"
        self.detail = detail  # ORT's message, one line
        super().__init__(f"{session} session creation failed: {detail}", path)


# How ORT names the node a failure happened in, at load time and at run time.
_NODE_IN_MESSAGE = (
    re.compile(r"Name:'([^']*)'"),  # "Non-zero status code returned while running X node. Name:'n' ..."
    re.compile(r"node with name '([^']*)'"),  # "Could not find an implementation for X(1) node with name 'n'"
    re.compile(r"\bin node \(([^)]*)\)"),  # "Type Error: ... of operator (Add) in node (n) is invalid."
    re.compile(r"\bNode \(([^)]*)\)"),  # "Node (n) Op (X) [ShapeInferenceError] ..."
)


def failing_node(message: str) -> str | None:
    """The node an ORT error message names, if it names one."""
    for pattern in _NODE_IN_MESSAGE:
        match = pattern.search(message)
        if match and match.group(1):
            return match.group(1)
    return None


# ---- what ORT prints -----------------------------------------------------------------------------------------


@dataclass
class CapturedOutput:
    text: str = ""

    @property
    def messages(self) -> list[str]:
        return ort_messages(self.text)


_SAVED_STDERR: list[int] = []  # the real stderr while captured_output() redirects fd 2


def original_stderr_fd() -> int:
    """Where a message must go to reach the user even while ORT's output is being captured."""
    return _SAVED_STDERR[0] if _SAVED_STDERR else 2


@contextlib.contextmanager
def captured_output() -> Iterator[CapturedOutput]:
    """Capture what ORT writes while the block runs: native stdout/stderr (its logger) and Python prints
    (InferenceSession's "EP Error ... Falling back"), so that none of it corrupts a JSON report on stdout."""
    holder = CapturedOutput()
    python_out = io.StringIO()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: dict[int, int] = {}
    tmp = tempfile.TemporaryFile()
    try:
        for fd in (1, 2):
            try:
                saved[fd] = os.dup(fd)
                os.dup2(tmp.fileno(), fd)
            except OSError:
                pass
        if 2 in saved:
            _SAVED_STDERR.append(saved[2])
        with contextlib.redirect_stdout(python_out):
            yield holder
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if 2 in saved and saved[2] in _SAVED_STDERR:
            _SAVED_STDERR.remove(saved[2])
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        tmp.seek(0)
        holder.text = tmp.read().decode("utf-8", errors="replace") + python_out.getvalue()
        tmp.close()


def ort_messages(text: str) -> list[str]:
    """ORT's error/warning log lines and the Python API's fallback notices, without colour codes."""
    out: list[str] = []
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.strip()
        match = _ORT_LOG.search(line)
        if match:
            line = f"{match.group(1)}: {tidy(match.group(2))}"
        elif not (line.startswith(("EP Error", "Falling back"))):
            continue
        line = line[:MAX_MESSAGE_CHARS]
        if line and line not in out:
            out.append(line)
    return out[:MAX_MESSAGES]


_ORT_ERROR_PREFIX = re.compile(r"^.*\[ONNXRuntimeError\] : \d+ : \w+ : ")


def tidy(message: str) -> str:
    """One line of ORT's message without its source location and status prefix."""
    return _ORT_ERROR_PREFIX.sub("", " ".join(message.split()))


def _first_line(exc: BaseException) -> str:
    return tidy(str(exc))


# ---- is the provider there at all? -----------------------------------------------------------------------------


@functools.cache
def provider_availability(provider: str) -> tuple[bool, str | None]:
    """Whether this machine can create `provider`, and ORT's reason when it cannot.

    `get_available_providers()` lists what the onnxruntime package was built with (onnxruntime-gpu lists CUDA and
    TensorRT on a machine without a GPU), so the provider is created on a one-node model to find out.
    """
    import onnxruntime as ort

    if provider == CPU:
        return True, None
    built = ort.get_available_providers()
    if provider not in built:
        return False, (f"this onnxruntime package ({ort.__version__}) is not built with {provider} "
                       f"(it has {', '.join(built)})")
    so = ort.SessionOptions()
    with captured_output() as out:
        if provider in cuda_providers() and hasattr(ort, "preload_dlls"):
            # CUDA / cuDNN from pip (nvidia-*-cu13) are not on the loader path; onnxruntime.preload_dlls loads them.
            with contextlib.suppress(Exception):
                ort.preload_dlls()
        try:
            session = ort.InferenceSession(_probe_model(), so, providers=[provider])
            ran = session.get_providers()
        except Exception as exc:  # ORT raises RuntimeError subclasses of its own
            return False, _first_line(exc)
    if ran and ran[0] == provider:
        return True, None
    errors = [m for m in out.messages if m.startswith(("E:", "EP Error"))] or out.messages
    reason = errors[0] if errors else f"ORT created the session on {', '.join(ran)} instead"
    return False, reason.removeprefix("E: ")


@functools.cache
def _probe_model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="probe")], "provider_probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


# ---- custom ops ------------------------------------------------------------------------------------------------


@functools.cache
def builtin_op_domains() -> frozenset[str]:
    """Op domains ONNX Runtime implements itself: every domain its kernel tables register kernels in."""
    from ortgate.knowledge import kernel_table, normalize_domain

    table = kernel_table()
    return frozenset(normalize_domain(d) for p in table.providers() for d in table.domains(p)) | {"ai.onnx"}


def custom_op_domains(graph: Graph) -> dict[str, list[str]]:
    """Domains of the model's nodes that ORT does not implement -> their op types."""
    from ortgate.knowledge import normalize_domain

    builtin = builtin_op_domains()
    found: dict[str, set[str]] = {}
    for node in graph.nodes:
        domain = normalize_domain(node.domain)
        if domain not in builtin:
            found.setdefault(domain, set()).add(node.op_type)
    return {d: sorted(ops) for d, ops in sorted(found.items())}


def custom_op_libraries(graph: Graph, setup: SessionSetup, *, allowed: bool) -> list[str]:
    """The custom-op libraries to register, or an input error saying why the model cannot run.

    A library is native code: it is loaded only when the policy names it AND the user passed --allow-custom-ops.
    """
    domains = custom_op_domains(graph)
    libraries = setup.custom_op_libraries
    if domains and not libraries:
        what = "; ".join(f"{d}: {', '.join(ops[:5])}" for d, ops in domains.items())
        raise InputError(f"the model uses custom ops ({what}) that ONNX Runtime does not implement; name their "
                         "library under session.custom_op_libraries in the policy and pass --allow-custom-ops",
                         graph.path)
    if not libraries:
        return []
    if not allowed:
        first = libraries[0].location
        if domains:
            raise InputError(f"the model needs the custom-op libraries this policy names "
                             f"({', '.join(str(s.value) for s in libraries)}); loading one runs its code, so "
                             "`ortgate run` loads them only with --allow-custom-ops", first.file, line=first.line)
        return []
    paths = []
    for setting in libraries:
        path = Path(str(setting.value)).expanduser()
        if not path.is_absolute():
            path = Path(setting.location.file).parent / path
        if not path.is_file():
            raise InputError(f"custom-op library {setting.value!r} does not exist (resolved to {path})",
                             setting.location.file, line=setting.location.line)
        paths.append(str(path))
    return paths


# ---- building ----------------------------------------------------------------------------------------------------


@dataclass
class BuiltSession:
    session: Any  # onnxruntime.InferenceSession
    kind: str  # "policy" | "default" | "reference"
    provider: str  # the provider asked for
    messages: list[str]
    dump: DumpEvidence | None = None
    fallback_reason: str | None = None
    notes: tuple[str, ...] = ()


def fallback_config_key() -> str:
    return cpu_fallback_facts().config_key


def create_session(model_path: str, setup: SessionSetup | None, *, kind: str = "policy",
                   provider: str | None = None, dump_path: str | None = None, profile_prefix: str | None = None,
                   libraries: tuple[str, ...] = (), record_placement: bool = False,
                   large_model: bool = False) -> BuiltSession:
    """A session for `model_path`.

    kind "policy": exactly the setup's options (on `provider` instead of the declared one when given);
    "default": ORT's default SessionOptions and default provider options (no overrides, CUDA graph off);
    "reference": the default session at ORT_DISABLE_ALL (what outputs are compared against).
    """
    import onnxruntime as ort

    notes: list[str] = []
    if kind == "policy":
        if setup is None:
            raise ValueError("a policy session needs a SessionSetup")
        so, providers = setup.ort_session_options(provider=provider)
        declared = setup.provider_name or CPU
        if provider is not None and provider != declared:
            key = fallback_config_key()
            if setup.config_entry(key) is not None and provider == CPU:
                # ORT rejects a CPU-only session that also disables CPU fallback: the entry is about GPU sessions.
                so = _without_config_entry(setup, key, provider)
                notes.append(f"{key} dropped: it forbids the CPU provider this run substitutes")
    else:
        so = ort.SessionOptions()
        providers = [(provider or CPU, {})]
        if kind == "reference":
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if record_placement:
        so.add_session_config_entry(RECORD_PLACEMENT_KEY, "1")
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    for library in libraries:
        try:
            so.register_custom_ops_library(library)
        except Exception as exc:  # not a loadable library: the policy named the wrong file
            raise InputError(f"custom-op library could not be loaded: {' '.join(str(exc).split())}", library) from None
    if dump_path:
        so.optimized_model_filepath = dump_path
        if large_model:
            so.add_session_config_entry(DUMP_EXTERNAL_DATA_KEY, Path(dump_path).name + ".data")
            so.add_session_config_entry(DUMP_EXTERNAL_MIN_SIZE_KEY, "1024")

    names = [p for p, _ in providers]
    options = [o for _, o in providers]
    with captured_output() as out:
        try:
            session = ort.InferenceSession(model_path, so, providers=names, provider_options=options)
            error = None
        except Exception as exc:
            session, error = None, exc
    messages = out.messages
    compiled = dump_path and (any(_COMPILED_NODES.search(m) for m in messages)
                              or (error is not None and _COMPILED_NODES.search(str(error))))
    if compiled:
        # The provider compiled nodes into engines; the dump cannot be written. Build the session without it.
        retry = create_session(model_path, setup, kind=kind, provider=provider, dump_path=None,
                               profile_prefix=profile_prefix, libraries=libraries, record_placement=record_placement)
        reason = next((m for m in messages if _COMPILED_NODES.search(m)), None) or _first_line(cast(Exception, error))
        retry.dump = DumpEvidence(None, False, f"ORT cannot save the optimized model: {reason}")
        return retry
    if error is not None:
        cause = error.__cause__
        detail = _first_line(error) + (f" (after: {_first_line(cause)})" if cause is not None else "")
        raise SessionCreationError(kind, detail, model_path) from None
    session.disable_fallback()  # a provider error during a run must raise, not switch providers mid-measurement
    fallback = next((m for m in messages if m.startswith("EP Error")), None)
    dump = DumpEvidence(dump_path, False) if dump_path else None
    if dump_path and not Path(dump_path).is_file():
        dump = DumpEvidence(None, False, "ORT wrote no optimized model")
    return BuiltSession(session, kind, names[0], messages, dump, fallback, tuple(notes))


def _without_config_entry(setup: SessionSetup, key: str, provider: str):
    from dataclasses import replace

    trimmed = replace(setup, config_entries={k: v for k, v in setup.config_entries.items() if k != key})
    return trimmed.ort_session_options(provider=provider)[0]


# ---- proving the settings took effect ---------------------------------------------------------------------------


def provider_check(setup: SessionSetup | None, *, available: bool, reason: str | None, ran_on: list[str],
                   substituted: bool, fallback_reason: str | None) -> ProviderCheck:
    requested = (setup.provider_name if setup else None) or CPU
    location = setup.provider.location if setup and setup.provider else None
    return ProviderCheck(requested, location, available, reason, tuple(ran_on), substituted, fallback_reason)


def option_checks(setup: SessionSetup, effective: dict[str, str]) -> list[OptionCheck]:
    """Each requested provider option against the effective options ORT reports for that provider."""
    checks = []
    for key, setting in sorted(setup.provider_options.items()):
        requested = str(setting.value)
        actual = effective.get(key)
        applied = actual is not None and normalize_option_value(actual) == normalize_option_value(requested)
        checks.append(OptionCheck(key, requested, actual, applied, setting.location))
    return checks


def dim_checks(setup: SessionSetup, model_inputs: list, session_inputs: list) -> list[DimCheck]:
    """Each free-dimension override: pinned in the session's input shapes, still symbolic, or matching no input."""
    declared: dict[str, list[str]] = {}
    for spec in model_inputs:
        for axis, dim in enumerate(spec.shape or ()):
            if isinstance(dim, str):
                declared.setdefault(dim, []).append(f"{spec.name}[{axis}]")
    still: dict[str, list[str]] = {}
    for spec in session_inputs:
        for axis, dim in enumerate(spec.shape or ()):
            if isinstance(dim, str):
                still.setdefault(dim, []).append(f"{spec.name}[{axis}]")
    checks = []
    for name, setting in sorted(setup.free_dimension_overrides.items()):
        value = int(setting.value)
        if name in still:
            checks.append(DimCheck(name, value, "unresolved", tuple(still[name]), setting.location))
        elif name not in declared:
            checks.append(DimCheck(name, value, "no-such-dim", (), setting.location))
        else:
            checks.append(DimCheck(name, value, "pinned", tuple(declared[name]), setting.location))
    return checks


def placement(session) -> dict[str, dict[str, int]] | None:
    """Provider -> op type -> node count, from ORT's graph assignment info (None when ORT cannot say)."""
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if getter is None:
        return None
    try:
        subgraphs = getter()
    except Exception:
        return None
    out: dict[str, dict[str, int]] = {}
    for subgraph in subgraphs:
        counts = out.setdefault(subgraph.ep_name, {})
        for node in subgraph.get_nodes():
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return {p: dict(sorted(c.items())) for p, c in sorted(out.items())}
