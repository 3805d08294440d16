"""Broken and hostile inputs: ortgate answers each with a report or one error line, never a crash, a hang,
a read outside its inputs, or a write over them.

The corpus (tests/corpus/, written by make_corpus.py) lists every file with its expected answer in
MANIFEST.yaml. Inputs too large to commit (a > 2 GiB model, a million-node graph) are made here.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import signal
import sys
from pathlib import Path

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

import ortgate
from ortgate.config.source import MAX_DOCUMENT_BYTES, MAX_NESTING
from ortgate.errors import InputError
from ortgate.graph import build_graph
from ortgate.graph.load import PROTOBUF_LIMIT, load_model
from tests.conftest import POLICIES, REPO
from tests.helpers import run_cli

CORPUS = REPO / "tests" / "corpus"
MANIFEST = yaml.safe_load((CORPUS / "MANIFEST.yaml").read_text())
BASE = CORPUS / "models" / "base.onnx"
# Files that are only helpers of other entries (the model beside an escaping genai_config.json).
HELPERS = {"configs/escaping-filename/model.onnx", "configs/escaping-filename/genai_config.json"}


def _load_corpus_maker():
    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_one_line_error(code: int, out: str, err: str, *, names: Path, contains: str) -> None:
    assert code == 2, (code, out[-500:], err)
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"ortgate: error: {names}"), err
    assert contains in err, err
    assert "Traceback" not in err


def assert_report(code: int, out: str, err: str, *, expected: int) -> None:
    assert (code, err) == (expected, ""), (code, err, out[-2000:])
    assert "Traceback" not in out


def _digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


# ---- the corpus -----------------------------------------------------------------------------------------


def test_corpus_files_are_exactly_what_make_corpus_writes(tmp_path):
    maker = _load_corpus_maker()
    written = maker.build(tmp_path)
    for name, data in written.items():
        assert (CORPUS / name).read_bytes() == data, f"{name} is stale: run python tests/corpus/make_corpus.py"
    on_disk = {str(p.relative_to(CORPUS)) for d in ("models", "configs", "policies") for p in (CORPUS / d).rglob("*")
               if p.is_file()}
    assert on_disk == set(written), "files in tests/corpus that make_corpus.py does not write"


def test_every_corpus_file_has_an_expected_answer():
    maker = _load_corpus_maker()
    listed = {e["file"] for section in MANIFEST.values() for e in section}
    for name in maker.FILES:
        if name not in HELPERS:
            assert name in listed or str(Path(name).parent) in listed, f"{name} has no entry in MANIFEST.yaml"
    assert all((CORPUS / name).exists() for name in listed)


def _entries(section: str):
    return [pytest.param(e, id=e["file"]) for e in MANIFEST[section]]


@pytest.mark.parametrize("entry", _entries("models"))
def test_model(entry):
    path = CORPUS / entry["file"]
    before = _digest(path)
    code, out, err = run_cli("lint", path)
    if entry["exit"] == 2:
        assert_one_line_error(code, out, err, names=CORPUS / entry.get("names", entry["file"]), contains=entry["error"])
    else:
        assert_report(code, out, err, expected=entry["exit"])
    assert _digest(path) == before, "the input was modified"


@pytest.mark.parametrize("entry", _entries("configs"))
def test_genai_config(entry):
    path = CORPUS / entry["file"]
    code, out, err = run_cli("lint", BASE, "--config", path)
    if entry["exit"] == 2:
        assert_one_line_error(code, out, err, names=path, contains=entry["error"])
    else:
        assert_report(code, out, err, expected=entry["exit"])


@pytest.mark.parametrize("entry", _entries("policies"))
def test_policy(entry):
    path = CORPUS / entry["file"]
    names = CORPUS / entry.get("names", entry["file"])
    code, out, err = run_cli("policy", "validate", path)
    if entry["exit"] == 2:
        assert_one_line_error(code, out, err, names=names, contains=entry["error"])
    else:
        assert (code, err) == (0, "") and "valid policy" in out
    lint_exit, lint_error = entry.get("lint_exit", entry["exit"]), entry.get("lint_error", entry.get("error"))
    code, out, err = run_cli("lint", BASE, "--policy", path)
    if lint_exit == 2:
        assert_one_line_error(code, out, err, names=names, contains=lint_error)
    else:
        assert_report(code, out, err, expected=lint_exit)


def test_nested_subgraphs_are_indexed_without_recursion():
    """25 If levels parse; every level's nodes are in the index, each with its subgraph path."""

    graph = build_graph(load_model(CORPUS / "models" / "nested-if-25.onnx"), "nested")
    ifs = graph.by_op("", "If")
    assert len(ifs) == 25
    deepest = max(graph.nodes, key=lambda n: (n.graph or "").count("/"))
    assert deepest.graph.count("then_branch") == 24


