"""Property-based tests: mutated models, policies and genai configs never crash `ortgate lint` (nor
`ortgate run`, on a few graph-edited models).

For any input, `ortgate` either reports (exit 0 or 1, nothing on stderr) or refuses it with exactly one line
`ortgate: error: FILE...: problem` on stderr and exit 2. Never exit 3 (internal error), never a traceback.
The suite runs with ORTGATE_STRICT=1, so a rule's exception fails the example instead of becoming a
"could not decide" finding.

The default run is a few hundred deterministic examples (derandomize=True). A longer run:

    ORTGATE_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py -q

sets every test here to that many examples.
"""

from __future__ import annotations

import copy
import datetime as _dt
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import onnx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper

from tests.conftest import EXAMPLES, POLICIES
from tests.helpers import run_cli

LONG_RUN = os.environ.get("ORTGATE_FUZZ_EXAMPLES")
FORMATS = ("text", "json", "sarif", "github", "markdown")


def fuzz_settings(default_examples: int):
    return settings(
        max_examples=int(LONG_RUN) if LONG_RUN else default_examples,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


@pytest.fixture(scope="module")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="ortgate-fuzz-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def assert_clean_outcome(code: int, out: str, err: str, *, readable: bool = False, names: Path | None = None,
                         every_problem: bool = False):
    """The one contract: a report (0/1), or one error line (2). `readable`: 2 is not acceptable either.
    `every_problem` (`policy validate`): one error line per problem, each in the same form."""
    assert "Traceback" not in out + err
    if code in (0, 1):
        assert err == "", err
        assert out.strip(), "a report is printed"
        return
    assert code == 2 and not readable, f"exit {code}: {err}"
    assert out == ""
    assert err.endswith("\n") and (every_problem or err.count("\n") == 1), err
    assert all(line.startswith("ortgate: error: ") for line in err.splitlines()), err
    if names is not None:
        assert str(names) in err, err


# ---- seed models -----------------------------------------------------------------------------------------


SMALL = dict(layers=2, hidden=16, vocab=32, experts=4, top_k=2, moe_intermediate=8, num_heads=2, kv_num_heads=1,
             head_dim=8, max_position=16, dense_intermediate=16, linear_key_heads=1, linear_value_heads=2,
             linear_key_head_dim=8, linear_value_head_dim=8)
SEED_SPECS = {
    "fused": dict(),
    "unfused": dict(moe="dense_loop", attention="decomposed", rotary="decomposed", norm="decomposed", qkv="separate",
                    naming="hf"),
    "gather-loop-opaque": dict(moe="gather_loop", attention="mha", rotary="decomposed", naming="opaque",
                               weights="external_stub"),
    "hybrid-control-flow": dict(layer_types=("linear_attention", "full_attention"), shared_expert=True,
                                control_flow=True, weights="external_stub"),
    "qmoe-nbits-unnamed": dict(moe="qmoe", matmul_nbits=True, naming="none", weights="external_stub"),
}


@functools.cache
def seed_model(name: str) -> onnx.ModelProto:
    from tests.models.qwen_moe import ModelSpec, build_model

    return build_model(ModelSpec(**SMALL, **SEED_SPECS[name]))


@functools.cache
def seed_bytes(name: str) -> bytes:
    return seed_model(name).SerializeToString()


# ---- byte-level mutations --------------------------------------------------------------------------------

byte_edit = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("set"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.floats(0, 1), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 64)),
    st.tuples(st.just("duplicate"), st.floats(0, 1), st.integers(1, 256)),
)


