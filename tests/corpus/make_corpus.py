"""Writes the corpus of broken and hostile inputs that ortgate must refuse cleanly or lint without harm.

    python tests/corpus/make_corpus.py            # rewrite the corpus files in place
    python tests/corpus/make_corpus.py --check    # exit 1 if a committed file differs from what this writes

Every file is produced here, byte for byte reproducibly (fixed seeds, fixed zip timestamps, protobuf
serialised from fixed messages), so binary inputs can be reviewed as code. What ortgate must answer for
each file (exit code, a piece of the one-line error) is in MANIFEST.yaml beside this script.

Nothing here is large: the > 2 GiB model and the million-node graph are made by the tests on the fly.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import zipfile
from pathlib import Path
from typing import Callable

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper

HERE = Path(__file__).resolve().parent
IR_VERSION = 10
OPSET = 21
MS = "com.microsoft"

FileMaker = Callable[[], bytes]
FILES: dict[str, FileMaker] = {}


def corpus_file(name: str):
    def register(make: FileMaker) -> FileMaker:
        FILES[name] = make
        return make

    return register


# ---- protobuf building blocks ---------------------------------------------------------------------


def _vi(name: str, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, *, initializers=(), value_info=(), opsets=None, name="g") -> ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=list(initializers),
                              value_info=list(value_info))
    opsets = opsets or [helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=opsets, producer_name="ortgate-corpus")
    return model


def _weight(name: str, dims, seed: int) -> TensorProto:
    rng = random.Random(seed)
    n = 1
    for d in dims:
        n *= d
    return helper.make_tensor(name, TensorProto.FLOAT, dims, [round(rng.uniform(-1, 1), 3) for _ in range(n)])


def _external_stub(name: str, dims, location: str) -> TensorProto:
    """An initializer whose bytes live in `location` (which this corpus never writes)."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(dims))
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * _numel(dims)))):
        t.external_data.add(key=key, value=value)
    return t


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def base_model() -> ModelProto:
    """A small valid model: x[batch, 4] -> MatMul(W) -> Relu -> MatMul(W2) -> y. ORT runs it."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/model/layers.0/mlp/up_proj/MatMul"),
        helper.make_node("Relu", ["h"], ["a"], name="/model/layers.0/mlp/act/Relu"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="/model/layers.0/mlp/down_proj/MatMul"),
    ]
    return _model(nodes, [_vi("x", ["batch", 4])], [_vi("y", ["batch", 4])],
                  initializers=[_weight("w1", [4, 8], 1), _weight("w2", [8, 4], 2)])


def _bytes(model: ModelProto) -> bytes:
    return model.SerializeToString(deterministic=True)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _nested_if_model(depth: int) -> bytes:
    """`depth` If nodes, each the then_branch of the one above, written as raw protobuf (onnx.helper itself
    cannot build messages nested deeper than the protobuf parser accepts)."""
    out_vi = _vi("y", [1])
    inner = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="leaf")], "g0", [], [out_vi])
    graph = inner.SerializeToString(deterministic=True)
    for level in range(1, depth + 1):
        attr = AttributeProto(name="then_branch", type=AttributeProto.GRAPH).SerializeToString() + _field(6, graph)
        else_branch = helper.make_attribute("else_branch", inner).SerializeToString()
        node = NodeProto(op_type="If", name=f"if{level}", input=["cond"], output=["y"]).SerializeToString()
        node += _field(5, attr) + _field(5, else_branch)
        shell = GraphProto(name=f"g{level}", output=[out_vi])
        if level == depth:
            shell.input.extend([_vi("cond", [], TensorProto.BOOL), _vi("x", [1])])
        graph = shell.SerializeToString(deterministic=True) + _field(1, node)
    header = ModelProto(ir_version=IR_VERSION, producer_name="ortgate-corpus")
    header.opset_import.extend([helper.make_opsetid("", OPSET)])
    return header.SerializeToString(deterministic=True) + _field(7, graph)


# ---- models: not ONNX at all ----------------------------------------------------------------------


@corpus_file("models/empty.onnx")
def empty() -> bytes:
    return b""


@corpus_file("models/random-bytes.onnx")
def random_bytes() -> bytes:
    return random.Random(8).randbytes(4096)


@corpus_file("models/truncated.onnx")
def truncated() -> bytes:
    data = _bytes(base_model())
    return data[: len(data) * 2 // 3]


@corpus_file("models/zip-archive.onnx")
def zip_archive() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        info = zipfile.ZipInfo("archive/data.pkl", date_time=(2024, 1, 1, 0, 0, 0))
        z.writestr(info, b"\x80\x04K\x01.")
    return buffer.getvalue()


@corpus_file("models/pickle.onnx")
def pickle_file() -> bytes:
    # The bytes of pickle.dumps({"w": 1}, protocol=4); written literally, never unpickled by anyone.
    return b"\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01w\x94K\x01s."


@corpus_file("models/text.onnx")
def text_file() -> bytes:
    return b"name: not-a-model\nmodel:\n  layers: 2\n"


@corpus_file("models/tensor-proto.onnx")
def tensor_proto() -> bytes:
    """A serialised TensorProto (a .pb weight file), not a ModelProto."""
    return _weight("w", [4, 4], 3).SerializeToString(deterministic=True)


@corpus_file("models/no-graph.onnx")
def no_graph() -> bytes:
    return ModelProto(ir_version=IR_VERSION, producer_name="ortgate-corpus").SerializeToString()


@corpus_file("models/no-nodes.onnx")
def no_nodes() -> bytes:
    return _bytes(_model([], [_vi("x", [1])], [_vi("x", [1])]))


@corpus_file("models/nested-if-200.onnx")
def nested_if_deep() -> bytes:
    return _nested_if_model(200)


# ---- models: valid protobuf, hostile graph ----------------------------------------------------------


@corpus_file("models/nested-if-25.onnx")
def nested_if_shallow() -> bytes:
    return _nested_if_model(25)


@corpus_file("models/cycle.onnx")
def cycle() -> bytes:
    """a = Add(x, c); b = Relu(a); c = Mul(b, b); plus a node that consumes its own output."""
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Mul", ["b", "b"], ["c"], name="mul"),
        helper.make_node("Softmax", ["s"], ["s"], name="self_loop"),
        helper.make_node("TopK", ["c", "k"], ["v", "i"], name="topk"),
        helper.make_node("MatMul", ["v", "v"], ["x2"], name="mm"),
        helper.make_node("Add", ["x2", "c"], ["y"], name="out"),
    ]
    return _bytes(_model(nodes, [_vi("x", [2, 2]), _vi("k", [1], TensorProto.INT64)], [_vi("y", [2, 2])]))


@corpus_file("models/duplicate-names.onnx")
def duplicate_names() -> bytes:
    """Two nodes named alike, two producers of one value, an input listed twice."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="dup"),
        helper.make_node("Relu", ["x"], ["h"], name="dup"),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name="dup"),
    ]
    return _bytes(_model(nodes, [_vi("x", [1, 4]), _vi("x", [1, 4])], [_vi("y", [1, 4]), _vi("y", [1, 4])],
                         initializers=[_weight("w1", [4, 4], 4), _weight("w2", [4, 4], 5), _weight("w1", [4, 4], 6)]))