def test_control_characters_in_names_do_not_forge_report_lines():
    code, out, err = run_cli("lint", CORPUS / "models" / "control-characters.onnx")
    assert code == 1 and err == ""
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    # The node name held "\nPASS  0 errors": the only verdict line is the real one.
    verdicts = [line for line in out.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(verdicts) == 1 and verdicts[0].startswith("FAIL"), out
    assert "/model/layers.0/moe/gate\\nPASS  0 errors\\x1b[2K\\r" in out


def test_input_error_messages_are_one_printable_line():
    err = InputError("bad\nvalue \x1b[31mred\x07" + "x" * 5000, "dir/na\nme.yaml", line=3)
    text = err.one_line()
    assert text.isprintable() and len(text) < 1200
    assert text.startswith("dir/na\\nme.yaml:3: bad value \\x1b[31mred\\x07xxx")
    assert "characters]..." in text


# ---- never read outside the inputs ---------------------------------------------------------------------

_OPENED: list[str] = []
_RECORDING = [False]


def _audit(event: str, args) -> None:
    if _RECORDING[0] and event in ("open", "os.open"):
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            _OPENED.append(os.path.realpath(os.fsdecode(path)))


sys.addaudithook(_audit)  # hooks cannot be removed: it records only inside `opened_files`


@contextlib.contextmanager
def opened_files():
    _OPENED.clear()
    _RECORDING[0] = True
    try:
        yield _OPENED
    finally:
        _RECORDING[0] = False


# Where Python and ortgate load their own code and data from (lazy imports, knowledge tables, the schema).
_CODE_ROOTS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   Path(ortgate.__file__).parent)})


def assert_reads_only(opened: list[str], inputs: list[Path], never: list[Path]) -> None:
    allowed = {os.path.realpath(p) for p in inputs}
    forbidden = {os.path.realpath(p) for p in never}
    assert not forbidden & set(opened), f"opened {sorted(forbidden & set(opened))}"
    strays = [p for p in opened if p not in allowed and not p.startswith(_CODE_ROOTS)]
    assert not strays, f"read outside the inputs: {strays}"


