"""`ortgate fix`, short of linting and printing: plan the rewrites, write the new model into a temporary folder
beside OUT, verify it on ORT CPU. The caller lints and measures the staged folder, then commits (renames) or
discards it: an interrupted or failed fix never leaves a folder named OUT behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortgate.config.model_folder import resolve_model_path
from ortgate.config.reads import model_reads
from ortgate.errors import InputError
from ortgate.fix.attention import cache_not_fed_back
from ortgate.fix.fusions import FUSED_OPS, FusionReport, run_fusions
from ortgate.fix.genai_config import GenaiSettings, write_or_keep
from ortgate.fix.generate import TokenProof, prove_tokens
from ortgate.fix.inplace import KEEP_SUFFIX, KeepDecision, KeptInput, keep_inputs_alive, needs_keep_alive
from ortgate.fix.moe import (
    MoeRefusal,
    MoeRewrite,
    PlannedTensor,
    apply_moe,
    plan_moe,
    weight_names,
    write_planned,
)
from ortgate.fix.verify import (
    SESSION_BUILD_LIMIT_S,
    BlockCheck,
    ModelSource,
    Probe,
    SessionBuild,
    SessionPlan,
    VerifyResult,
    measure_session_build,
    session_plan,
    verify,
    verify_blocks,
)
from ortgate.fix.weights import (
    INLINE_LIMIT,
    DataFile,
    MemorySink,
    WeightSource,
    external_info,
    itemsize,
    set_external,
)
from ortgate.graph import build_graph
from ortgate.graph.index import Graph, ort_load_refusal
from ortgate.graph.load import load_model
from ortgate.knowledge.group_router import group_router_facts
from ortgate.knowledge.moe_op import moe_op_facts
from ortgate.rules import match_rules, suggest_rule
from ortgate.rules.base import FixKind

# The repairs `fix` makes, in the order it makes them. A rule names the one that removes its findings (`fix=` on
# `@rule`).
KIND_ORDER = tuple(FixKind)


def fixable_rules() -> dict[str, str]:
    """Rule code -> the repair `fix` makes for its findings, from each rule's `fix` (rules.base.rule)."""
    from ortgate.rules import all_rules

    found = {r.code: r.fix for r in all_rules() if r.fix is not None}
    unknown = sorted(f"{code} ({kind})" for code, kind in found.items() if kind not in KIND_ORDER)
    if unknown:
        raise RuntimeError(f"rules name repairs `fix` does not make: {', '.join(unknown)}; it makes {', '.join(KIND_ORDER)}")
    return found


@dataclass
class FixRequest:
    model: str
    output: str
    select: list[str] | None = None
    ignore: list[str] | None = None
    dry_run: bool = False
    verify: bool = True
    force: bool = False
    target_ort: str | None = None  # the ORT release the deployment runs (policy): what fix writes for
    target_provider: str | None = None  # the execution provider the deployment runs (policy)
    runner_dims: dict[str, int] = field(default_factory=dict)  # the policy's runner.dims: values of symbolic dims
    policy: str | None = None  # read by the caller: OUT must not hold it either
    session_setup: object | None = None  # the policy's SessionSetup: verification runs with its session options
    policy_files: tuple[Path, ...] = ()  # every file the policy leads to (ortgate.config.reads.policy_reads)
    # Checks OUT against every file the fix reads (the command line's shared output-safety check), once they are known.
    check_output: Callable[[list[Path]], None] | None = None
    genai: GenaiSettings | None = None  # what genai_config.json needs that the graph cannot tell


@dataclass
class FixResult:
    model: str
    output: str
    kinds: tuple[str, ...]
    rewrites: list[MoeRewrite] = field(default_factory=list)
    refusals: list[MoeRefusal] = field(default_factory=list)
    fusions: FusionReport | None = None
    verification: VerifyResult | None = None
    warnings: list[str] = field(default_factory=list)
    ort_installed: str | None = None
    ort_target: str | None = None
    files: list[str] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    written: bool = False
    dry_run: bool = False
    original_too_large: bool = False  # ORT did not build a session of the original within the measured limit
    original_build: SessionBuild | None = None  # the bounded session build of the original that decided it
    kept_inputs: list[KeptInput] = field(default_factory=list)  # MoE inputs kept alive past the node (ORT defect)
    keep_decision: KeepDecision | None = None  # whether the deployment needs them kept alive, and why
    verified_with_keep_alive: bool = False  # the installed ORT has the defect the deployment's has not: see _verify
    tokens: TokenProof | None = None  # greedy generation, original against the delivered folder
    attention_kept: str | None = None  # why the attention rewrite was dropped (it could not be proven)
    genai_config: str | None = None  # genai_config.json in OUT: written, kept from the input, or why not written
    gained_cache: int = 0  # layers of a cache-less export given a KV cache (past / present) by the rewrite

    @property
    def changed(self) -> bool:
        return bool(self.rewrites) or bool(self.fusions and any(layer.applied for layer in self.fusions.layers))


