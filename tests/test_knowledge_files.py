"""Every knowledge file loads through its typed schema, names the version it reflects, and names only real ops;
a typo, a missing key or a wrong type in a knowledge file is an error at import."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

import ortgate.knowledge as knowledge
from ortgate.knowledge import KnowledgeError, kernel_table, moe_inputs, ort_facts
from ortgate.knowledge.cache_exports import _CacheExportsFile
from ortgate.knowledge.contracts import OpContracts
from ortgate.knowledge.cuda_contracts import CudaContracts
from ortgate.knowledge.deployment_facts import _FactsFile
from ortgate.knowledge.devices import _DevicesFile, _OpCostsFile
from ortgate.knowledge.dims import _DimNamesFile
from ortgate.knowledge.facts import OrtFacts
from ortgate.knowledge.families import _FamiliesFile
from ortgate.knowledge.fusions import OrtFusions
from ortgate.knowledge.group_router import _GroupRouterFile
from ortgate.knowledge.kernels import KernelTable, _KernelAdditionsFile
from ortgate.knowledge.loader import build, read_json
from ortgate.knowledge.model_format import _ModelFormatFile
from ortgate.knowledge.moe_op import _OrtMoeFile
from ortgate.knowledge.op_schemas import _LimitsFile, _SchemasFile
from ortgate.knowledge.producers import _ProducersFile
from ortgate.knowledge.providers import _ProviderOptionsFile
from ortgate.knowledge.releases import _ReleasesFile
from ortgate.knowledge.session_keys import _SessionKeysFile

KNOWLEDGE = Path(knowledge.__file__).parent

# file -> its schema (kernels.json is generated: scripts/gen_kernel_table.py writes it, its loader reads it)
SCHEMAS = {
    "ort_facts.json": OrtFacts,
    "ort_fusions.json": OrtFusions,
    "provider_options.json": _ProviderOptionsFile,
    "model_families.json": _FamiliesFile,
    "kernel_additions.json": _KernelAdditionsFile,
    "ort_moe.json": _OrtMoeFile,
    "dim_names.json": _DimNamesFile,
    "devices.json": _DevicesFile,
    "op_costs.json": _OpCostsFile,
    "producers.json": _ProducersFile,
    "deployment_facts.json": _FactsFile,
    "cache_exports.json": _CacheExportsFile,
    "model_format.json": _ModelFormatFile,
    "ort_group_router.json": _GroupRouterFile,
    "ort_releases.json": _ReleasesFile,
    "ort_cpu_limits.json": _LimitsFile,
    "ort_session_keys.json": _SessionKeysFile,
    "ort_cuda_contracts.json": CudaContracts,
}
NOT_ORT = {"devices.json"}  # hardware figures, each with its own source
GENERATED = {"kernels.json": KernelTable.from_json, "op_contracts.json": OpContracts.from_json,
             "op_schemas.json": lambda data: build(_SchemasFile, data, "op_schemas.json")}


def test_every_knowledge_file_has_a_typed_loader():
    files = {p.name for p in KNOWLEDGE.glob("*.json")}
    assert files == set(SCHEMAS) | set(GENERATED), "register a new knowledge file's schema here"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_file_loads_and_names_what_it_reflects(name):
    data = read_json(KNOWLEDGE / name)
    loaded = build(SCHEMAS[name], data, name)
    reflects = getattr(loaded, "ort_version", None) or getattr(loaded, "reflects", None)
    assert reflects or name in NOT_ORT, f"{name} names no ORT (or library) version"
    assert "source" in json.dumps(data) or "about" in data, f"{name} names no sources"


def test_generated_kernel_table_loads():
    table = GENERATED["kernels.json"](read_json(KNOWLEDGE / "kernels.json"))
    assert table.ort_version and table.commit and len(table.providers()) == 3


def _mutations(data):
    """(description, mutated copy) pairs: a typo in a key, a missing key, a value of the wrong type."""
    typo = copy.deepcopy(data)
    typo["cuda_graph_capture"]["runs_before_captrue"] = typo["cuda_graph_capture"].pop("runs_before_capture")
    yield "unknown key 'runs_before_captrue' (did you mean 'runs_before_capture'?)", typo
    missing = copy.deepcopy(data)
    del missing["memcpy_ops"]["ops"]
    yield "memcpy_ops: missing key 'ops'", missing
    wrong = copy.deepcopy(data)
    wrong["cuda_graph_capture"]["runs_before_capture"]["value"] = "2"
    yield "cuda_graph_capture.runs_before_capture.value: expected an integer, got a string", wrong
    nested = copy.deepcopy(data)
    nested["session_config"]["keys"]["session.disable_prepacking"]["defualt"] = "0"
    yield "session_config.keys.session.disable_prepacking: unknown key 'defualt'", nested
    level = copy.deepcopy(data)
    level["graph_optimization_level_default"] = "ORT_ENABLE_EVERYTHING"
    yield "'ORT_ENABLE_EVERYTHING' is not one of graph_optimization_levels", level


@pytest.mark.parametrize("expected,data", list(_mutations(read_json(KNOWLEDGE / "ort_facts.json"))))
def test_a_broken_file_is_an_error_naming_the_path(expected, data):
    with pytest.raises(KnowledgeError) as info:
        build(OrtFacts, data, "ort_facts.json")
    assert expected in str(info.value) and str(info.value).startswith("ort_facts.json: ")


def test_provider_option_defaults_are_checked():
    data = read_json(KNOWLEDGE / "provider_options.json")
    data["providers"]["CUDAExecutionProvider"]["options"]["arena_extend_strategy"]["default"] = "kNextPowerOf3"
    from ortgate.knowledge import providers

    parsed = build(_ProviderOptionsFile, data, "provider_options.json")
    with pytest.raises(KnowledgeError, match="arena_extend_strategy: default 'kNextPowerOf3' is not one of"):
        providers._catalog("CUDAExecutionProvider", parsed.providers["CUDAExecutionProvider"], parsed)


def test_family_fields_are_typed():
    data = read_json(KNOWLEDGE / "model_families.json")
    data["families"]["gpt_oss"]["swiglu_limit"] = "7"
    with pytest.raises(KnowledgeError, match="families.gpt_oss.swiglu_limit: expected a number"):
        build(_FamiliesFile, data, "model_families.json")


# ---- the ops knowledge names are ops ORT has -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ort_schemas() -> set[tuple[str, str]]:
    return {(s.domain or "", s.name) for s in ort_state.get_all_operator_schema()}


def _op_lists():
    facts = ort_facts()
    yield "compute_ops", [("*", op) for op in facts.compute_ops.ops]
    yield "memcpy_ops", [("", op) for op in facts.memcpy_ops.ops]
    yield "tf32.ops", list(facts.tf32.op_keys)
    yield "control_flow_ops", [("", op) for op in facts.cuda_graph_capture.control_flow_ops]
    yield "data_dependent_shape_ops", [("", op) for op in facts.cuda_graph_capture.data_dependent_shape_ops.ops]
    yield "kernel_free_ops", [("", op) for op in facts.kernel_free_ops.ops]


@pytest.mark.parametrize("what,ops", list(_op_lists()), ids=[w for w, _ in _op_lists()])
def test_every_listed_op_is_registered_by_the_installed_ort(what, ops, ort_schemas):
    """Against the op schemas onnxruntime-gpu registers (ONNX and contrib domains): a misspelt op fails here."""
    names = {name for _, name in ort_schemas}
    for domain, op in ops:
        found = op in names if domain == "*" else (domain, op) in ort_schemas
        assert found, f"{what}: {domain or 'ai.onnx'}.{op} is not an op the installed ORT registers"


def test_memcpy_ops_are_the_ones_the_kernel_table_registers():
    for op in ort_facts().memcpy_ops.ops:
        assert kernel_table().lookup("CUDAExecutionProvider", "", op), op


# ---- MoE / QMoE input positions ------------------------------------------------------------------------------


def test_moe_input_positions_match_ort_s_schemas():
    """The positions come from the kernel table; ORT's own schema must list the same formal inputs there."""
    schemas = {s.name: s for s in ort_state.get_all_operator_schema() if s.domain == "com.microsoft"}
    for op in ("MoE", "QMoE"):
        positions = moe_inputs(op)
        formal = [i.name for i in schemas[op].inputs]
        for name in ("input", "router_probs", "fc1_experts_weights", "fc2_experts_weights", "fc3_experts_weights",
                     "fc1_scales", "fc3_zero_points"):
            index = positions.position(name)
            if index is None:
                assert name not in formal, (op, name)
            else:
                assert formal[index] == name, (op, name, index)
    assert moe_inputs("MoE").fc3_experts_weights == 6 and moe_inputs("QMoE").fc3_experts_weights == 8
    assert not moe_inputs("MoE").quantized and moe_inputs("QMoE").quantized
    assert moe_inputs("MoE").position("no_such_input") is None and moe_inputs("MoE").position("op_type") is None