@corpus_file("models/empty-names.onnx")
def empty_names() -> bytes:
    """Nodes, values and initializers without names (empty strings are legal protobuf)."""
    nodes = [
        helper.make_node("MatMul", ["", ""], [""], name=""),
        helper.make_node("Relu", [""], ["y"], name=""),
        helper.make_node("TopK", ["", ""], ["", ""], name=""),
        helper.make_node("Softmax", [""], [""], name=""),
    ]
    return _bytes(_model(nodes, [_vi("", [1, 4])], [_vi("y", [1, 4])], initializers=[_weight("", [4, 4], 7)]))


@corpus_file("models/custom-ops.onnx")
def custom_ops() -> bytes:
    """Unknown domains, unknown ops in known domains, a domain without opset_import."""
    nodes = [
        helper.make_node("RunShell", ["x"], ["a"], name="/model/layers.0/custom/RunShell", domain="evil.custom",
                         command="rm -rf /", library="/tmp/libevil.so"),
        helper.make_node("NotAnOnnxOp", ["a"], ["b"], name="/model/layers.0/unknown/Op"),
        helper.make_node("MoEButNotReally", ["b"], ["c"], name="/model/layers.0/moe/MoE", domain=MS),
        helper.make_node("MoE", ["c"], ["y"], name="/model/layers.1/moe/MoE", domain="ai.onnx.ml"),
    ]
    return _bytes(_model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])],
                         opsets=[helper.make_opsetid("", OPSET), helper.make_opsetid("evil.custom", 999999)]))