def apply_byte_edits(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, where, arg in edits:
        pos = min(int(where * len(buf)), max(len(buf) - 1, 0))
        if kind == "flip" and buf:
            buf[pos] ^= 1 << arg
        elif kind == "set" and buf:
            buf[pos] = arg
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = arg
        elif kind == "delete":
            del buf[pos:pos + arg]
        elif kind == "duplicate":
            buf[pos:pos] = buf[pos:pos + arg]
    return bytes(buf)


@fuzz_settings(150)
@given(seed=st.sampled_from(sorted(SEED_SPECS)), edits=st.lists(byte_edit, min_size=1, max_size=6),
       fmt=st.sampled_from(FORMATS))
def test_byte_mutated_models_are_reported_or_refused_in_one_line(workdir, seed, edits, fmt):
    path = workdir / "bytes.onnx"
    path.write_bytes(apply_byte_edits(seed_bytes(seed), edits))
    code, out, err = run_cli("lint", path, "--format", fmt)
    assert_clean_outcome(code, out, err, names=path)


# ---- graph-level edits -----------------------------------------------------------------------------------

OP_TYPES = ("MoE", "QMoE", "GroupQueryAttention", "MultiHeadAttention", "Attention", "TopK", "Softmax", "MatMul",
            "Gemm", "MatMulNBits", "FusedMatMul", "Transpose", "Mul", "Div", "Add", "Constant", "Cast", "Gather",
            "ScatterElements", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding",
            "LinearAttention", "If", "Loop", "Reshape", "Expand", "Where", "Sigmoid", "Identity", "NoSuchOp")
DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml", "evil.custom", "com.microsoft.nchwc")
ATTR_NAMES = ("k", "num_heads", "kv_num_heads", "num_kv_heads", "perm", "to", "axis", "value", "swiglu_fusion",
              "activation_type", "normalize_routing_weights", "local_window_size", "do_rotary", "epsilon", "K", "N",
              "bits", "block_size", "transA", "transB", "alpha", "then_branch", "else_branch", "body", "largest",
              "q_num_heads", "expert_weight_bits", "use_sparse_mixer", "scale", "value_float", "value_ints")
WEIRD_NAMES = ("", "x", "/model/layers.999999/attn/GroupQueryAttention", "layers.-1", "model.layers.99999999999.mlp",
               "a\nb", "\x1b[31m", "名前", "/" * 300, "logits", "input_ids")
INTS = st.one_of(st.integers(-3, 10), st.sampled_from([2**31, 2**63 - 1, -(2**63), 10**9]))
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


def _small_graph() -> onnx.GraphProto:
    return helper.make_graph([helper.make_node("Identity", ["sub_in"], ["sub_out"])], "sub", [],
                             [helper.make_tensor_value_info("sub_out", TensorProto.FLOAT, [1])])


attr_value = st.one_of(
    INTS, FLOATS, st.text(max_size=12), st.lists(INTS, max_size=5), st.lists(FLOATS, max_size=4),
    st.lists(st.text(max_size=4), min_size=1, max_size=3),
    st.builds(lambda dims: TensorProto(name="t", data_type=TensorProto.FLOAT, dims=dims),
              st.lists(st.sampled_from([0, 1, -1, 4, 10**9, 2**40]), max_size=3)),
    st.builds(lambda v: helper.make_tensor("t", TensorProto.INT64, [len(v)], v), st.lists(INTS, max_size=3)),
    st.just("GRAPH"),
)

graph_edit = st.one_of(
    st.tuples(st.just("op_type"), st.integers(0, 10**6), st.sampled_from(OP_TYPES)),
    st.tuples(st.just("domain"), st.integers(0, 10**6), st.sampled_from(DOMAINS)),
    st.tuples(st.just("attribute"), st.integers(0, 10**6), st.tuples(st.sampled_from(ATTR_NAMES), attr_value)),
    st.tuples(st.just("drop_attributes"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("drop_input"), st.integers(0, 10**6), st.integers(0, 8)),
    st.tuples(st.just("blank_input"), st.integers(0, 10**6), st.integers(0, 8)),
    st.tuples(st.just("rename_output"), st.integers(0, 10**6), st.sampled_from(WEIRD_NAMES)),
    st.tuples(st.just("rename_node"), st.integers(0, 10**6), st.sampled_from(WEIRD_NAMES)),
    st.tuples(st.just("cycle"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("delete_node"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("duplicate_node"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("initializer_dims"), st.integers(0, 10**6),
              st.lists(st.sampled_from([0, 1, -1, 2, 10**9, 2**40]), max_size=4)),
    st.tuples(st.just("initializer_dtype"), st.integers(0, 10**6), st.integers(0, 40)),
    st.tuples(st.just("value_shape"), st.integers(0, 10**6),
              st.lists(st.one_of(st.sampled_from([0, -1, 10**9, 2**62]), st.sampled_from(["batch_size", ""])),
                       max_size=5)),
    st.tuples(st.just("drop_graph_inputs"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("drop_graph_outputs"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("opset"), st.integers(0, 10**6), st.sampled_from([0, 1, 7, 23, 99, 2**40])),
    st.tuples(st.just("metadata"), st.integers(0, 10**6), st.sampled_from(WEIRD_NAMES)),
)


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    out, stack = [], [model.graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            out.append(node)
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    return out


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    if value == "GRAPH":
        node.attribute.append(helper.make_attribute(name, _small_graph()))
        return
    try:
        node.attribute.append(helper.make_attribute(name, value))
    except (ValueError, TypeError):  # e.g. an empty list has no type; an int beyond int64
        pass


def apply_graph_edits(model: onnx.ModelProto, edits) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    g = model.graph
    for kind, index, arg in edits:
        nodes = _all_nodes(model)
        node = nodes[index % len(nodes)] if nodes else None
        if kind == "op_type" and node is not None:
            node.op_type = arg
        elif kind == "domain" and node is not None:
            node.domain = arg
        elif kind == "attribute" and node is not None:
            _set_attribute(node, *arg)
        elif kind == "drop_attributes" and node is not None:
            del node.attribute[:]
        elif kind == "drop_input" and node is not None and node.input:
            del node.input[arg % len(node.input)]
        elif kind == "blank_input" and node is not None and node.input:
            node.input[arg % len(node.input)] = ""
        elif kind == "rename_output" and node is not None and node.output:
            node.output[0] = arg
        elif kind == "rename_node" and node is not None:
            node.name = arg
        elif kind == "cycle" and len(g.node) > 1:
            early, late = sorted((index % len(g.node), arg % len(g.node)))
            if g.node[late].output and g.node[early].input:
                g.node[early].input[0] = g.node[late].output[0]
        elif kind == "delete_node" and len(g.node) > 1:
            del g.node[index % len(g.node)]
        elif kind == "duplicate_node" and g.node:
            g.node.append(copy.deepcopy(g.node[index % len(g.node)]))
        elif kind == "initializer_dims" and g.initializer:
            t = g.initializer[index % len(g.initializer)]
            del t.dims[:]
            t.dims.extend(arg)
        elif kind == "initializer_dtype" and g.initializer:
            g.initializer[index % len(g.initializer)].data_type = arg
        elif kind == "value_shape":
            values = list(g.input) + list(g.output) + list(g.value_info)
            if values:
                vi = values[index % len(values)]
                dims = vi.type.tensor_type.shape.dim
                del dims[:]
                for d in arg:
                    dim = dims.add()
                    if isinstance(d, int):
                        dim.dim_value = d
                    else:
                        dim.dim_param = d
        elif kind == "drop_graph_inputs":
            del g.input[: (index % 3) + 1]
        elif kind == "drop_graph_outputs":
            del g.output[: (index % 3) + 1]
        elif kind == "opset" and model.opset_import:
            model.opset_import[index % len(model.opset_import)].version = arg
        elif kind == "metadata" and node is not None:
            node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=arg)
    return model


@functools.cache
def genai_config_path() -> Path:
    return EXAMPLES / "qwen3-moe-tiny-fused" / "genai_config.json"


@fuzz_settings(200)
@given(seed=st.sampled_from(sorted(SEED_SPECS)), edits=st.lists(graph_edit, min_size=1, max_size=8),
       fmt=st.sampled_from(FORMATS), with_policy=st.booleans(), with_optimized=st.booleans())
def test_graph_edited_models_are_linted_without_crashing(workdir, seed, edits, fmt, with_policy, with_optimized):
    """A readable protobuf is a readable model: whatever its graph says, the answer is a report."""
    model = apply_graph_edits(seed_model(seed), edits)
    path = workdir / "graph.onnx"
    path.write_bytes(model.SerializeToString())
    args = ["lint", path, "--format", fmt, "--config", genai_config_path()]
    if with_policy:
        args += ["--policy", POLICIES / "tiny-moe-cpu.yaml"]
    if with_optimized:
        args += ["--optimized", path]
    code, out, err = run_cli(*args)
    if code == 2 and "the ONNX graph has no nodes" in err:  # every node deleted: refused as unreadable
        return
    if code == 2 and "the session will fail" in err:  # an opset or IR version ORT refuses to load: said, one line
        assert_clean_outcome(code, out, err)
        return
    assert_clean_outcome(code, out, err, readable=True)


@fuzz_settings(30)
@given(seed=st.sampled_from(["fused", "unfused"]), edits=st.lists(graph_edit, max_size=3))
def test_graph_edited_models_are_run_or_refused_in_one_line(workdir, seed, edits):
    """`ortgate run` builds a real ORT session: whatever ORT refuses is one error line, never a crash."""
    model = apply_graph_edits(seed_model(seed), edits)
    path = workdir / "run.onnx"
    path.write_bytes(model.SerializeToString())
    policy = workdir / "run-policy.yaml"
    policy.write_text("name: cpu\nextends: builtin:cpu\n"
                      "runner: {batch_size: 1, sequence_length: 1, warmup: 1, iterations: 1}\n")
    code, out, err = run_cli("run", path, "--policy", policy, "--timeout", "120")
    assert_clean_outcome(code, out, err)


# ---- policies --------------------------------------------------------------------------------------------

RICH_POLICY = """\
name: rich
description: every block of the schema
model:
  family: qwen3_moe
  layers: 2
  moe_layers: 2
  attention_layers: 2
  experts: 4
  top_k: 2
  num_heads: 2
  kv_num_heads: 1
  head_size: 8
  hidden_size: 16
  norm_topk_prob: true
  activation: swiglu
  rms_norm_eps: 1.0e-6
  required_ops: {com.microsoft.MoE: 2, com.microsoft.GroupQueryAttention: 2}
  forbidden_ops: [ScatterND]
session:
  graph_optimization_level: ORT_ENABLE_ALL
  free_dimension_overrides: {batch_size: 1}
  config_entries: {session.intra_op.allow_spinning: "0"}
  intra_op_num_threads: 2
execution_provider:
  name: CUDAExecutionProvider
  options: {enable_cuda_graph: "1", device_id: 0}
throughput:
  device: cpu
  min_tokens_per_s: 10
runner:
  batch_size: 1
  sequence_length: 1
  warmup: 1
  iterations: 2
rules:
  select: [OGF, OGS, OGP, OGW]
  ignore: [fusedmatmul-missing]
  severity: {gqa-not-fused: warning}
  fail_on: warning
waivers:
  - rule: moe-not-fused
    node: "/model/layers.0/*"
    reason: migrating to the fused exporter
    expires: 2030-01-01
  - rule: OGF002
    reason: expired on purpose
    expires: 2020-01-01
"""
SEED_POLICIES = {p.name: p.read_text() for p in sorted(POLICIES.glob("*.yaml"))} | {"rich.yaml": RICH_POLICY}

json_leaf = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False, width=32),
                      st.text(max_size=12), st.sampled_from(["2025-02-30", "2025-01-01", "OGF001", "builtin:cpu",
                                                             "ORT_ENABLE_ALL", "CUDAExecutionProvider", "*", "1"]))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                          max_leaves=6)
KNOWN_KEYS = ("name", "extends", "model", "session", "execution_provider", "rules", "waivers", "layers", "experts",
              "select", "ignore", "severity", "fail_on", "expires", "rule", "node", "reason", "options", "name",
              "custom_op_libraries", "required_ops", "forbidden_ops", "free_dimension_overrides", "config_entries")
data_edit = st.one_of(
    st.tuples(st.just("replace"), st.integers(0, 10**6), json_value),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("add"), st.integers(0, 10**6), st.tuples(st.sampled_from(KNOWN_KEYS), json_value)),
)
TEXT_SNIPPETS = (":", "- ", "[", "]", "{", "}", "&a ", "*a", "!!python/name:os.system ", "!!binary ", "\t", "'", '"',
                 "\n", "  ", "#", "---\n", "? ", "<<: ", "\x00", "\ufeff", "%YAML 1.1\n", "|\n", ">-\n", "~")
text_edit = st.one_of(
    st.tuples(st.just("insert"), st.floats(0, 1), st.sampled_from(TEXT_SNIPPETS)),
    st.tuples(st.just("delete_line"), st.floats(0, 1), st.none()),
    st.tuples(st.just("duplicate_line"), st.floats(0, 1), st.none()),
    st.tuples(st.just("indent_line"), st.floats(0, 1), st.integers(-2, 3)),
)


def _containers(data, out):
    if isinstance(data, dict):
        out.append(data)
        for v in data.values():
            _containers(v, out)
    elif isinstance(data, list):
        out.append(data)
        for v in data:
            _containers(v, out)
    return out


def apply_data_edits(data, edits):
    data = copy.deepcopy(data)
    for kind, index, arg in edits:
        containers = _containers(data, [])
        target = containers[index % len(containers)]
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        if kind == "replace" and keys:
            target[keys[index % len(keys)]] = arg
        elif kind == "delete" and keys:
            del target[keys[index % len(keys)]]
        elif kind == "add":
            key, value = arg
            if isinstance(target, dict):
                target[key] = value
            else:
                target.append({key: value})
    return data


def apply_text_edits(text: str, edits) -> str:
    for kind, where, arg in edits:
        if kind == "insert":
            pos = int(where * len(text))
            text = text[:pos] + arg + text[pos:]
            continue
        lines = text.split("\n")
        i = min(int(where * len(lines)), len(lines) - 1)
        if kind == "delete_line":
            del lines[i]
        elif kind == "duplicate_line":
            lines.insert(i, lines[i])
        elif kind == "indent_line":
            lines[i] = " " * max(arg, 0) + (lines[i][-arg:] if arg < 0 and len(lines[i]) > -arg else lines[i])
        text = "\n".join(lines)
    return text


def _policy_yaml(data) -> str:
    def default(o):
        return o.isoformat() if isinstance(o, (_dt.date, _dt.datetime)) else str(o)

    return yaml.safe_dump(json.loads(json.dumps(data, default=default)), sort_keys=False, allow_unicode=True)


@fuzz_settings(100)
@given(seed=st.sampled_from(sorted(SEED_POLICIES)), structural=st.booleans(),
       data_edits=st.lists(data_edit, min_size=1, max_size=4), text_edits=st.lists(text_edit, min_size=1, max_size=4))
def test_mutated_policies_are_validated_or_refused_in_one_line(workdir, seed, structural, data_edits, text_edits):
    text = SEED_POLICIES[seed]
    if structural:
        text = _policy_yaml(apply_data_edits(yaml.safe_load(text), data_edits))
    else:
        text = apply_text_edits(text, text_edits)
    folder = workdir / "policies"
    folder.mkdir(exist_ok=True)
    shutil.copy(POLICIES / "tiny-moe-cpu.yaml", folder / "tiny-moe-cpu.yaml")  # a relative `extends` target
    path = folder / "mutated.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")

    code, out, err = run_cli("policy", "validate", path)
    assert_clean_outcome(code, out, err, every_problem=True)
    code, out, err = run_cli("lint", EXAMPLES / "qwen3-moe-tiny-fused", "--policy", path, "--format", "json")
    assert_clean_outcome(code, out, err)
    if code == 2:
        # The error is about the policy (or a file it extends), never the model that was fine.
        assert "model.onnx" not in err.split(": ")[2], err


# ---- genai_config.json -----------------------------------------------------------------------------------


@fuzz_settings(60)
@given(edits=st.lists(data_edit, min_size=1, max_size=5))
def test_mutated_genai_configs_are_read_or_refused_in_one_line(workdir, edits):
    data = json.loads(genai_config_path().read_text())
    folder = workdir / "genai"
    folder.mkdir(exist_ok=True)
    shutil.copy(EXAMPLES / "qwen3-moe-tiny-fused" / "model.onnx", folder / "model.onnx")
    config = folder / "genai_config.json"
    config.write_text(json.dumps(apply_data_edits(data, edits), indent=2))
    code, out, err = run_cli("lint", folder)
    assert_clean_outcome(code, out, err)
    if code == 2:
        assert str(config) in err or "model.onnx" in err, err