@dataclass
class StagedFix:
    """The new model folder, written but not yet in place."""

    result: FixResult
    folder: Path | None  # the temporary folder (None: nothing to write)
    model_file: Path | None
    original_graph: Graph
    original_bytes_folder: Path
    original: onnx.ModelProto | None = None

    out_identity: tuple[int, int] | None = None  # OUT's (device, inode) when it was checked; None: it did not exist

    def commit(self) -> None:
        """Move the folder into place. With --force, the OUT that was checked is replaced; nothing else ever is: a
        folder that appeared at OUT since (another process) stops the fix (InputError) and is left as it is."""
        if self.folder is None:
            return
        out = Path(self.result.output)
        _clear_marker(self.folder)
        old = None
        if self.out_identity is not None:
            old = out.with_name(f".{out.name[:100]}.ortgate-old-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                os.rename(out, old)  # `old` is a fresh name: nothing is replaced
            except FileNotFoundError:
                old = None  # removed meanwhile: nothing to replace
            except OSError as exc:
                raise InputError(f"cannot move the existing folder aside: {exc.strerror or exc}", out) from None
            if old is not None and _identity(old) != self.out_identity:
                _rename_noreplace(old, out)  # a different folder took OUT's place since the check: put it back
                raise InputError("was replaced by another folder while ortgate fix ran; left as it is, nothing "
                                 "written", out)
        try:
            _rename_noreplace(self.folder, out, 0o777 & ~_umask())  # private while staged; then as `mkdir OUT` makes it
        except FileExistsError:
            kept = f"; the folder it replaces is kept as {old}" if old is not None else ""
            raise InputError("appeared while ortgate fix ran (another process created it); left as it is, nothing "
                             f"written{kept}", out) from None
        except OSError as exc:
            if old is not None:
                with contextlib.suppress(OSError):
                    _rename_noreplace(old, out)
            raise InputError(f"cannot write: {exc.strerror or exc}", out) from None
        _OWN_STAGING.discard(self.folder)  # moved into place: nothing of ours is left there
        self.folder = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.result.written = True

    def discard(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            if not os.path.lexists(self.folder):  # else discard_own_staging tries again
                _OWN_STAGING.discard(self.folder)
            self.folder = None


# Staging folders: `.OUT.ortgate-tmp-*` beside OUT, holding a marker that says which process made it for which OUT, so
# a later fix can prove a folder left by a killed one is stale (its process is gone) and remove it.
STAGING_MARKER = ".ortgate-staging"


def _rename_noreplace(src: str | Path, dst: str | Path, mode: int | None = None) -> None:
    """Move the folder `src` to `dst`, failing with FileExistsError when anything is at `dst`: os.rename would
    replace an empty folder there, and Python has no renameat2(RENAME_NOREPLACE). mkdir claims the name (it never
    replaces), then the entries move in one by one, the model file last; if a move fails, they move back. `dst`
    gets `mode` (default: src's)."""
    final = os.stat(src).st_mode & 0o7777 if mode is None else mode
    os.mkdir(dst, 0o700)
    moved: list[str] = []
    try:
        for entry in sorted(os.listdir(src), key=lambda name: name.endswith(".onnx")):
            os.rename(os.path.join(src, entry), os.path.join(dst, entry))
            moved.append(entry)
        os.rmdir(src)
        os.chmod(dst, final)
    except BaseException:
        for entry in moved:
            with contextlib.suppress(OSError):
                os.rename(os.path.join(dst, entry), os.path.join(src, entry))
        with contextlib.suppress(OSError):
            os.rmdir(dst)
        raise


def _identity(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _process_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid, names it uniquely."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


# The staging folders this process created (their paths, chosen before mkdir): the only ones an interrupted fix
# removes, whatever line the signal landed on.
_OWN_STAGING: set[Path] = set()


def staging_folder(out: Path) -> Path:
    """A new staging folder beside `out` named `.OUT.ortgate-tmp-PID-TOKEN` (TOKEN random), created private (0700)
    and holding the marker that lets a later fix prove it is stale: this process's pid and start time, OUT's name,
    the token and the folder's own device and inode. Its path is recorded before it exists, so whenever a signal
    lands, discard_own_staging knows what to remove. OSError when it cannot be created."""
    token = secrets.token_hex(8)
    folder = out.resolve().parent / f".{out.name[:100]}.ortgate-tmp-{os.getpid()}-{token}"
    _OWN_STAGING.add(folder)
    try:
        os.mkdir(folder, 0o700)  # never replaces: a folder already there (a user's, however named) stops here
    except BaseException:
        _OWN_STAGING.discard(folder)  # not ours
        raise
    _write_marker(folder, out, token)
    return folder


def _write_marker(folder: Path, out: Path, token: str) -> None:
    st = os.lstat(folder)
    text = json.dumps({"pid": os.getpid(), "start": _process_start(os.getpid()), "output": out.name, "token": token,
                       "folder": [st.st_dev, st.st_ino]}, allow_nan=False)
    fd = os.open(folder / STAGING_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")


def _clear_marker(folder: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (folder / STAGING_MARKER).unlink()


# A marker is a few hundred bytes; a larger file there is not ortgate's.
MAX_MARKER_BYTES = 4096


def _read_marker(folder: Path) -> dict | None:
    """The marker of a staging folder, read without following a symbolic link (a marker that is a link, or is not
    a regular file of this user, is not ortgate's): None when there is none or it is not ortgate's."""
    import stat

    try:
        fd = os.open(folder / STAGING_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > MAX_MARKER_BYTES:
            return None
        data = os.read(fd, MAX_MARKER_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        marker = json.loads(data)
    except ValueError:
        return None
    return marker if isinstance(marker, dict) else None


def _is_stale_staging(folder: Path, out: Path, inputs: list[Path]) -> bool:
    """Whether `folder` is provably a staging folder a fix to `out` created and left when it was killed: a real
    folder (not a link) of this user, named `.OUT.ortgate-tmp-PID-TOKEN`, whose marker (a regular file, not a link)
    names this OUT, that pid, that token and this very folder's device and inode (a copy of a staging folder, or a
    folder made to look like one, has another inode), whose process is gone, and which neither is nor holds a file
    this fix reads."""
    import stat

    try:
        st = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    prefix = f".{out.name[:100]}.ortgate-tmp-"
    if not folder.name.startswith(prefix):
        return False
    pid_text, _, token = folder.name[len(prefix):].partition("-")
    marker = _read_marker(folder)
    if marker is None or not token or marker.get("token") != token or marker.get("output") != out.name:
        return False
    pid, start = marker.get("pid"), marker.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or str(pid) != pid_text or not isinstance(start, str):
        return False
    if marker.get("folder") != [st.st_dev, st.st_ino]:
        return False
    if _process_start(pid) == start:
        return False  # that fix is still running
    real = folder.resolve()
    return not any(real == given or real in given.parents for given in _resolved(inputs))


def _resolved(paths: list[Path]) -> list[Path]:
    out = []
    for path in paths:
        try:
            out.append(Path(path).resolve())
        except (OSError, RuntimeError):
            out.append(Path(os.path.abspath(path)))
    return out


def remove_stale_staging(out: Path, inputs: tuple[Path, ...] | list[Path] = ()) -> list[Path]:
    """Remove the staging folders beside `out` that a fix to `out` left when it was killed (SIGKILL, a power cut):
    only what _is_stale_staging proves this program created, never an input or a folder that holds one. Returns
    what it removed."""
    removed: list[Path] = []
    parent = out.resolve().parent
    try:
        entries = [p for p in parent.iterdir() if ".ortgate-tmp-" in p.name]
    except OSError:
        return removed
    read = list(inputs)
    for folder in entries:
        if _is_stale_staging(folder, out, read):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def discard_own_staging(output: str | Path) -> None:
    """Remove every staging folder this process made beside OUT (recorded by staging_folder): the last cleanup of
    an interrupted fix, whatever line the signal landed on."""
    try:
        parent = Path(output).resolve().parent
    except (OSError, RuntimeError):
        return
    for folder in [f for f in _OWN_STAGING if f.parent == parent]:
        with contextlib.suppress(OSError):
            if not folder.is_symlink() and folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
        if not os.path.lexists(folder):
            _OWN_STAGING.discard(folder)


def fix_kinds(select: list[str] | None, ignore: list[str] | None) -> tuple[str, ...]:
    """The repairs --select / --ignore leave on (rule names, codes or prefixes, as for lint)."""
    def codes(selectors: list[str], flag: str) -> set[str]:
        out: set[str] = set()
        for text in selectors:
            rules = match_rules(text)
            if not rules:
                hint = suggest_rule(text)
                raise InputError(f"{flag}: unknown rule {text!r}" + (f"; did you mean {hint!r}?" if hint else ""))
            out.update(r.code for r in rules)
        return out

    fixes = fixable_rules()
    chosen = set(fixes)
    if select:
        wanted = codes(select, "--select")
        unfixable = sorted(wanted - set(fixes))
        if not wanted & set(fixes):
            raise InputError(f"--select: {', '.join(unfixable)} {'has' if len(unfixable) == 1 else 'have'} no "
                             f"automatic fix; `ortgate fix` repairs {', '.join(sorted(fixes))}")
        chosen &= wanted
    if ignore:
        chosen -= codes(ignore, "--ignore")
    kinds = {fixes[c] for c in chosen}
    return tuple(k for k in KIND_ORDER if k in kinds)


def check_output_folder(output: str, inputs: list[Path], *, force: bool) -> Path:
    """OUT is a new folder that is not, and does not hold, anything ortgate reads."""
    out = Path(output)
    resolved = out.resolve()
    cwd = Path.cwd().resolve()
    if out.name in ("", ".", "..") or resolved == cwd or resolved in cwd.parents:
        raise InputError("refusing to write the fixed model over the working directory or a folder above it; "
                         "choose a new folder", output)
    for given in inputs:
        real = given.resolve()
        if real == resolved:
            raise InputError("refusing to write the fixed model over an input", output)
        if resolved in real.parents:
            raise InputError(f"refusing to write the fixed model into a folder that holds an input ({given})", output)
    if out.exists() and not force:
        raise InputError("already exists; choose a new folder or pass --force to replace it", output)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a folder", output)
    if not resolved.parent.is_dir():
        raise InputError("its parent folder does not exist", output)
    return out


def stage_fix(request: FixRequest, note: Callable[[str], None] | None = None) -> StagedFix:
    """Stage the fix; where the attention rewrite cannot be proven (the whole-model verification or the token proof
    fails with GroupQueryAttention written), stage it again with the model's own attention, saying why."""
    staged = _stage_fix(request, note)
    why = _attention_unproven(staged)
    if why is None:
        return staged
    staged.discard()
    (note or (lambda _m: None))(f"attention rewrite not proven ({why}): staging again with the original attention")
    again = _stage_fix(request, note, keep_attention=True)
    again.result.attention_kept = why
    return again


def _attention_unproven(staged: StagedFix) -> str | None:
    result = staged.result
    fusions = result.fusions
    if staged.folder is None or fusions is None or not fusions.counts.get("gqa_with_cache"):
        return None
    v = result.verification
    if v is not None and not v.passed:
        if result.tokens is not None and not result.tokens.passed:
            return f"the greedy tokens diverge: {result.tokens.why}"
        first = v.first_divergent
        return "the whole-model verification failed" + (f" (first divergent: {first.node})" if first else "")
    return None


def _stage_fix(request: FixRequest, note: Callable[[str], None] | None = None, *,
               keep_attention: bool = False) -> StagedFix:
    say = note or (lambda _m: None)
    files = resolve_model_path(request.model)
    kinds = fix_kinds(request.select, request.ignore)
    if keep_attention:
        kinds = tuple(k for k in kinds if k != FixKind.attention)
    say(f"loading {files.model}")
    original = load_model(files.model)
    graph = build_graph(original, str(files.model))
    refusal = ort_load_refusal(graph, request.target_ort)  # the policy's release; none: what no release loads
    if refusal is not None:
        raise InputError(refusal, files.model)
    source = WeightSource(original, files.model)
    inputs = model_reads(files.model, graph.external_data_files, files.genai_config)
    if request.policy:
        inputs.append(Path(request.policy))
    inputs += [Path(p) for p in request.policy_files]
    if request.check_output is not None:
        request.check_output(inputs)
    if Path(request.model).is_dir():
        inputs.append(Path(request.model))
    out = check_output_folder(request.output, inputs, force=request.force)
    out_identity = _identity(out)  # what --force may replace; nothing that appears at OUT later
    result = FixResult(str(files.model), str(out), kinds, nodes_before=len(original.graph.node), dry_run=request.dry_run)
    _ort_gate(result, request)

    fixed = onnx.ModelProto()
    fixed.CopyFrom(original)
    planned: list[PlannedTensor] = []
    if FixKind.moe in kinds:
        say("matching MoE blocks")
        rewrites, refusals = plan_moe(graph, request.target_ort)
        gate = moe_op_facts().swiglu_gate
        if request.target_ort and gate.affects(request.target_ort):
            for r in [r for r in rewrites if r.attributes.get("activation_type") == "swiglu"]:
                rewrites.remove(r)
                refusals.append(MoeRefusal(r.layer, r.anatomy.anchor.display_name,
                                           f"the deployment's onnxruntime {request.target_ort} (the policy's "
                                           "execution_provider.onnxruntime_version) computes MoE SwiGLU with "
                                           f"GPT-OSS constants whatever the attributes say ({gate.issue}, fixed by "
                                           f"{gate.fixed_by} in {gate.first_fixed_release}): the node would give "
                                           "wrong outputs there"))
        router = group_router_facts()
        if request.verify and not router.available(result.ort_installed):
            for r in [r for r in rewrites if r.group is not None]:
                rewrites.remove(r)
                refusals.append(MoeRefusal(r.layer, r.anatomy.anchor.display_name,
                                           f"routing written as com.microsoft.{router.op_type} + MoE for onnxruntime "
                                           f"{request.target_ort}, but the rewrite could not be proven here: the "
                                           f"onnxruntime {result.ort_installed or '(none)'} installed here has no "
                                           f"{router.op_type} ({router.first_release} adds it); run ortgate fix "
                                           f"where onnxruntime {router.first_release} or later is installed, or "
                                           "pass --no-verify"))
        if rewrites and result.ort_installed and moe_op_facts().swiglu_gate.affects(result.ort_installed):
            gate = moe_op_facts().swiglu_gate
            for r in [r for r in rewrites if r.attributes.get("activation_type") == "swiglu"]:
                rewrites.remove(r)
                refusals.append(MoeRefusal(r.layer, r.anatomy.anchor.display_name,
                                           f"the installed onnxruntime {result.ort_installed} computes SwiGLU with "
                                           f"GPT-OSS constants ({gate.issue}, fixed by {gate.fixed_by} in "
                                           f"{gate.first_fixed_release}): the rewrite could not be proven"))
        result.rewrites, result.refusals = rewrites, refusals
        planned = apply_moe(fixed, graph, rewrites)
    source.check_all(dict.fromkeys(weight_names(result.rewrites)))
    _inline_small(fixed, planned, source)
    fusion_kinds = tuple(k for k in kinds if k != FixKind.moe)
    if request.verify and not request.dry_run and (result.rewrites or fusion_kinds):
        say("timing a bounded session build of the original on ONNX Runtime CPU")
        result.original_build = measure_session_build(files.model, session_plan(request.session_setup))
        result.original_too_large = result.original_build.too_slow
    moe_only = onnx.ModelProto()
    if fusion_kinds and result.original_too_large:
        moe_only.CopyFrom(fixed)  # the fusions are then proven against this, not against the original
    if fusion_kinds:
        # onnxscript's passes read initializers (deduplication compares their bytes) and onnx_ir reads external
        # tensors its own way: a bad location, a missing or short data file is the user's, said here with the file
        # and the tensor, before any pass reads it.
        source.check_external()
        source.check_all([t.name for t in fixed.graph.initializer if t.name in source.tensors])
        say("running onnxscript's norm, rotary and attention fusions")
        fixed, result.fusions = run_fusions(fixed, fusion_kinds, files.model.parent, model_path=files.model,
                                            context_length=(request.genai or GenaiSettings()).context_length)
        result.gained_cache = int(result.fusions.options.get("gained_cache", 0))
    unfed = cache_not_fed_back(fixed)
    if unfed:
        result.warnings.append(unfed)
    decision = needs_keep_alive(request.target_ort, request.target_provider)
    result.keep_decision = decision
    if result.rewrites and decision.keep:
        result.kept_inputs = keep_inputs_alive(fixed)
        _note_kept(result)
    if result.rewrites and moe_only.graph.node and (decision.keep or _installed_affected(result)):
        keep_inputs_alive(moe_only)  # the fusions' reference runs here: it must not hit the defect either
    result.nodes_after = len(fixed.graph.node)
    kept_from_source = [t.name for t in fixed.graph.initializer if t.name in source.tensors]
    source.check_all(kept_from_source)
    if request.dry_run or not result.changed:
        return StagedFix(result, None, None, graph, files.model.parent, original)

    remove_stale_staging(out, inputs)
    try:
        folder = staging_folder(out)
    except OSError as exc:
        discard_own_staging(out)  # created, but its marker could not be written
        raise InputError(f"cannot create the folder beside it to write into: {exc.strerror or exc}", out) from None
    staged = StagedFix(result, folder, folder / files.model.name, graph, files.model.parent, original,
                       out_identity=out_identity)
    try:
        say(f"writing {len(fixed.graph.initializer)} tensors")
        _write(fixed, planned, source, staged)
        if files.genai_config:
            shutil.copyfile(files.genai_config, folder / files.genai_config.name)
        result.genai_config = write_or_keep(fixed, folder, files.model.name, request.genai or GenaiSettings(),
                                            files.genai_config).note
        result.files = sorted(p.name for p in folder.iterdir() if p.name != STAGING_MARKER)
        if request.verify:
            say("verifying on ONNX Runtime CPU")
            after_write(staged)
            plan = session_plan(request.session_setup)
            assert staged.model_file is not None
            if result.gained_cache:
                # past / present the original has not: no step feeds both alike; the tokens are the proof
                why = (f"the fixed model gained a KV cache ({result.gained_cache} layers): the original, recomputing "
                       "its whole sequence each step, and the fixed model, fed its own presents, are compared as "
                       "greedy tokens")
                unchecked = ("the outputs of single steps of both models on one input (their inputs differ: the "
                             "fixed model takes a cache)")
                result.verification = VerifyResult(True, mode="as tokens", notes=[why], not_checked=[unchecked])
            else:
                result.verification = _verify(original, files.model, fixed, staged.model_file, graph, result,
                                              moe_only, source, plan, request.runner_dims)
            _prove_tokens(result, files.model, staged.model_file, say)
    except OSError as exc:  # a full disk, a quota: said about OUT, not the staging folder
        staged.discard()
        raise InputError(f"cannot write: {exc.strerror or exc}", out) from None
    except BaseException:
        staged.discard()
        raise
    return staged


def _prove_tokens(result: FixResult, original: Path, fixed: Path, say: Callable[[str], None]) -> None:
    """Where attention became GroupQueryAttention, the delivered folder must generate the original's greedy tokens
    (ortgate.fix.generate); a divergence fails the verification."""
    v = result.verification
    if v is None or not v.passed:
        return
    if not (result.fusions and result.fusions.counts.get("gqa_with_cache")):
        return
    if not result.original_too_large:
        say("generating greedy tokens with the original and the fixed model")
        result.tokens = prove_tokens(original, fixed)
    if result.tokens is not None and not result.tokens.passed:
        v.passed = False
        v.notes.append(f"the greedy tokens diverge: {result.tokens.why}")
    elif result.tokens is None and result.gained_cache:
        # a cache-gaining rewrite has no other proof: unproven is failed
        v.passed = False
        v.notes.append("the tokens could not be generated with both models (the original is too large for a whole "
                       "session, or not a decoder with input_ids and logits): the new KV cache is not proven")


def after_write(staged: StagedFix) -> None:
    """Called once the staged folder is written, before it is verified (a seam: the folder is what will be
    delivered)."""


def _installed_affected(result: FixResult) -> bool:
    """Whether the onnxruntime installed here (which runs the verification, never decides what is written) is not
    known to compute the CPU MoE right in place."""
    return moe_op_facts().inplace_defect.status(result.ort_installed) != "fixed"


def _note_kept(result: FixResult) -> None:
    defect = moe_op_facts().inplace_defect
    kept = {k.node for k in result.kept_inputs}
    for rewrite in result.rewrites:
        if rewrite.node_name in kept:
            rewrite.notes.append(
                f"normalize_routing_weights=0: its input is kept alive past the node ({defect.workaround.form}), so "
                f"that ORT's CPU MoE kernel cannot take over the input's buffer (it computes such a node wrongly on "
                f"onnxruntime {', '.join(defect.releases_seen_affected)}; right from {defect.first_seen_fixed}; "
                "`ortgate explain moe-cpu-kernel-miscomputes`)")


def _verify(original: onnx.ModelProto, original_file: Path, fixed: onnx.ModelProto, fixed_file: Path, graph: Graph,
            result: FixResult, moe_only: onnx.ModelProto, source: WeightSource,
            plan: SessionPlan | None, dims: dict[str, int] | None = None) -> VerifyResult:
    """Whole model against whole model, both loaded from disk, when ORT can build a session of the original in
    reasonable time; else each MoE rewrite on its own block, and the fusions (if any) against the MoE-only model,
    which is small."""
    folder = fixed_file.parent
    original_dir = original_file.parent
    delivered, twin, kept = _as_verified(fixed, fixed_file, result)
    if not result.original_too_large:
        checked = verify(ModelSource(path=original_file), delivered, graph, _probes(graph, twin or fixed, kept),
                         _routers(result.rewrites), original_model=original, fixed_model=twin or fixed, plan=plan,
                         dims=dims)
        _note_twin(checked, result)
        return checked
    blocks = [BlockCheck(r.node_name, r.anatomy.hidden, r.output, r.anatomy.logits, r.anatomy.k or 1,
                         r.anatomy.hidden_size or 0)
              for r in result.rewrites]
    checked = verify_blocks(original, original_dir, fixed, folder, graph, blocks, dims=dims)
    limit = result.original_build.limit_s if result.original_build is not None else SESSION_BUILD_LIMIT_S
    checked.notes.append(f"ONNX Runtime did not build a session of the original ({len(original.graph.node):,} nodes) "
                         f"within {limit:g} s (a bounded build, stopped at the limit): each MoE rewrite was run "
                         "against its own block")
    checked.not_checked.append("the delivered model as a whole against the original: each MoE rewrite was run on "
                               "its own block from a synthesised hidden state, in a session of that block alone "
                               "(not the memory plan of the delivered graph), at one step (batch 1, "
                               "16 tokens, no KV cache step)")
    if checked.passed and moe_only.graph.node and result.fusions and any(x.applied for x in result.fusions.layers):
        _point_at_output(moe_only, fixed, source)
        inner_graph = build_graph(moe_only, str(folder / "moe-only.onnx"))
        whole = verify(ModelSource(data=moe_only.SerializeToString(), folder=folder), delivered,
                       inner_graph, _probes(inner_graph, twin or fixed, kept), [], original_model=moe_only,
                       fixed_model=twin or fixed, plan=plan, dims=dims)
        _note_twin(whole, result)
        checked.steps.extend(whole.steps)
        checked.not_checked.extend(whole.not_checked)
        checked.outputs.extend(whole.outputs)
        checked.max_rel_diff.update(whole.max_rel_diff)
        checked.probes.extend(whole.probes)
        checked.passed = whole.passed
        checked.first_divergent = checked.first_divergent or whole.first_divergent
        checked.notes.append("the norm, rotary and attention fusions were run whole-model against the model with "
                             "only the MoE rewrites")
    return checked


def _as_verified(fixed: onnx.ModelProto, fixed_file: Path, result: FixResult
                 ) -> tuple[ModelSource, onnx.ModelProto | None, list[KeptInput]]:
    """What the verification runs as the delivered model: the written file; or, when it was written for a deployment
    whose ORT computes the MoE right in place and the ORT installed here does not, the written graph plus the
    keep-alive form (its outputs are the MoE's bit for bit), reading the written folder's data file."""
    if not result.rewrites or result.kept_inputs or not _installed_affected(result):
        return ModelSource(path=fixed_file), None, result.kept_inputs
    twin = onnx.ModelProto()
    twin.CopyFrom(fixed)
    kept = keep_inputs_alive(twin)
    if not kept:
        return ModelSource(path=fixed_file), None, result.kept_inputs
    result.verified_with_keep_alive = True
    return ModelSource(data=twin.SerializeToString(), folder=fixed_file.parent), twin, kept


def _note_twin(checked: VerifyResult, result: FixResult) -> None:
    if not result.verified_with_keep_alive:
        return
    release = result.keep_decision.release if result.keep_decision else None
    checked.not_checked.append(
        f"the delivered graph's own memory plan on this machine: the onnxruntime {result.ort_installed} installed "
        "here computes a com.microsoft.MoE node wrongly when it takes over its input's buffer, which the "
        f"deployment's onnxruntime {release} does not; the delivered model was run with its MoE inputs kept alive "
        "past the node (Where(true, output, input), the same outputs bit for bit)")


def _point_at_output(model: onnx.ModelProto, written: onnx.ModelProto, source: WeightSource) -> None:
    """Make `model` (the MoE-only stage) load its tensors from the written output: same names, same bytes."""
    final = {t.name: t for t in written.graph.initializer}
    for tensor in model.graph.initializer:
        twin = final.get(tensor.name)
        if twin is not None and _same_tensor(tensor, twin):
            tensor.CopyFrom(twin)
        elif external_info(tensor) is not None and tensor.name in source.tensors:
            data = source.read(tensor.name)  # a tensor the fusions replaced: inlined for this check
            tensor.ClearField("external_data")
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = data.tobytes()


SMALL_PLANNED_BYTES = 64 * 1024


def _inline_small(model: onnx.ModelProto, planned: list[PlannedTensor], source: WeightSource) -> None:
    """Give the small new tensors (biases, tiny models' experts) their bytes now: onnxscript's optimizer reads small
    initializers. The large ones stay placeholders until they are streamed to the data file."""
    by_name = {t.name: t for t in planned}
    for tensor in model.graph.initializer:
        plan = by_name.get(tensor.name)
        if plan is None:
            continue
        size = itemsize(plan.data_type) or 4
        for d in plan.dims:
            size *= d
        if size <= SMALL_PLANNED_BYTES:
            sink = MemorySink()
            write_planned(plan, source, sink)
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = sink.value()


def _write(fixed: onnx.ModelProto, planned: list[PlannedTensor], source: WeightSource, staged: StagedFix) -> None:
    assert staged.folder is not None and staged.model_file is not None
    data_name = staged.model_file.name + ".data"
    out = DataFile(staged.folder / data_name)
    try:
        by_name = {t.name: t for t in planned}
        for tensor in fixed.graph.initializer:
            if tensor.name in by_name:
                offset, length = write_planned(by_name[tensor.name], source, out)
                set_external(tensor, data_name, offset, length)
            elif tensor.name in source.tensors and _same_tensor(tensor, source.tensors[tensor.name]):
                original = source.tensors[tensor.name]
                where = source.locate(tensor.name)
                if external_info(original) is not None or where.nbytes >= INLINE_LIMIT:
                    offset, length = source.copy_into(tensor.name, out)
                    set_external(tensor, data_name, offset, length)
            elif external_info(tensor) is None and len(tensor.raw_data) >= INLINE_LIMIT:
                offset, length = out.write(tensor.raw_data)
                set_external(tensor, data_name, offset, length)
            elif external_info(tensor) is not None:
                raise InputError(f"tensor {tensor.name!r} refers to external data ortgate did not write",
                                 staged.model_file)
    finally:
        out.close()
    if out.size == 0:
        os.unlink(out.path)
    with open(staged.model_file, "wb") as f:
        f.write(fixed.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def _same_tensor(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    return a.data_type == b.data_type and list(a.dims) == list(b.dims)


def _probes(graph: Graph, fixed: onnx.ModelProto, kept_inputs: list[KeptInput]) -> list[Probe]:
    """Outputs of rewritten nodes that the original graph computes under the same name, in the fixed graph's order."""
    fused = {op for ops in FUSED_OPS.values() for op in ops} | {("com.microsoft", "MoE")}
    kept = {k.output + KEEP_SUFFIX: k.output for k in kept_inputs}  # the Where passes the MoE output on
    probes = []
    for node in fixed.graph.node:
        domain = node.domain if node.domain not in ("", "ai.onnx") else "ai.onnx"
        if (domain, node.op_type) not in fused:
            continue
        for value in node.output:
            value = kept.get(value, value)
            producer = graph.producer(value) if value else None
            if producer is not None and producer.op_type != node.op_type:
                probes.append(Probe(node.name or f"<{node.op_type}>", value))
    return probes


def _routers(rewrites: list[MoeRewrite]) -> list[tuple[str, int]]:
    return [(r.anatomy.logits, r.anatomy.k or 1) for r in rewrites]


def _ort_gate(result: FixResult, request: FixRequest) -> None:
    try:
        import onnxruntime

        result.ort_installed = onnxruntime.__version__
    except ImportError:
        result.ort_installed = None
    result.ort_target = request.target_ort
    gate = moe_op_facts().swiglu_gate
    if request.target_ort and gate.affects(request.target_ort):
        result.warnings.append(
            f"the policy's target onnxruntime {request.target_ort} computes MoE SwiGLU with GPT-OSS constants "
            f"whatever the attributes say ({gate.issue}; fixed by {gate.fixed_by} in {gate.first_fixed_release}): "
            f"no SiLU-gated MoE node is written for it; deploy onnxruntime >= {gate.first_fixed_release}")