@corpus_file("models/control-flow.onnx")
def control_flow() -> bytes:
    """If, Loop and Scan bodies, an MoE and a GroupQueryAttention inside them, outer values read inside."""
    moe = helper.make_node("MoE", ["x", "router", "fc1", "", "fc2"], ["moe_out"], name="/model/layers.0/moe/MoE",
                           domain=MS, k=2, activation_type="swiglu", swiglu_fusion=1)
    then_g = helper.make_graph([moe], "then", [], [_vi("moe_out", [1, 4])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["x_id"], name="else_id")], "else", [],
                               [_vi("x_id", [1, 4])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
         helper.make_node("GroupQueryAttention", ["carried", "carried", "carried"], ["attn"],
                          name="/model/layers.1/attn/GroupQueryAttention", domain=MS, num_heads=4, kv_num_heads=2),
         helper.make_node("Add", ["attn", "w1"], ["carried_out"], name="loop_add")],
        "body", [_vi("iter", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("carried", [1, 4])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("carried_out", [1, 4])])
    scan_body = helper.make_graph([helper.make_node("Add", ["s_in", "s_x"], ["s_out"], name="scan_add")], "scan",
                                  [_vi("s_in", [4]), _vi("s_x", [4])], [_vi("s_out", [4])])
    nodes = [
        helper.make_node("If", ["cond"], ["branch"], name="/model/branch/If", then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trip", "cond", "branch"], ["looped"], name="/model/loop/Loop", body=body),
        helper.make_node("Scan", ["looped", "looped"], ["y", "scanned"], name="/model/scan/Scan", body=scan_body,
                         num_scan_inputs=1),
    ]
    inputs = [_vi("x", [1, 4]), _vi("cond", [], TensorProto.BOOL), _vi("trip", [], TensorProto.INT64)]
    inits = [_weight("router", [4, 4], 8), _weight("fc1", [4, 16, 4], 9), _weight("fc2", [4, 4, 8], 10),
             _weight("w1", [1, 4], 11)]
    return _bytes(_model(nodes, inputs, [_vi("y", [4]), _vi("scanned", [1, 4])], initializers=inits))


@corpus_file("models/huge-dims.onnx")
def huge_dims() -> bytes:
    """0-d values, a billion-element value, a 2^40 x 2^40 inline initializer with no bytes, negative dims."""
    big = TensorProto(name="huge_w", data_type=TensorProto.FLOAT, dims=[2**40, 2**40])  # inline, no data
    negative = TensorProto(name="neg_w", data_type=TensorProto.FLOAT, dims=[-1, 4])
    huge_const = helper.make_node("Constant", [], ["c"], name="huge_constant",
                                  value=TensorProto(name="cv", data_type=TensorProto.FLOAT, dims=[10**9, 10**9]))
    big_down = TensorProto(name="huge_down", data_type=TensorProto.FLOAT, dims=[2**40, 2**40])
    nodes = [  # an MoE block: router (neg_w) -> TopK, one expert (up, down) weighted by the top-k values
        huge_const,
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros_of_a_billion_cubed"),
        helper.make_node("MatMul", ["x", "neg_w"], ["logits"], name="/model/layers.0/moe/router/MatMul"),
        helper.make_node("TopK", ["logits", "scalar_k"], ["v", "i"], name="/model/layers.0/moe/TopK"),
        helper.make_node("MatMul", ["x", "huge_w"], ["h"], name="/model/layers.0/moe/experts.0/up_proj/MatMul"),
        helper.make_node("MatMul", ["h", "huge_down"], ["h2"], name="/model/layers.0/moe/experts.0/down_proj/MatMul"),
        helper.make_node("Mul", ["h2", "v"], ["weighted"], name="/model/layers.0/moe/experts.0/Mul"),
        helper.make_node("Add", ["weighted", "c"], ["y"], name="/model/layers.0/add"),
    ]
    inputs = [_vi("x", [10**9, 10**9, 10**9]), _vi("scalar_k", [], TensorProto.INT64),
              _vi("shape", [3], TensorProto.INT64)]
    value_info = [_vi("h", [2**62, 0, -5]), _vi("zeros", [10**9, 10**9, 10**9])]
    return _bytes(_model(nodes, inputs, [_vi("y", [])], initializers=[big, negative, big_down], value_info=value_info))


@corpus_file("models/odd-attributes.onnx")
def odd_attributes() -> bytes:
    """Attributes of the wrong type on ops rules read: k as text, heads as floats and tensors, perm as text."""
    text_k = helper.make_attribute("k", "two")
    nodes = [
        helper.make_node("MatMul", ["x", "router_w"], ["logits"], name="/model/layers.0/moe/gate/MatMul"),
        NodeProto(op_type="MoE", domain=MS, name="/model/layers.0/moe/MoE", input=["x", "logits", "fc1", "", "fc2"],
                  output=["m"], attribute=[text_k, helper.make_attribute("swiglu_fusion", [1.5, 2.5])]),
        helper.make_node("GroupQueryAttention", ["m", "m", "m"], ["a"], name="/model/layers.0/attn/GroupQueryAttention",
                         domain=MS, num_heads=4.5, kv_num_heads="two"),
        helper.make_node("GroupQueryAttention", ["a", "a", "a"], ["a2"], name="/model/layers.1/attn/GroupQueryAttention",
                         domain=MS, num_heads=_weight("t", [2], 12), num_kv_heads=2),
        helper.make_node("Transpose", ["a2"], ["t"], name="/model/layers.1/attn/Transpose", perm="0132"),
        helper.make_node("MatMul", ["t", "a2"], ["s"], name="/model/layers.1/attn/MatMul"),
        helper.make_node("Softmax", ["s"], ["p"], name="/model/layers.1/attn/Softmax", axis="last"),
        helper.make_node("MatMul", ["p", "a2"], ["o"], name="/model/layers.1/attn/MatMul_1"),
        helper.make_node("TopK", ["o", "k"], ["v", "i"], name="/model/layers.1/moe/TopK", k=[1, 2], largest=2**40),
        helper.make_node("Cast", ["v"], ["y"], name="/model/layers.1/Cast", to=99999),
        helper.make_node("SkipSimplifiedLayerNormalization", ["y", "y"], ["n"], domain=MS, epsilon="tiny",
                         name="/model/layers.1/post_attention_layernorm/SkipLayerNorm"),
    ]
    inits = [_weight("router_w", [4, 4], 13), _weight("fc1", [4, 8, 4], 14), _weight("fc2", [4, 4, 4], 15)]
    return _bytes(_model(nodes, [_vi("x", [1, 4]), _vi("k", [1], TensorProto.INT64)], [_vi("n", [1, 4])],
                         initializers=inits))


@corpus_file("models/odd-versions.onnx")
def odd_versions() -> bytes:
    model = base_model()
    model.ir_version = 2**62
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", 2**62), helper.make_opsetid("", 1),
                               helper.make_opsetid("com.microsoft", -7)])
    return _bytes(model)