def _copy_corpus_model(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "model.onnx"
    shutil.copy(CORPUS / name, target)
    return target


def test_missing_external_data_is_linted_and_present_external_data_never_opened(tmp_path):
    model = _copy_corpus_model("models/missing-external-data/model.onnx", tmp_path / "m")
    run_cli("lint", model)  # imports everything lint needs once, outside the recording
    data = model.with_name("model.onnx.data")
    data.write_bytes(b"\0" * 64)  # now the weights exist: still never opened
    with opened_files() as opened:
        code, out, err = run_cli("lint", model, "--policy", POLICIES / "tiny-moe-cpu.yaml", "--format", "sarif")
    assert code in (0, 1) and err == ""
    assert os.path.realpath(model) in opened
    assert_reads_only(opened, [model, POLICIES / "tiny-moe-cpu.yaml"], never=[data])


@pytest.mark.parametrize("name, target", [
    ("models/subgraph-escaping-external-data/model.onnx", "outside.data"),  # '../outside.data' from m/
    ("models/escaping-external-data/model.onnx", "m/weights.data"),  # beside it, but the model also escapes
])
def test_escaping_external_data_is_refused_without_opening_anything_it_names(tmp_path, name, target):
    model = _copy_corpus_model(name, tmp_path / "m")
    (tmp_path / target).write_bytes(b"\0" * 64)
    with opened_files() as opened:
        code, out, err = run_cli("lint", model)
    assert_one_line_error(code, out, err, names=model, contains="is outside the model's folder")
    assert_reads_only(opened, [model], never=[tmp_path / target, Path("/etc/passwd")])


def test_genai_config_naming_a_decoder_outside_its_folder_is_not_followed(tmp_path):
    folder = tmp_path / "genai"
    shutil.copytree(CORPUS / "configs" / "escaping-filename", folder)
    with opened_files() as opened:
        code, out, err = run_cli("lint", folder)
    assert_one_line_error(code, out, err, names=folder / "genai_config.json", contains="model.decoder.filename")
    assert_reads_only(opened, [folder / "genai_config.json"], never=[Path("/etc/passwd"), folder / "model.onnx"])


def test_real_exporter_folder_reads_the_model_and_config_never_the_weights():
    folder = REPO / "tests" / "fixtures" / "exported" / "genai-qwen3_5_moe-fp32-cpu"
    with opened_files() as opened:
        code, out, err = run_cli("lint", folder, "--format", "json")
    assert code in (0, 1) and err == ""
    assert_reads_only(opened, [folder / "model.onnx", folder / "genai_config.json"],
                      never=[folder / "model.onnx.data"])


# ---- sizes, devices, depth ------------------------------------------------------------------------------


def test_model_over_2_gib_is_refused_before_a_byte_is_read(tmp_path):
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:  # sparse: no disk used
        f.write(BASE.read_bytes())
        f.truncate(PROTOBUF_LIMIT + 1)
    with opened_files() as opened:
        code, out, err = run_cli("lint", path)
    assert_one_line_error(code, out, err, names=path, contains="file is 2.0 GiB; an ONNX protobuf cannot exceed 2 GiB")
    assert os.path.realpath(path) not in opened


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail instead of hanging when a read blocks (a FIFO with no writer blocks in open())."""

    def expired(*_):
        raise AssertionError(f"still blocked after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("role", ["model", "policy", "config", "optimized"])
def test_fifo_inputs_are_refused_without_blocking(tmp_path, role):
    fifo = tmp_path / f"{role}.fifo"
    os.mkfifo(fifo)
    args = {"model": ["lint", fifo], "policy": ["lint", BASE, "--policy", fifo],
            "config": ["lint", BASE, "--config", fifo], "optimized": ["lint", BASE, "--optimized", fifo]}[role]
    with deadline(20):
        code, out, err = run_cli(*args)
    assert_one_line_error(code, out, err, names=fifo, contains="not a regular file")


def test_policy_over_the_size_limit_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("name: big\ndescription: '" + "x" * MAX_DOCUMENT_BYTES + "'\n")
    code, out, err = run_cli("policy", "validate", path)
    assert_one_line_error(code, out, err, names=path, contains="configuration files over 1048576 bytes are refused")


def test_yaml_nesting_limit_is_just_above_what_a_policy_needs(tmp_path):
    nested = "name: deep\nrules:\n  severity:\n" + "".join(f"{'  ' * (i + 2)}k{i}:\n" for i in range(MAX_NESTING))
    path = tmp_path / "deep.yaml"
    path.write_text(nested + "  " * (MAX_NESTING + 2) + "x: 1\n")
    code, out, err = run_cli("policy", "validate", path)
    assert_one_line_error(code, out, err, names=path, contains=f"YAML nesting is too deep (more than {MAX_NESTING} levels)")
    # Real policies are about 4 levels deep: every shipped one validates.
    for policy in sorted(POLICIES.glob("*.yaml")):
        assert run_cli("policy", "validate", policy)[0] == 0


def test_wide_policy_extending_a_wide_parent_loads_in_linear_time(tmp_path):
    """Merging an N-key mapping over its parent's: key by key, never every key against every key.

    Work is counted as lines executed in ortgate's policy code (deterministic, whatever the machine's load):
    four times the keys must cost about four times the lines, where every-key-against-every-key costs sixteen."""
    import sys

    import ortgate.config.policy as policy_module

    def executed_lines(keys: int) -> int:
        block = "model:\n  required_ops:\n" + "".join(f"    op{i}: 1\n" for i in range(keys))
        folder = tmp_path / str(keys)
        folder.mkdir()
        (folder / "base.yaml").write_text("name: base\n" + block)
        child = folder / "child.yaml"
        child.write_text("name: child\nextends: base.yaml\n" + block)
        count = 0

        def tracer(frame, event, _arg):
            nonlocal count
            if frame.f_code.co_filename != policy_module.__file__:
                return None
            if event == "line":
                count += 1
            return tracer

        sys.settrace(tracer)
        try:
            policy_module.load_policy(child)
        finally:
            sys.settrace(None)
        return count

    small, large = executed_lines(500), executed_lines(2_000)
    assert small > 500  # the tracer sees the merge
    assert large / small < 6, f"{small} lines for 500 keys, {large} for 2,000: not linear"


def test_billion_element_shapes_allocate_nothing():
    """Inputs of 10^27 elements, a 2^40 x 2^40 initializer, a Constant of 10^18: metadata only."""
    import tracemalloc

    run_cli("lint", BASE)  # imports outside the measurement
    tracemalloc.start()
    try:
        code, out, err = run_cli("lint", CORPUS / "models" / "huge-dims.onnx", "--format", "json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (code, err) == (1, "")
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_run_refuses_to_synthesise_an_input_of_a_hostile_size(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [100_000, 100_000, 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [100_000, 100_000, 1000])])
    model = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), model)
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: cpu\nextends: builtin:cpu\nrunner: {batch_size: 1, warmup: 1, iterations: 1}\n")
    code, out, err = run_cli("run", model, "--policy", policy)
    assert_one_line_error(code, out, err, names=policy,
                          contains="input 'x' would have shape [100000, 100000, 1000]: more than 16 GiB")


def test_long_chain_graph_is_linted_without_recursion(tmp_path):
    n = 20_000
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"/model/layers.{i // 1000}/relu{i}")
             for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info(f"v{n}", TensorProto.FLOAT, [1])])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    code, out, err = run_cli("lint", path, "--format", "json")
    assert (code, err) == (0, "")


def test_invalid_utf8_names_are_refused_naming_the_field(tmp_path):
    data = BASE.read_bytes()
    at = data.index(b"/model/layers.0/mlp/act/Relu")
    path = tmp_path / "latin1.onnx"
    path.write_bytes(data[:at + 1] + b"\xe9" + data[at + 2:])  # "/\xe9odel/...": not UTF-8
    code, out, err = run_cli("lint", path)
    assert_one_line_error(code, out, err, names=path, contains="not an ONNX model: NodeProto.name b'/\\xe9odel")


@pytest.mark.skipif(os.environ.get("ORTGATE_SLOW") != "1", reason="a million-node graph: ORTGATE_SLOW=1 runs it")
@pytest.mark.slow
def test_million_node_graph_is_linted(tmp_path):
    n = 1_000_000
    graph = onnx.GraphProto(name="million")
    for i in range(n):
        graph.node.add(op_type="Relu", name=f"/model/layers.{i // 20_000}/relu{i}", input=[f"v{i}"], output=[f"v{i + 1}"])
    graph.input.append(helper.make_tensor_value_info("v0", TensorProto.FLOAT, [1]))
    graph.output.append(helper.make_tensor_value_info(f"v{n}", TensorProto.FLOAT, [1]))
    path = tmp_path / "million.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    code, out, err = run_cli("lint", path, "--format", "json")
    assert (code, err) == (0, "")


# ---- every error path of the command line --------------------------------------------------------------

MISSING = "no-such-file.onnx"


@pytest.mark.parametrize("argv, contains", [
    ([], "a command is required"),
    (["bogus"], "argument command: invalid choice: 'bogus'"),
    (["--nope"], "unrecognized arguments: --nope"),
    (["lint"], "the following arguments are required: model"),
    (["lint", str(BASE), "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["lint", str(BASE), "--fail-on", "sometimes"], "argument --fail-on: invalid choice"),
    (["lint", str(BASE), "--nope"], "unrecognized arguments: --nope"),
    (["lint", MISSING], f"{MISSING}: no such file or directory"),
    (["lint", str(BASE), "--policy", MISSING], f"{MISSING}: no such file"),
    (["lint", str(BASE), "--config", MISSING], f"{MISSING}: no such file"),
    (["lint", str(BASE), "--optimized", MISSING], f"{MISSING}: no such file"),
    (["lint", str(CORPUS / "models")], "folder holds no model.onnx"),
    (["lint", str(BASE), "--policy", str(CORPUS / "policies")], "is a directory, expected a file"),
    (["lint", str(BASE), "--select", "no-such-rule"], "--select: unknown rule 'no-such-rule'"),
    (["lint", str(BASE), "--ignore", "OGZ"], "--ignore: unknown rule 'OGZ'"),
    (["lint", str(BASE), "--output", str(BASE)], "refusing to write the report over an input file"),
    (["lint", str(BASE), "--output", str(CORPUS)], "is a directory"),
    (["lint", str(BASE), "--output", "no-such-folder/report.txt"], "its folder does not exist"),
    (["lint", str(BASE), "--output", "/dev/full"], "/dev/full: cannot write: No space left on device"),
    (["lint", str(BASE), "--output", "same.sarif", "--sarif", "same.sarif"], "two outputs would be written to the same"),
    (["lint", str(BASE), "--baseline", MISSING], f"{MISSING}: no such file"),
    (["lint", str(BASE), "--baseline", str(BASE)], "not a UTF-8 text file"),
    (["lint", str(BASE), "--baseline", str(CORPUS / "configs" / "nan.json")], "not an ortgate baseline"),
    (["lint", str(BASE), "--write-baseline", str(BASE)], "refusing to write the baseline over an input file"),
    (["rules", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["explain"], "the following arguments are required: CODE|NAME"),
    (["explain", "moe-not-fussed"], "unknown rule 'moe-not-fussed'; did you mean 'moe-not-fused'?"),
    (["policy"], "policy: a subcommand is required: validate"),
    (["policy", "frob"], "argument policy_command: invalid choice: 'frob'"),
    (["policy", "validate"], "the following arguments are required: FILE"),
    (["policy", "validate", MISSING], f"{MISSING}: no such file"),
    (["run", str(BASE)], "the following arguments are required: --policy"),
    (["run", MISSING, "--policy", str(POLICIES / "tiny-moe-cpu.yaml")], f"{MISSING}: no such file or directory"),
    (["run", str(BASE), "--policy", str(CORPUS / "policies" / "alias-bomb.yaml")], "YAML aliases"),
    (["run", str(BASE), "--policy", str(POLICIES / "tiny-moe-cpu.yaml"), "--timeout", "soon"],
     "argument --timeout: invalid float value: 'soon'"),
    (["run", str(BASE), "--policy", str(POLICIES / "tiny-moe-cpu.yaml"), "--dump", str(BASE)],
     "refusing to write the optimized dump over an input file"),
])
def test_every_command_line_error_is_one_line(argv, contains):
    before = _digest(BASE)
    code, out, err = run_cli(*argv)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("ortgate: error: ") and err.count("\n") == 1, err
    assert contains in err, err
    assert _digest(BASE) == before


def test_write_baseline_never_overwrites_a_file_that_is_not_a_baseline(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    code, out, err = run_cli("lint", BASE, "--write-baseline", notes)
    assert_one_line_error(code, out, err, names=notes, contains="the file exists and is not an ortgate baseline")
    assert notes.read_text() == '{"mine": true}\n'


# ---- custom-op libraries and --timeout (ortgate run) -----------------------------------------------------


@pytest.fixture
def run_folder(tmp_path):
    """A model ORT runs on CPU, a policy naming a custom-op library, and a 'library' that is not one."""
    shutil.copy(BASE, tmp_path / "model.onnx")
    shutil.copy(CORPUS / "models" / "custom-ops.onnx", tmp_path / "custom.onnx")
    (tmp_path / "libevil.so").write_bytes(b"not a shared library")
    (tmp_path / "policy.yaml").write_text(
        "name: custom\nextends: builtin:cpu\nrunner: {batch_size: 1, warmup: 1, iterations: 2}\n"
        "session:\n  free_dimension_overrides: {batch: 1}\n  custom_op_libraries: [libevil.so]\n")
    return tmp_path


def test_run_never_loads_a_custom_op_library_without_the_flag(run_folder):
    # The policy names a library ORT could not load: the run succeeding proves it was never loaded.
    code, out, err = run_cli("run", run_folder / "model.onnx", "--policy", run_folder / "policy.yaml")
    assert_report(code, out, err, expected=0)
    # A model that needs the custom ops is refused: loading the library would run its code.
    code, out, err = run_cli("run", run_folder / "custom.onnx", "--policy", run_folder / "policy.yaml")
    assert_one_line_error(code, out, err, names=run_folder / "policy.yaml",
                          contains="loads them only with --allow-custom-ops")


def test_run_loads_the_named_library_only_with_the_flag(run_folder):
    code, out, err = run_cli("run", run_folder / "model.onnx", "--policy", run_folder / "policy.yaml",
                             "--allow-custom-ops")
    assert_one_line_error(code, out, err, names=run_folder / "libevil.so",
                          contains="custom-op library could not be loaded")


def test_run_timeout_stops_with_a_report_that_says_so(run_folder):
    code, out, err = run_cli("run", run_folder / "model.onnx", "--policy", run_folder / "policy.yaml",
                             "--timeout", "0.000001")
    assert code == 1 and err == ""
    assert "run-timeout" in out and "the run passed --timeout 1e-06s while " in out and "FAIL" in out


def test_escaping_location_in_a_tensor_attribute_is_found_beside_valid_initializer_locations(tmp_path):
    """The search may stop after the initializers only when they hold every "location" in the file."""
    from onnx import TensorProto, helper

    from ortgate.graph.load import load_model

    def external(name: str, location: str) -> TensorProto:
        t = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
        t.ClearField("float_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=location)
        return t

    constant = helper.make_node("Constant", [], ["c"], value=external("c_value", "../../etc/passwd"))
    add = helper.make_node("Add", ["w", "c"], ["y"])
    graph = helper.make_graph([constant, add], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              initializer=[external("w", "model.onnx.data")])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(graph, ir_version=10).SerializeToString())
    with pytest.raises(InputError, match="'../../etc/passwd' is outside the model's folder"):
        load_model(path)


def test_op_types_and_value_names_cannot_forge_report_lines(tmp_path, write_policy):
    """Messages quote op types and value names from the model: control characters come out escaped."""
    from onnx import TensorProto, helper

    from tests.helpers import lint_findings

    evil = "Op\x1b[2J\r::error::forged"
    node = helper.make_node(evil, ["x"], ["y\x07"], domain="custom.domain")
    relu = helper.make_node("Relu", ["y\x07"], ["z"])
    graph = helper.make_graph([node, relu], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("custom.domain", 1)]).SerializeToString())
    policy = write_policy("name: p\nexecution_provider: {name: CUDAExecutionProvider}\n")
    found = lint_findings(path, policy)
    quoting = [f for f in found if "forged" in f.message or (f.op_type and "forged" in f.op_type)]
    assert quoting, "some finding names the custom op"
    for f in found:
        assert f.message.isprintable() and (f.op_type or "").isprintable() and (f.fix or "").isprintable()