def test_input_positions_by_name_across_opsets():
    from ortgate.knowledge import input_position

    assert input_position("com.microsoft", "GroupQueryAttention", "past_key") == 3
    assert input_position("com.microsoft", "GroupQueryAttention", "past_value") == 4
    # ONNX Attention: opset 24 appends nonpad_kv_seqlen; the past keeps its position
    assert input_position("", "Attention", "past_key") == 4 and input_position("", "Attention", "past_value") == 5
    assert input_position("", "Attention", "nonpad_kv_seqlen") == 6
    assert input_position("com.microsoft", "GroupQueryAttention", "no_such_input") is None
    assert input_position("com.microsoft", "NoSuchOp", "x") is None


def test_contracts_built_op_by_op_are_the_whole_files():
    """op_contract builds only the ops a lint asks for: each is what loading the whole file gives."""
    from ortgate.knowledge.contracts import _versions, op_contracts

    table = op_contracts().ops
    for domain, ops in table.items():
        for op_type, versions in ops.items():
            assert _versions(domain, op_type) == versions, (domain, op_type)
    assert _versions("ai.onnx", "NoSuchOp") is None and _versions("com.microsoft", "Relu") is None
    assert _versions("ai.onnx", "MatMul") == table["ai.onnx"]["MatMul"]


def test_kernel_entries_built_when_read_are_what_the_file_says():
    """The kernel table builds an op's entry when it is first read: every entry of kernels.json builds, and the
    dtypes it knows are those of every registration, built or not."""
    from ortgate.knowledge.kernels import OpKernels, _known_dtypes, _type_lists

    fresh = GENERATED["kernels.json"](read_json(KNOWLEDGE / "kernels.json"))
    unbuilt = {t for domains in fresh._ops.values() for ops in domains.values() for v in _type_lists(ops) for t in v}
    entries = [e for domains in fresh._ops.values() for ops in domains.values() for e in ops.values()]
    assert entries and all(isinstance(e, OpKernels) for e in entries)
    built = {t for e in entries for r in e.registrations for v in r.types.values() for t in v}
    assert unbuilt == built and built <= _known_dtypes()
    matmul = fresh.op("CPUExecutionProvider", "", "MatMul")
    assert matmul is fresh.op("CPUExecutionProvider", "ai.onnx", "MatMul") and matmul.registrations[0].since >= 13
