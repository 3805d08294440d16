"""Sessions built from the policy, and the checks that prove each setting took effect (real ORT, CPU provider)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from ortgate.config.deployment import setup_from_policy
from ortgate.config.policy import load_policy
from ortgate.errors import InputError
from ortgate.graph import build_graph
from ortgate.graph.load import load_model
from ortgate.runner import session as rs
from ortgate.runner.inputs import graph_signature, session_signature
from tests.conftest import EXPORTED

QWEN35 = EXPORTED / "genai-qwen3_5_moe-fp32-cpu" / "model.onnx"
CUDA_AVAILABLE = rs.provider_availability("CUDAExecutionProvider")[0]


def setup_of(write_policy, text: str):
    return setup_from_policy(load_policy(write_policy(text)))


def test_session_options_come_from_the_policy(write_policy):
    setup = setup_of(write_policy, "name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_BASIC\n"
                                   "  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n"
                                   "  config_entries: {session.disable_prepacking: true}\n"
                                   "  intra_op_num_threads: 1\n  execution_mode: ORT_SEQUENTIAL\n")
    import onnxruntime as ort

    so, providers = setup.ort_session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.intra_op_num_threads == 1 and so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert so.get_session_config_entry("session.disable_prepacking") == "1"  # YAML true -> ORT's "1"
    assert providers == [("CPUExecutionProvider", {})]
    built = rs.create_session(str(QWEN35), setup)
    shapes = {i.name: i.shape for i in built.session.get_inputs()}
    assert shapes["input_ids"] == [1, 1] and shapes["position_ids"] == [3, 1, 1]


@pytest.mark.skipif(CUDA_AVAILABLE, reason="this machine has CUDA")
def test_cuda_is_listed_but_cannot_be_created_here():
    import onnxruntime as ort

    assert "CUDAExecutionProvider" in ort.get_available_providers()  # listed by onnxruntime-gpu ...
    available, reason = rs.provider_availability("CUDAExecutionProvider")
    assert not available and reason  # ... but not creatable: ORT's own reason, not a traceback
    assert "[ONNXRuntimeError]" not in reason and "\n" not in reason


def test_cpu_is_always_available():
    assert rs.provider_availability("CPUExecutionProvider") == (True, None)


def test_cpu_provider_options_are_not_applied(write_policy):
    # The CPU provider ignores every provider option: get_provider_options() reports none of them.
    setup = setup_of(write_policy, "name: p\nexecution_provider:\n  name: CPUExecutionProvider\n"
                                   "  options: {arena_extend_strategy: kSameAsRequested}\n")
    built = rs.create_session(str(QWEN35), setup)
    effective = built.session.get_provider_options()["CPUExecutionProvider"]
    [check] = rs.option_checks(setup, effective)
    assert check.key == "arena_extend_strategy" and not check.applied and check.effective is None
    assert check.location.line == 4


@pytest.mark.parametrize("requested, effective, applied", [
    ("1", "1", True), (True, "1", True), ("true", "1", True), ("True", "1", True), ("0", "false", True),
    ("1", "0", False), ("kNextPowerOfTwo", "kSameAsRequested", False), ("0", None, False),
])
def test_options_compare_the_way_ort_parses_them(write_policy, requested, effective, applied):
    value = requested if isinstance(requested, bool) else f'"{requested}"'
    setup = setup_of(write_policy, f"name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n"
                                   f"  options: {{enable_cuda_graph: {value}}}\n")
    reported = {} if effective is None else {"enable_cuda_graph": effective}
    [check] = rs.option_checks(setup, reported)
    assert check.applied is applied


def test_overrides_pinned_or_matching_no_dim(write_policy):
    setup = setup_of(write_policy, "name: p\nsession:\n  free_dimension_overrides: {batch_size: 1, batch: 1}\n")
    built = rs.create_session(str(QWEN35), setup)
    model = build_graph(load_model(QWEN35), str(QWEN35))
    checks = {c.dim: c for c in rs.dim_checks(setup, graph_signature(model), session_signature(built.session))}
    assert checks["batch_size"].status == "pinned" and "input_ids[0]" in checks["batch_size"].inputs
    assert checks["batch"].status == "no-such-dim"


def test_override_still_symbolic_is_unresolved(write_policy):
    setup = setup_of(write_policy, "name: p\nsession:\n  free_dimension_overrides: {batch_size: 1}\n")
    spec = [rs_spec("input_ids", ("batch_size", "sequence_length"))]
    [check] = rs.dim_checks(setup, spec, spec)  # the session still reports batch_size symbolic
    assert check.status == "unresolved" and check.inputs == ("input_ids[0]",)


def rs_spec(name, shape):
    from ortgate.runner.inputs import InputSpec

    return InputSpec(name, TensorProto.INT64, shape)


def test_placement_counts_nodes_per_provider(write_policy):
    setup = setup_of(write_policy, "name: p\n")
    built = rs.create_session(str(QWEN35), setup, record_placement=True)
    placement = rs.placement(built.session)
    assert set(placement) == {"CPUExecutionProvider"}
    assert placement["CPUExecutionProvider"]["MoE"] == 4


def test_optimized_dump_is_written(write_policy, tmp_path):
    setup = setup_of(write_policy, "name: p\n")
    dump = tmp_path / "opt.onnx"
    built = rs.create_session(str(EXPORTED / "dynamo-qwen3_moe" / "model.onnx"), setup, dump_path=str(dump))
    assert built.dump.path == str(dump) and dump.is_file()
    ops = {n.op_type for n in onnx.load(str(dump)).graph.node}
    assert "FusedMatMul" in ops  # ORT_ENABLE_ALL on CPU fuses MatMul + scale


def test_session_creation_failure_is_one_line(tmp_path, write_policy):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.STRING, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [1])])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    with pytest.raises(InputError) as err:
        rs.create_session(str(path), setup_of(write_policy, "name: p\n"))
    assert err.value.problem.startswith("policy session creation failed:") and "\n" not in err.value.problem
    assert err.value.path == str(path)


def custom_op_model(tmp_path):
    graph = helper.make_graph([helper.make_node("FastTokenize", ["x"], ["y"], domain="com.example.text")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.example.text", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    return build_graph(model, str(path))


def test_custom_ops_without_a_library_are_an_input_error(tmp_path, write_policy):
    graph = custom_op_model(tmp_path)
    assert rs.custom_op_domains(graph) == {"com.example.text": ["FastTokenize"]}
    with pytest.raises(InputError, match="custom ops .com.example.text: FastTokenize."):
        rs.custom_op_libraries(graph, setup_of(write_policy, "name: p\n"), allowed=True)


def test_custom_op_library_is_loaded_only_with_the_flag(tmp_path, write_policy):
    graph = custom_op_model(tmp_path)
    (tmp_path / "libtext_ops.so").write_bytes(b"")
    setup = setup_of(write_policy, "name: p\nsession:\n  custom_op_libraries: [libtext_ops.so]\n")
    with pytest.raises(InputError) as err:
        rs.custom_op_libraries(graph, setup, allowed=False)
    assert "--allow-custom-ops" in err.value.problem and err.value.line == 3
    assert rs.custom_op_libraries(graph, setup, allowed=True) == [str(tmp_path / "libtext_ops.so")]


def test_builtin_contrib_domains_are_not_custom():
    graph = build_graph(load_model(QWEN35), str(QWEN35))  # com.microsoft MoE, GQA, LinearAttention, ...
    assert rs.custom_op_domains(graph) == {}


def test_ort_messages_keep_errors_without_colours():
    text = ("\x1b[1;31m2026-11-29 10:12:06 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] "
            "/src/x.cc:2043 Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library libcuda.so\x1b[m\n"
            "unrelated line\nEP Error: bad option using ['CUDAExecutionProvider']\n")
    assert rs.ort_messages(text) == ["E: Failed to load library libcuda.so",
                                     "EP Error: bad option using ['CUDAExecutionProvider']"]


def test_captured_output_keeps_stdout_clean(capfd):
    import os

    with rs.captured_output() as out:
        print("EP Error: from python")
        os.write(1, b"native stdout\n")
        os.write(2, b"native stderr\n")
    assert "EP Error: from python" in out.text and "native stdout" in out.text and "native stderr" in out.text
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