@corpus_file("models/control-characters.onnx")
def control_characters() -> bytes:
    """Names carrying newlines and terminal escape sequences: a report must not print them raw."""
    nodes = [  # an MoE block (router MatMul -> TopK, an expert weighted by the top-k) so that a finding names these nodes
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/model/layers.0/moe/gate\nPASS  0 errors\x1b[2K\r"),
        helper.make_node("TopK", ["h", "k"], ["v", "y\x1b]0;pwned\x07"], name="\x1b[31mred\x1b[0m"),
        helper.make_node("MatMul", ["x", "up"], ["e"], name="/model/layers.0/moe/experts.0/up\x1b[2J"),
        helper.make_node("MatMul", ["e", "down"], ["d"], name="/model/layers.0/moe/experts.0/down"),
        helper.make_node("ReduceSum", ["v"], ["s"], name="/model/layers.0/moe/sum", keepdims=1),
        helper.make_node("Mul", ["d", "s"], ["out"], name="/model/layers.0/moe/experts.0/weighted"),
    ]
    return _bytes(_model(nodes, [_vi("x", [1, 4]), _vi("k", [1], TensorProto.INT64)],
                         [_vi("v", [1, 2]), _vi("y\x1b]0;pwned\x07", [1, 2], TensorProto.INT64), _vi("out", [1, 4])],
                         initializers=[_weight("w", [4, 4], 16), _weight("up", [4, 4], 17), _weight("down", [4, 4], 18)]))


# ---- models: external data ------------------------------------------------------------------------


def _model_with_external(locations: list[str]) -> bytes:
    inits = [_external_stub(f"w{i}", [4, 4], loc) for i, loc in enumerate(locations)]
    nodes, value = [], "x"
    for i in range(len(locations)):
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"h{i}"], name=f"/model/layers.{i}/mlp/MatMul"))
        value = f"h{i}"
    nodes.append(helper.make_node("Relu", [value], ["y"], name="/model/final/Relu"))
    return _bytes(_model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])], initializers=inits))


