"""ortgate.knowledge: the kernel table (generated data) and the provider option catalogs (curated data)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from ortgate.knowledge import (
    KernelTable,
    Support,
    canonical_provider_name,
    genai_graph_optimization_levels,
    genai_provider_name,
    graph_capture_option,
    graph_optimization_levels,
    is_known_session_config_key,
    kernel_table,
    normalize_dtype,
    ort_facts,
    provider_catalog,
    run_config_key,
    session_config_key,
    suggest_session_config_key,
)
from ortgate.knowledge.providers import OPTION_TYPES, PROVIDER_OPTIONS_JSON, catalog_providers

REPO = Path(__file__).resolve().parent.parent
KNOWLEDGE = REPO / "ortgate" / "knowledge"
SCRIPT = REPO / "scripts" / "gen_kernel_table.py"

CPU, CUDA, DML = "CPUExecutionProvider", "CUDAExecutionProvider", "DmlExecutionProvider"
MS = "com.microsoft"
NEW_OPS = ["LinearAttention", "LinearAttentionGate", "CausalConvWithState", "GatedRMSNorm", "GatedAdd", "GatedDeltaNet"]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_kernel_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_kernel_table"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def raw():
    return json.loads((KNOWLEDGE / "kernels.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def kt() -> KernelTable:
    return kernel_table()


# ---- the committed table is what the committed source generates ------------------------------------------------------


def test_committed_kernel_table_is_not_stale(gen):
    rendered = gen.render(gen.build_table(gen.DEFAULT_SOURCE, gen.DEFAULT_COMMIT_FILE))
    committed = (KNOWLEDGE / "kernels.json").read_text(encoding="utf-8")
    assert committed == rendered, "kernels.json is stale: run scripts/gen_kernel_table.py and commit the result"


def test_check_mode_exit_codes(gen, tmp_path, capsys):
    assert gen.main(["--check"]) == 0
    stale = tmp_path / "kernels.json"
    stale.write_text((KNOWLEDGE / "kernels.json").read_text(encoding="utf-8").replace('"since": 13', '"since": 12', 1))
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert gen.main(["--check", "--output", str(tmp_path / "missing.json")]) == 1


def test_generation_is_deterministic_and_writes(gen, tmp_path):
    out = tmp_path / "k.json"
    assert gen.main(["--output", str(out)]) == 0
    first = out.read_bytes()
    assert gen.main(["--output", str(out)]) == 0
    assert out.read_bytes() == first == (KNOWLEDGE / "kernels.json").read_bytes()


def test_sources_are_in_the_repo():
    # CI runs from a clean clone: the table's source must be committed next to it.
    assert (KNOWLEDGE / "sources" / "OperatorKernels.md").is_file()
    assert (KNOWLEDGE / "sources" / "SOURCE_COMMIT.txt").is_file()


def test_metadata(raw, kt):
    sha = re.search(
        r"OperatorKernels\.md\s+at commit ([0-9a-f]{40})",
        (KNOWLEDGE / "sources" / "SOURCE_COMMIT.txt").read_text(encoding="utf-8"),
    ).group(1)
    assert raw["schema"] == 1
    assert raw["source"] == "OperatorKernels.md"
    assert raw["generated_by"] == "scripts/gen_kernel_table.py"
    assert raw["commit"] == sha == kt.commit
    assert sha[:12] in raw["ort_version"] and "1.25" in raw["ort_version"] and "1.31.1" in raw["ort_version"]
    assert raw["ort_release"] == "1.31.1" and raw["rtti_source"] == "rtti_kernels.json"
    assert kt.ort_version == raw["ort_version"]


# ---- parsing ---------------------------------------------------------------------------------------------------------


def test_parse_opset_ranges(gen):
    assert gen.parse_opset("13+", "t") == (13, None)
    assert gen.parse_opset("[6, 12]", "t") == (6, 12)
    assert gen.parse_opset("10", "t") == (10, 10)
    with pytest.raises(gen.ParseError):
        gen.parse_opset("6-12", "t")


def test_parse_types_keeps_nested_types(gen):
    types = gen.parse_types(
        "**T** = tensor(float), tensor(float16)<br/> **V** = map(int64,tensor(float)), seq(tensor(float))", "t"
    )
    assert types == {"T": ["float", "float16"], "V": ["map(int64,tensor(float))", "seq(tensor(float))"]}


def test_parser_rejects_malformed_rows(gen):
    md = (
        "## Operators implemented by CPUExecutionProvider\n"
        "|**Operator Domain:** *ai.onnx*||||\n"
        "|Abs|*in* X:**T**<br> *out* Y:**T**|13 plus|**T** = tensor(float)|\n"
    )
    with pytest.raises(gen.ParseError):
        gen.parse_markdown(md)
    with pytest.raises(gen.ParseError):
        gen.parse_markdown("no providers here\n")


def test_table_shape(raw, kt):
    assert kt.providers() == [CPU, CUDA, DML]
    assert set(raw["providers"][CPU]) == {"ai.onnx", "ai.onnx.ml", MS, "com.microsoft.nchwc"}
    assert set(raw["providers"][CUDA]) == {"ai.onnx", MS, "com.ms.internal.nhwc"}
    assert set(raw["providers"][DML]) == {"ai.onnx", MS, "com.microsoft.dml"}
    for prov in kt.providers():
        assert len(kt.op_types(prov, "")) > 100
    rows = [e for d in raw["providers"].values() for ops in d.values() for e in ops.values()]
    # every kernel row of OperatorKernels.md, and one per op the 1.31.1 binaries' kernel classes add
    assert sum(len(e["kernels"]) for e in rows if "source" not in e) == 1460
    assert sum(1 for e in rows if "source" in e) == len(raw["rtti_added"]) > 0


def test_gqa_cuda_excludes_float(kt):
    (reg,) = kt.lookup(CUDA, MS, "GroupQueryAttention", 1)
    assert "float" not in reg.types["T"]
    assert set(reg.types["T"]) == {"float16", "bfloat16"}
    assert reg.types["M"] == ("int32",)
    assert reg.until is None


def test_moe_and_qmoe_types(kt):
    (moe,) = kt.lookup(CUDA, MS, "MoE", 1)
    assert {"float", "float16", "bfloat16"} <= set(moe.types["T"])
    (qmoe,) = kt.lookup(CUDA, MS, "QMoE", 1)
    assert set(qmoe.types["T"]) == {"float16", "bfloat16"}
    assert kt.lookup(CPU, MS, "MoE", 1)[0].types["T"] == ("float",)


def test_cpu_matmul_and_opset_ranges(kt):
    assert "float" in kt.lookup(CPU, "", "MatMul", 13)[0].types["T"]
    abs_ranges = [(r.since, r.until) for r in kt.lookup(CPU, "", "Abs")]
    assert abs_ranges == [(13, None), (6, 12)]
    assert [r.opset_range for r in kt.lookup(CPU, "", "Abs")] == ["13+", "[6, 12]"]
    add = kt.op(CPU, "", "Add").registrations
    assert [(r.since, r.until) for r in add] == [(14, None), (13, 13), (7, 12)]
    assert add[1].opset_range == "13"
    assert kt.lookup(CPU, "", "Abs", 5) == []
    assert kt.lookup(CPU, "", "Abs", 12)[0].until == 12


def test_formal_inputs(kt):
    gqa = kt.op(CUDA, MS, "GroupQueryAttention")
    assert gqa.inputs[0].name == "query" and gqa.inputs[0].constraint == "T"
    pos = next(f for f in gqa.inputs if f.name == "position_ids")
    assert pos.fixed == "int64" and pos.constraint is None
    assert [f.name for f in kt.op(CPU, MS, "MoE").inputs][:2] == ["input", "router_probs"]
    # alternatives ("... or ...") are kept as separate signatures
    assert len(kt.op(CPU, "", "BatchNormalization").signatures) == 3


def test_domains_and_providers_are_normalized(kt):
    assert kt.lookup(CPU, "", "MatMul") == kt.lookup(CPU, "ai.onnx", "MatMul")
    assert kt.lookup("cuda", "", "MatMul") == kt.lookup(CUDA, "", "MatMul")
    assert kt.knows_op("", "RotaryEmbedding") and kt.knows_op(MS, "RotaryEmbedding")
    assert kt.knows_op("", "SimplifiedLayerNormalization") and not kt.knows_op(MS, "SimplifiedLayerNormalization")
    assert kt.lookup(CPU, "", "NoSuchOp") is None
    assert kernel_table() is kt  # loaded once


# ---- supports --------------------------------------------------------------------------------------------------------


def test_supports_gqa_fp32_on_cuda_is_no(kt):
    r = kt.supports(CUDA, MS, "GroupQueryAttention", 1, ["float", "float", "float", None, None, "int32", "int32"])
    assert r == Support.NO and not r
    assert "query" in r.reason and "bfloat16, float16" in r.reason and kt.ort_version in r.reason
    assert kt.supports(CUDA, MS, "GroupQueryAttention", 1, ["float16"] * 3 + [None, None, "int32", "int32"])
    assert kt.supports(CUDA, MS, "GroupQueryAttention", 1, {"query": "bfloat16"}) == Support.YES


def test_supports_moe_and_qmoe_on_cuda(kt):
    assert kt.supports(CUDA, MS, "MoE", 1, ["float", "float", "float"]) == Support.YES
    assert kt.supports(CUDA, MS, "QMoE", 1, ["float", "float", "uint8", "float"]) == Support.NO
    assert kt.supports(CUDA, MS, "QMoE", 1, ["float16", "float16", "uint8", "float16"]) == Support.YES
    assert kt.supports(DML, MS, "MoE", 1, ["float"]) == Support.NO  # listed for CPU/CUDA, not Dml


@pytest.mark.parametrize("op", NEW_OPS)
def test_ops_newer_than_the_markdown_come_from_the_installed_binaries(kt, op):
    # OperatorKernels.md predates them; the 1.31.1 CUDA binary's kernel classes register each for float,
    # float16 and bfloat16 (GatedDeltaNet has no CPU kernel class)
    for dtype in ("float", "float16", "bfloat16"):
        r = kt.supports(CUDA, MS, op, 1, [dtype])
        assert r == Support.YES and "kernel classes" in r.reason and kt.ort_version in r.reason
    assert kt.knows_op(MS, op)
    assert (kt.supports(CPU, MS, op, 1, ["float"]) == Support.YES) is (op != "GatedDeltaNet")


def test_an_op_no_table_source_lists_is_unknown_not_no(kt):
    r = kt.supports(CUDA, MS, "NoSuchFutureOp", 1, ["float"])
    assert r == Support.UNKNOWN_OP and r.is_unknown and kt.ort_version in r.reason


@pytest.mark.parametrize("prov", ["TensorrtExecutionProvider", "CANNExecutionProvider", "tensorrt", "cann"])
def test_providers_without_a_table_are_unknown(kt, prov):
    assert not kt.has_provider(prov)
    assert kt.lookup(prov, "", "MatMul", 13) is None
    r = kt.supports(prov, "", "MatMul", 13, ["float", "float"])
    assert r == Support.UNKNOWN_PROVIDER and r.is_unknown


def test_supports_opsets_and_types(kt):
    assert kt.supports(CPU, "", "MatMul", 17, ["float", "float"]) == Support.YES
    assert kt.supports(CPU, "", "MatMul", 17, ["float16", "float16"]) == Support.NO
    assert kt.supports(CUDA, "", "MatMul", 17, ["float16", "float16"]) == Support.YES
    r = kt.supports(CPU, "", "Abs", 5, ["float"])
    assert r == Support.NO and "13+" in r.reason
    assert kt.supports(CPU, "", "MatMul", 17) == Support.YES  # types not checked
    assert kt.supports(CPU, "", "MatMul", 17, [None, None]) == Support.UNKNOWN_TYPE
    assert kt.supports(CPU, "", "MatMul", 17, ["floaty", "float"]) == Support.UNKNOWN_TYPE
    # variadic last input
    assert kt.supports(CPU, "", "Concat", 13, ["float"] * 5) == Support.YES
    # a constraint the kernel leaves open (CPU GQA registers no T_CACHE) is not checked
    assert kt.supports(CPU, MS, "GroupQueryAttention", 1, {"query": "float", "past_key": "int8"}) == Support.YES


def test_dtype_spellings():
    assert normalize_dtype(1) == "float"
    assert normalize_dtype(10) == "float16"
    assert normalize_dtype("tensor(bfloat16)") == "bfloat16"
    assert normalize_dtype("FLOAT16") == normalize_dtype("fp16") == "float16"
    assert normalize_dtype("float32") == "float"
    assert normalize_dtype(None) is None


# ---- provider option catalogs ----------------------------------------------------------------------------------------


def test_catalog_structure():
    data = json.loads(PROVIDER_OPTIONS_JSON.read_text(encoding="utf-8"))
    assert data["schema"] == 1 and data["ort_version"]
    assert set(catalog_providers()) == {CUDA, "TensorrtExecutionProvider", "CANNExecutionProvider", CPU}
    for name in catalog_providers():
        cat = provider_catalog(name)
        prov = data["providers"][name]
        assert cat.ort_version == data["ort_version"]
        assert cat.source.repo == "microsoft/onnxruntime" and cat.source.files
        assert cat.unknown_key_behavior in ("error", "ignored")
        for key, raw_opt in prov["options"].items():
            assert {"type", "default", "description"} <= set(raw_opt), key
            opt = cat.option(key)
            assert opt.type in OPTION_TYPES, key
            assert opt.description and "\n" not in opt.description, key
            if opt.type == "enum":
                assert opt.values and opt.default in opt.values, key
            else:
                assert not opt.values, key
            assert opt.validate(opt.default_string) is None, key
            assert opt.validate(opt.default) is None or opt.type == "bool", key


def test_cuda_catalog():
    cuda = provider_catalog("cuda")
    assert cuda.name == CUDA and cuda.unknown_key_behavior == "error"
    for key in ["enable_cuda_graph", "use_tf32", "gpu_mem_limit", "device_id", "arena_extend_strategy",
                "cudnn_conv_algo_search", "prefer_nhwc", "sdpa_kernel", "enable_cudnn"]:
        assert key in cuda, key
    assert cuda.option("enable_cuda_graph").default is False
    assert cuda.option("use_tf32").default is True
    # the seed's keys are not CUDA options
    assert cuda.option("cuda_graph_enable_partial") is None
    assert cuda.option("max_batch_size") is None
    problems = dict(cuda.validate({"enable_cuda_graph": "1", "cuda_graph_enable_partial": "1", "max_batch_size": "8"}))
    assert set(problems) == {"cuda_graph_enable_partial", "max_batch_size"}
    assert "enable_cuda_graph" in problems["cuda_graph_enable_partial"]  # suggestion
    assert cuda.suggest("enable_cuda_graphs") == "enable_cuda_graph"
    assert cuda.suggest("max_batch_size") is None


def test_tensorrt_and_cann_catalogs():
    trt = provider_catalog("TensorrtExecutionProvider")
    for key in ["trt_cuda_graph_enable", "trt_engine_cache_enable", "trt_timing_cache_enable",
                "trt_ep_context_file_path",
                "trt_dump_ep_context_model", "trt_fp16_enable", "trt_max_workspace_size", "trt_profile_min_shapes"]:
        assert key in trt, key
    assert "enable_cuda_graph" not in trt and trt.suggest("enable_cuda_graph") == "trt_cuda_graph_enable"
    assert trt.option("trt_load_user_initializer").python_api is False
    cann = provider_catalog("CANN")
    for key in ["enable_cann_graph", "precision_mode", "op_select_impl_mode", "npu_mem_limit", "dump_om_model"]:
        assert key in cann, key
    assert cann.option("enable_cann_graph").default is True
    assert cann.option("precision_mode").validated_by == "CANN"
    assert cann.is_possibly_valid("precision_mode_v2") and "precision_mode_v2" not in cann
    cpu = provider_catalog("cpu")
    assert cpu.keys() == [] and cpu.unknown_key_behavior == "ignored"


def test_option_validation():
    cuda = provider_catalog("cuda")
    graph = cuda.option("enable_cuda_graph")
    for ok in ["0", "1", "true", "false", "True", "False", True, False, 1, 0]:
        assert graph.validate(ok) is None, ok
    assert graph.validate("yes") == 'expects a boolean (0/1/true/false/True/False), got "yes"'
    assert graph.validate("TRUE") is not None
    assert graph.validate(["1"]) is not None
    assert cuda.option("device_id").validate("0") is None
    assert cuda.option("device_id").validate("-1") is not None
    assert cuda.option("device_id").validate("1.5") is not None
    assert cuda.option("gpu_mem_limit").validate(str(2**64 - 1)) is None
    assert cuda.option("gpu_mem_limit").validate("-5") is not None
    reason = cuda.option("arena_extend_strategy").validate("kNextPowerOf2")
    assert "kNextPowerOfTwo" in reason
    assert cuda.option("arena_extend_strategy").validate("knextpoweroftwo") is not None  # case-sensitive
    # The Python API parses TensorRT booleans itself: True/False only.
    fp16 = provider_catalog("tensorrt").option("trt_fp16_enable")
    assert fp16.validate("True") is None and fp16.validate(True) is None
    assert fp16.validate("1") is not None
    level = provider_catalog("tensorrt").option("trt_builder_optimization_level")
    assert level.validate("5") is None and level.validate("6") is not None


def test_provider_names():
    expected = {
        "cuda": CUDA, "CUDA": CUDA, "CUDAExecutionProvider": CUDA, "cudaexecutionprovider": CUDA,
        "cpu": CPU, "dml": DML, "DML": DML, "webgpu": "WebGpuExecutionProvider", "WebGPU": "WebGpuExecutionProvider",
        "qnn": "QNNExecutionProvider", "QNN": "QNNExecutionProvider", "openvino": "OpenVINOExecutionProvider",
        "NvTensorRtRtx": "NvTensorRTRTXExecutionProvider", "trt-rtx": "NvTensorRTRTXExecutionProvider",
        "tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider", "cann": "CANNExecutionProvider",
    }
    for name, ep in expected.items():
        assert canonical_provider_name(name) == ep, name
    assert canonical_provider_name("foo") is None and canonical_provider_name("") is None
    assert provider_catalog("dml") is None  # known provider, no catalog
    assert provider_catalog("nope") is None
    assert provider_catalog("Cuda") is provider_catalog("CUDAExecutionProvider")
    # how onnxruntime-genai normalizes provider_options names
    assert genai_provider_name("cuda") == "cuda"
    assert genai_provider_name("CUDAExecutionProvider") == "cuda"
    assert genai_provider_name("dml") == "DML" and genai_provider_name("webgpu") == "WebGPU"
    assert genai_provider_name("tensorrt") is None and genai_provider_name("cann") is None


# ---- ORT facts -------------------------------------------------------------------------------------------------------


def test_graph_optimization_levels():
    assert graph_optimization_levels() == {
        "ORT_DISABLE_ALL": 0, "ORT_ENABLE_BASIC": 1, "ORT_ENABLE_EXTENDED": 2, "ORT_ENABLE_LAYOUT": 3,
        "ORT_ENABLE_ALL": 99,
    }
    genai = genai_graph_optimization_levels()
    assert "ORT_ENABLE_LAYOUT" not in genai and set(genai) < set(graph_optimization_levels())


def test_session_config_keys():
    assert is_known_session_config_key("session.disable_cpu_ep_fallback")
    assert session_config_key("session.disable_cpu_ep_fallback").default == "0"
    assert is_known_session_config_key("session.intra_op.allow_spinning")
    assert is_known_session_config_key("optimization.disable_specified_optimizers")
    assert is_known_session_config_key("ep.context_enable")
    assert is_known_session_config_key("ep.nvtensorrtrtxexecutionprovider.nv_profile_min_shapes")  # provider-scoped
    assert not is_known_session_config_key("session.disable_cpu_fallback")
    assert suggest_session_config_key("session.disable_cpu_fallback") == "session.disable_cpu_ep_fallback"
    assert not is_known_session_config_key("session.intra_op_threads_count")
    assert run_config_key("gpu_graph_id") is not None
    for key, info in ort_facts().session_config.keys.items():
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", key), key
        assert info.description and info.source, key


def test_graph_capture_options():
    assert provider_catalog("cuda").graph_capture_option == "enable_cuda_graph"
    assert provider_catalog("tensorrt").graph_capture_option == "trt_cuda_graph_enable"
    # enable_cann_graph is CANN's graph engine, not capture/replay
    assert provider_catalog("cann").graph_capture_option is None
    assert provider_catalog("cpu").graph_capture_option is None
    for name in catalog_providers():
        key = provider_catalog(name).graph_capture_option
        assert key is None or key in provider_catalog(name)
        assert graph_capture_option(name) == key
    assert graph_capture_option("NvTensorRtRtx") == "enable_cuda_graph"
    assert graph_capture_option("dml") is None  # a session config entry, not a provider option


def test_kernels_added_after_the_table_commit_are_merged_with_their_source():
    r = kernel_table().supports("CUDAExecutionProvider", "", "LpNormalization", 22, ["float16"])
    assert r == Support.YES and "#28724" in r.reason
    assert kernel_table().supports("CUDAExecutionProvider", "", "LpNormalization", 22, ["double"]) == Support.NO
