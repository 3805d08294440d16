"""The one dim-role classifier (ortgate.knowledge.dims), against every dim name of every committed model and against
expression names exporters write; and the runner feeding what those names declare, judged by ONNX Runtime."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortgate.engine.pipeline import LintRequest, load_inputs
from ortgate.errors import InputError
from ortgate.knowledge.dims import dim_kind, dim_role, dim_terms, dim_value, parse_dim
from ortgate.runner import inputs as ri
from ortgate.runner.settings import runner_settings

ROOT = Path(__file__).resolve().parent.parent

# The role of every dim name the committed models use. A model that brings a new name fails
# test_every_committed_dim_name_has_its_role until the name is stated here.
EXPECTED = {
    "batch": "batch",
    "batch_size": "batch",
    "sequence_length": "query",
    "past_sequence_length": "past",
    "total_sequence_length": "total",
    "past_sliding_length": "sliding_past",
    "total_sliding_length": "total",
    "kv_cache_dim": "head",
    "past_sequence_length + sequence_length": "total",  # optimum's attention mask
    "batch_size * sequence_length": None,  # tokens of the step, derived: batch * query
    "batch_size*sequence_length": None,
    "sequence_length * num_attention_heads": None,
    "sequence_length * num_key_value_heads": None,
    "2*batch_size*sequence_length": None,
    "4*batch_size*sequence_length": None,  # Llama-4: the tokens repeated once per expert
    "sequence_length + 1": None,  # not past + new tokens: a length derived from the query
    # transformers' own exporter (tfexp-*, transformers-qwen3-past) names its dims after torch.export's symbols: no
    # role in the name, the graph says it (runner.inputs.graph_dim_roles); its cache's head axes are dims named by
    # their numbers
    "s53": None,  # attention_mask's sequence
    "s70": None,  # input_ids' sequence
    "2*s70": None,
    "s54": None, "s43": None, "s36": None, "s36 + s70": None, "2": None, "16": None,
}


def _dim_names(graph: onnx.GraphProto, out: set[str]) -> None:
    for info in (*graph.input, *graph.output, *graph.value_info):
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param:
                out.add(dim.dim_param)
    for node in graph.node:
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                _dim_names(sub, out)


def committed_models() -> list[Path]:
    paths = [p for p in ROOT.glob("**/*.onnx") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    out = []
    for path in sorted(paths):
        try:
            onnx.load(str(path), load_external_data=False)
        except Exception:  # the hostile-input corpus: files that are not models on purpose
            continue
        out.append(path)
    return out


MODELS = committed_models()


def committed_dim_names() -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for path in MODELS:
        found: set[str] = set()
        _dim_names(onnx.load(str(path), load_external_data=False).graph, found)
        for name in found:
            names.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return names


def test_the_committed_models_are_found():
    assert len(MODELS) >= 10 and any("genai-gpt_oss" in str(p) for p in MODELS)
    assert {"batch_size", "past_sequence_length", "kv_cache_dim"} <= set(committed_dim_names())


def test_every_committed_dim_name_has_its_role():
    for name, where in sorted(committed_dim_names().items()):
        if re.fullmatch(r"unk__\d+", name):
            # onnx shape inference's name for a dim it relates to no other (quantize_dynamic keeps its value_info)
            assert dim_role(name) is None, (name, where[0])
            continue
        if re.fullmatch(r"u\d+( \+ u\d+)*", name):
            # torch.export's unbacked (data-dependent) sizes and their sums: JetMoE's tokens per expert
            assert dim_role(name) is None, (name, where[0])
            continue
        assert name in EXPECTED, f"dim {name!r} (in {where[0]}) is new: state its role in EXPECTED"
        assert dim_role(name) == EXPECTED[name], (name, where[0])


@pytest.mark.parametrize("name, role, kind", [
    # names the linter and the runner used to classify differently
    ("present_sequence_length", "total", "kv"),
    ("tokens", "query", "query"),
    ("num_tokens", "query", "query"),
    ("kv_len", "total", "kv"),
    ("cache_len", "past", "kv"),
    ("context_length", "total", "kv"),
    # sizes that mention the cache or kv but are not lengths
    ("kv_cache_dim", "head", "other"),
    ("kv_heads", None, "other"),
    ("num_key_value_heads", None, "other"),
    ("head_dim", "head", "other"),
    ("max_seq_len", "max", "kv"),
    ("past_key_values_length", "past", "kv"),
    ("Batch_Size", "batch", "batch"),
    ("chunk_width", None, "other"),
    # expressions: the role follows from the terms
    ("past_sequence_length + sequence_length", "total", "kv"),
    ("sequence_length + past_sequence_length", "total", "kv"),
    ("past_sequence_length+sequence_length", "total", "kv"),
    ("past_sliding_length + sequence_length", "total", "kv"),
    ("past_sequence_length + 1", None, "kv"),
    ("batch_size * sequence_length", None, "query"),
    ("2 * batch_size", None, "batch"),
    ("s0 + s1", None, "other"),
])
def test_roles_and_kinds(name, role, kind):
    assert dim_role(name) == role
    assert dim_kind(name) == kind


@pytest.mark.parametrize("name, value", [
    ("past_sequence_length + sequence_length", 7),
    ("(past_sequence_length + sequence_length) * batch_size", 14),
    ("batch_size*sequence_length", 4),
    ("past_sequence_length - 1", 4),
    ("past_sequence_length // 2", 2),
    ("past_sequence_length + unknown_dim", None),
    ("sequence_length", 2),
])
def test_expression_values(name, value):
    sizes = {"batch_size": 2, "sequence_length": 2, "past_sequence_length": 5}
    assert dim_value(name, sizes.get) == value


@pytest.mark.parametrize("name", [
    "past_key_values.0.key",  # dots: a plain name, not an attribute access
    "__import__('os')",  # never code: only names, integers and + - * //
    "a" * 300 + " + b",  # too long to be an exporter's expression
    "(" * 150 + "a" + ")" * 150 + "+b",
    "lambda: 1",
    "",
])
def test_odd_names_are_plain_names(name):
    assert parse_dim(name) is None and dim_terms(name) == (name,)


# ---- the runner feeds what the names declare --------------------------------------------------------------


def _kv_model(path: Path, mask_dim: str) -> Path:
    """A KV-cache step whose ops only run when the attention mask covers past + new tokens: present =
    Concat(past_key, key) along the sequence, multiplied by the mask broadcast over that axis."""
    nodes = [
        helper.make_node("Concat", ["past_key", "key"], ["present"], axis=2),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("axes", TensorProto.INT64, [2], [1, 3])),
        helper.make_node("Unsqueeze", ["mask_f", "axes"], ["mask_4d"]),
        helper.make_node("Mul", ["present", "mask_4d"], ["masked"]),
    ]
    graph = helper.make_graph(nodes, "kv_step", [
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", mask_dim]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 4]),
        helper.make_tensor_value_info("key", TensorProto.FLOAT, ["batch_size", 2, "sequence_length", 4]),
    ], [helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["batch_size", 2, mask_dim, 4])])
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def _feeds(model: Path, policy: Path):
    inputs = load_inputs(LintRequest(str(model), str(policy)))
    settings = runner_settings(inputs.policy)
    signature = ri.graph_signature(inputs.model)
    dims, step = ri.resolve_dims(signature, settings, {}, window=None, head=None, policy_file=str(policy))
    return ri.synthesize(signature, dims, step, {})


def test_optimum_attention_mask_is_past_plus_new_tokens_and_runs(tmp_path, write_policy):
    model = _kv_model(tmp_path / "m.onnx", "past_sequence_length + sequence_length")
    feeds = _feeds(model, write_policy("name: p\nrunner: {past_sequence_length: 3, sequence_length: 1}\n"))
    assert feeds.arrays["attention_mask"].shape == (1, 4) and feeds.arrays["past_key"].shape == (1, 2, 3, 4)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (masked,) = session.run(None, feeds.arrays)
    assert masked.shape == (1, 2, 4, 4)
    assert np.array_equal(masked[:, :, :3], feeds.arrays["past_key"])  # the all-ones mask keeps the past


def test_runner_dims_pins_an_expression_dim(tmp_path, write_policy):
    model = _kv_model(tmp_path / "m.onnx", "past_sequence_length + sequence_length")
    # consistent with its terms: accepted
    ok = write_policy("name: p\nrunner:\n  past_sequence_length: 3\n  dims: {'past_sequence_length + sequence_length': 4}\n")
    assert _feeds(model, ok).arrays["attention_mask"].shape == (1, 4)
    # one short of its terms: the session would reject the inputs, so it is an input error naming both
    short = write_policy("name: p\nrunner:\n  past_sequence_length: 3\n  dims: {'past_sequence_length + sequence_length': 3}\n",
                         name="short.yaml")
    with pytest.raises(InputError) as err:
        _feeds(model, short)
    assert "'past_sequence_length + sequence_length' to 3 but its terms give 4" in err.value.problem
    assert "past_sequence_length = 3, sequence_length = 1" in err.value.problem


def test_expression_whose_terms_are_not_inputs_is_pinned_or_derived(tmp_path, write_policy):
    model = _kv_model(tmp_path / "m.onnx", "past_sequence_length + sequence_length")
    proto = onnx.load(str(model))
    for info in (*proto.graph.input, *proto.graph.output):
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param in ("past_sequence_length", "sequence_length"):
                dim.dim_value = 2 if dim.dim_param == "past_sequence_length" else 1
    path = tmp_path / "fixed.onnx"
    onnx.save(proto, path)
    # runner.past_sequence_length / sequence_length still give the terms their values ...
    feeds = _feeds(path, write_policy("name: p\nrunner: {past_sequence_length: 2}\n"))
    assert feeds.arrays["attention_mask"].shape == (1, 3)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds.arrays)
    # ... and a pin of the expression itself wins when no input dim names its terms
    pinned = write_policy("name: p\nrunner:\n  dims: {'past_sequence_length + sequence_length': 3}\n", name="p2.yaml")
    assert _feeds(path, pinned).arrays["attention_mask"].shape == (1, 3)


def test_expression_with_an_unknown_term_is_an_input_error(tmp_path, write_policy):
    model = _kv_model(tmp_path / "m.onnx", "past_sequence_length + chunk")
    with pytest.raises(InputError) as err:
        _feeds(model, write_policy("name: p\n"))
    assert "dim 'past_sequence_length + chunk' (no value for 'chunk')" in err.value.problem
    assert "runner.dims.past_sequence_length + chunk" in err.value.problem


@pytest.mark.parametrize("model", [m for m in MODELS if "corpus" not in m.parts], ids=lambda m: m.parent.name)
def test_every_committed_model_s_inputs_get_consistent_values(model, write_policy):
    """Every input dim of every committed model resolves, and each one a role or an expression decides has the
    value that role or expression gives (past 3, 2 new tokens, batch 2). A dim whose name says nothing
    (transformers' exporter's s53 / s70) gets its role from the graph, as `ortgate fix` reads it."""
    inputs = load_inputs(LintRequest(str(model), None))
    signature = ri.graph_signature(inputs.model)
    settings = runner_settings(load_inputs(LintRequest(str(model), str(write_policy(
        "name: p\nrunner: {batch_size: 2, sequence_length: 2, past_sequence_length: 3}\n")))).policy)
    roles = ri.graph_dim_roles(inputs.model)
    dims, step = ri.resolve_dims(signature, settings, {}, window=ri.sliding_window(inputs.model, inputs.genai),
                                 head=ri.head_size(inputs.policy, inputs.genai) or 8, policy_file=None, roles=roles)
    expected = {"batch": 2, "query": 2, "past": 3, "total": 5}
    for name, value in dims.items():
        role = roles.get(name) or dim_role(name)
        if role in expected:
            assert value == expected[role], name
        if name.isdigit():
            assert value == int(name), name
        if parse_dim(name) is not None:
            assert value == dim_value(name, dims.get), name