@corpus_file("models/missing-external-data/model.onnx")
def missing_external_data() -> bytes:
    return _model_with_external(["model.onnx.data", "model.onnx.data"])


@corpus_file("models/escaping-external-data/model.onnx")
def escaping_external_data() -> bytes:
    return _model_with_external(["weights.data", "../../../../../../../../etc/passwd"])


@corpus_file("models/absolute-external-data/model.onnx")
def absolute_external_data() -> bytes:
    return _model_with_external(["/etc/passwd"])


@corpus_file("models/subgraph-escaping-external-data/model.onnx")
def subgraph_escaping_external_data() -> bytes:
    inner = helper.make_graph([helper.make_node("Identity", ["w_in"], ["z"], name="inner")], "then", [],
                              [_vi("z", [4, 4])], initializer=[_external_stub("w_in", [4, 4], "../outside.data")])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="/model/If", then_branch=inner, else_branch=inner)]
    return _bytes(_model(nodes, [_vi("cond", [], TensorProto.BOOL)], [_vi("y", [4, 4])]))


# ---- genai folders and configs --------------------------------------------------------------------


def _genai_config(**decoder) -> dict:
    base = {"filename": "model.onnx", "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_size": 16, "hidden_size": 64, "session_options": {"log_id": "onnxruntime-genai",
                                                                  "provider_options": []}}
    base.update(decoder)
    return {"model": {"type": "qwen3", "decoder": base}, "search": {"max_length": 64}}


def _json(data) -> bytes:
    return (json.dumps(data, indent=4) + "\n").encode()


@corpus_file("configs/escaping-filename/genai_config.json")
def escaping_filename() -> bytes:
    return _json(_genai_config(filename="../../../../../../../etc/passwd"))


@corpus_file("configs/escaping-filename/model.onnx")
def escaping_filename_model() -> bytes:
    return _bytes(base_model())


@corpus_file("configs/not-json.json")
def not_json() -> bytes:
    return b'{\n    "model": {\n        "decoder": {\n            "filename": "model.onnx",\n        }\n    }\n'


@corpus_file("configs/missing-decoder.json")
def missing_decoder() -> bytes:
    return _json({"model": {"type": "qwen3"}, "search": {}})


@corpus_file("configs/top-level-list.json")
def top_level_list() -> bytes:
    return _json([{"model": {}}])


@corpus_file("configs/wrong-types.json")
def wrong_types() -> bytes:
    return _json(_genai_config(num_hidden_layers="48"))


@corpus_file("configs/provider-options-object.json")
def provider_options_object() -> bytes:
    config = _genai_config()
    config["model"]["decoder"]["session_options"]["provider_options"] = {"cuda": {"enable_cuda_graph": "1"}}
    return _json(config)


@corpus_file("configs/provider-option-not-string.json")
def provider_option_not_string() -> bytes:
    config = _genai_config()
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": 1}}]
    return _json(config)


@corpus_file("configs/unknown-provider.json")
def unknown_provider() -> bytes:
    config = _genai_config()
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"quantum": {}}]
    return _json(config)


@corpus_file("configs/deeply-nested.json")
def deeply_nested_json() -> bytes:
    return b'{"model": {"decoder": {"session_options": {"x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}}}\n"


@corpus_file("configs/huge-integer.json")
def huge_integer_json() -> bytes:
    return b'{"model": {"decoder": {"num_hidden_layers": ' + b"9" * 5000 + b"}}}\n"


@corpus_file("configs/nan.json")
def nan_json() -> bytes:
    return b'{"model": {"type": NaN, "decoder": {"num_hidden_layers": Infinity, "session_options": {}}}}\n'


@corpus_file("configs/not-utf8.json")
def not_utf8_json() -> bytes:
    return b'{"model": {"type": "\xff\xfe"}}\n'


@corpus_file("configs/filename-not-string.json")
def filename_not_string() -> bytes:
    return _json(_genai_config(filename=["model.onnx"], sliding_window={"layers": ["x", 2**70]},
                               layer_types=[None, 1, {"a": 1}]))


# ---- policies -------------------------------------------------------------------------------------


def _text(text: str) -> FileMaker:
    return lambda: text.encode()


def _alias_bomb() -> bytes:
    lines = ['name: bomb', 'description: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"x{i}: &a{i} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


FILES["policies/alias-bomb.yaml"] = _alias_bomb
FILES["policies/alias-in-value.yaml"] = _text(
    "name: base\nsession: &s\n  intra_op_num_threads: 1\nrunner: *s\n")
FILES["policies/wrong-types.yaml"] = _text("name: wrong-types\nmodel:\n  layers: forty-eight\n  experts: 128\n")
FILES["policies/wrong-root.yaml"] = _text("- name: a list\n- not: a mapping\n")
FILES["policies/empty.yaml"] = _text("# nothing but a comment\n")
FILES["policies/unknown-key.yaml"] = _text(
    "name: unknown-key\nsession:\n  graph_optimisation_level: ORT_ENABLE_ALL\n")
FILES["policies/unknown-top-key.yaml"] = _text("name: unknown-top\nmodle:\n  layers: 2\n")
FILES["policies/extends-cycle-a.yaml"] = _text("name: cycle-a\nextends: extends-cycle-b.yaml\n")
FILES["policies/extends-cycle-b.yaml"] = _text("name: cycle-b\nextends: extends-cycle-a.yaml\n")
FILES["policies/extends-self.yaml"] = _text("name: self\nextends: extends-self.yaml\n")
FILES["policies/extends-missing.yaml"] = _text("name: orphan\nextends: no-such-parent.yaml\n")
FILES["policies/extends-directory.yaml"] = _text("name: folder-parent\nextends: .\n")
FILES["policies/extends-builtin-traversal.yaml"] = _text("name: traversal\nextends: builtin:../../../../etc/passwd\n")
FILES["policies/extends-device.yaml"] = _text("name: device\nextends: /dev/zero\n")
FILES["policies/extends-proc-environ.yaml"] = _text("name: environ\nextends: /proc/self/environ\n")
FILES["policies/extends-dev-stdin.yaml"] = _text("name: stdin\nextends: /dev/stdin\n")
FILES["policies/extends-outside-repository.yaml"] = _text("name: outside\nextends: /etc/passwd\n")
FILES["policies/extends-not-a-policy.yaml"] = _text("name: points-at-a-model\nextends: ../models/base.onnx\n")
FILES["policies/bad-date.yaml"] = _text(
    "name: bad-date\nwaivers:\n  - rule: moe-not-fused\n    reason: migrating\n    expires: 2025-13-45\n")
FILES["policies/date-not-a-date.yaml"] = _text(
    "name: not-a-date\nwaivers:\n  - rule: moe-not-fused\n    reason: migrating\n    expires: next quarter\n")
FILES["policies/date-as-number.yaml"] = _text(
    "name: number-date\nwaivers:\n  - rule: moe-not-fused\n    reason: migrating\n    expires: 20250101\n")
FILES["policies/date-impossible.yaml"] = _text(
    "name: feb-30\nwaivers:\n  - rule: moe-not-fused\n    reason: migrating\n    expires: '2025-02-30'\n")


def _deep_yaml() -> bytes:
    return b"name: deep\ndescription: " + b"[" * 50_000 + b"]" * 50_000 + b"\n"


def _deep_block_yaml() -> bytes:
    return b"name: deep-block\ndescription:\n  " + b"- " * 50_000 + b"x\n"  # compact nested block sequences


FILES["policies/deeply-nested-flow.yaml"] = _deep_yaml
FILES["policies/deeply-nested-block.yaml"] = _deep_block_yaml
FILES["policies/python-object.yaml"] = _text(
    "name: !!python/object/apply:os.system ['echo ortgate-was-here > /tmp/ortgate-pwned']\n")
FILES["policies/python-object-on-mapping.yaml"] = _text(
    "name: tagged\nsession: !!python/object:os.system\n  intra_op_num_threads: 1\n")
FILES["policies/binary.yaml"] = _text("name: !!binary aGVsbG8=\n")
FILES["policies/not-utf8.yaml"] = lambda: b"name: caf\xe9\n"
FILES["policies/duplicate-key.yaml"] = _text("name: dup\nmodel:\n  layers: 2\n  layers: 48\n")
FILES["policies/tab-indent.yaml"] = _text("name: tabs\nmodel:\n\tlayers: 2\n")
FILES["policies/complex-key.yaml"] = _text("name: complex\n? [a, b]\n: value\n")
FILES["policies/huge-integer.yaml"] = lambda: b"name: huge\nmodel:\n  layers: " + b"9" * 5000 + b"\n"
FILES["policies/nan.yaml"] = _text("name: nan\nmodel:\n  rms_norm_eps: .nan\n  layers: .inf\n")
# Numbers JSON cannot carry, or that overflow a float or divide by zero downstream: refused where they are written.
FILES["policies/nan-target.yaml"] = _text("name: nan-target\nthroughput: {device: h100-sxm, min_tokens_per_s: .nan}\n")
FILES["policies/inf-target.yaml"] = _text("name: inf-target\nthroughput:\n  device: h100-sxm\n  min_tokens_per_s: .inf\n")
FILES["policies/nan-ms-per-token.yaml"] = _text("name: nan-ms\nthroughput:\n  device: h100-sxm\n  max_ms_per_token: .nan\n")
FILES["policies/inf-calibration.yaml"] = _text(
    "name: inf-calibration\nthroughput:\n  device: h100-sxm\n  calibration: {bandwidth_gb_s: .inf}\n")
FILES["policies/tiny-calibration.yaml"] = _text(
    "name: tiny-calibration\nthroughput:\n  device: h100-sxm\n  calibration: {memory_efficiency: 1.0e-300}\n")
FILES["policies/inf-timeout.yaml"] = _text("name: inf-timeout\nrunner:\n  timeout: .inf\n")
FILES["policies/huge-target.yaml"] = lambda: (b"name: huge-target\nthroughput:\n  device: h100-sxm\n  min_tokens_per_s: 1"
                                              + b"0" * 350 + b"\n")
FILES["policies/unknown-rule.yaml"] = _text("name: unknown-rule\nrules:\n  ignore: [moe-not-fussed]\n")
FILES["policies/unknown-provider.yaml"] = _text(
    "name: unknown-provider\nexecution_provider:\n  name: QuantumExecutionProvider\n")
FILES["policies/custom-op-library.yaml"] = _text(
    "name: custom-ops\nsession:\n  custom_op_libraries: [/tmp/ortgate-corpus-libevil.so]\n")
FILES["policies/multi-document.yaml"] = _text("name: first\n---\nname: second\n")
FILES["policies/null-name.yaml"] = _text("name:\n")
FILES["policies/waiver-missing-reason.yaml"] = _text("name: lazy\nwaivers:\n  - rule: moe-not-fused\n")
FILES["policies/merge-key.yaml"] = _text("name: merge\nsession:\n  <<: {intra_op_num_threads: 1}\n")

# What a checkout without `git lfs pull` holds in place of an LFS-tracked file: a pointer.
def _lfs_pointer(size: int) -> FileMaker:
    return lambda: (b"version https://git-lfs.github.com/spec/v1\n"
                    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
                    + f"size {size}\n".encode())


FILES["models/lfs-pointer.onnx"] = _lfs_pointer(1_234_567)
FILES["configs/lfs-pointer.json"] = _lfs_pointer(2_345)
FILES["policies/lfs-pointer.yaml"] = _lfs_pointer(456)

# The base model that configs and policies are linted with.
FILES["models/base.onnx"] = lambda: _bytes(base_model())


def build(root: Path) -> dict[str, bytes]:
    out = {}
    for name, make in sorted(FILES.items()):
        data = make()
        out[name] = data
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        stale = [name for name, make in sorted(FILES.items())
                 if not (HERE / name).is_file() or (HERE / name).read_bytes() != make()]
        for name in stale:
            print(f"stale: tests/corpus/{name}")
        return 1 if stale else 0
    build(HERE)
    print(f"wrote {len(FILES)} files under {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
