"""Does this onnxruntime's CPU com.microsoft.MoE compute wrong values when its output may take its input's buffer?

Builds one-node MoE graphs (plus the elementwise nodes that make the MoE input an intermediate tensor) and compares
each with a numpy reference of the same MoE. Prints one JSON object: the onnxruntime version and, per case, the max
|error| / max |reference|. ortgate/knowledge/ort_moe.json (cpu_inplace_defect) records what these cases give on the
releases tried; tests/test_ort_moe_defect.py runs this script on the installed onnxruntime (and on another Python's,
ORTGATE_OTHER_ORT_PYTHON) and checks the file's claim for that release.

    python scripts/ort_moe_inplace_check.py            # needs numpy, onnx, onnxruntime only

Cases (E experts, k=2, SwiGLU, tokens T as the named dim "tokens"):
  graph_input        MoE(x) + c                 the input is a graph input
  intermediate       MoE(x * 1) + c             the input is an intermediate tensor last used by the MoE node
  intermediate_side  MoE(x * 1) + x * 1         the same with a second intermediate beside it
  used_after         MoE(x * 1) + c + x * 1     the input is used again after the MoE node
  graph_output       MoE(x * 1) -> output       the MoE output is a graph output
  workaround         Where(true, MoE(x * 1), x * 1) + c   the form `ortgate fix` writes on affected releases
Each with normalize_routing_weights 0 and 1 (suffix _n0 / _n1), at every graph optimization level (the worst is
reported).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

E, H, INTER, K, T = 8, 64, 32, 2, 16
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def _weights():
    rng = np.random.default_rng(0)
    fc1 = rng.standard_normal((E, 2 * INTER, H)).astype(np.float32) * 0.1  # [E, 2I, H], gate/up rows interleaved
    fc2 = rng.standard_normal((E, H, INTER)).astype(np.float32) * 0.1  # [E, H, I]
    x = rng.standard_normal((T, H)).astype(np.float32)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    return fc1, fc2, x, logits


def reference(fc1, fc2, x, logits, normalize: int) -> np.ndarray:
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(T):
        top = np.argsort(-p[t])[:K]
        scale = p[t][top].sum() if normalize else 1.0
        for e in top:
            a = fc1[e].astype(np.float64) @ x[t]
            gate, up = a[0::2], a[1::2]
            out[t] += p[t, e] / scale * (fc2[e] @ (gate / (1 + np.exp(-gate)) * up))
    return out


def _moe(inp: str, out: str, normalize: int) -> onnx.NodeProto:
    return helper.make_node("MoE", [inp, "logits", "fc1", "", "fc2"], [out], domain="com.microsoft", k=K,
                            activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=normalize,
                            activation_alpha=1.0, activation_beta=0.0)


def _cases(normalize: int) -> dict[str, tuple[list, str, str]]:
    """name -> (nodes, graph output, what the reference adds: "c", "x", "c+x" or "")."""
    mul = helper.make_node("Mul", ["x", "one"], ["xw"])
    add_c = helper.make_node("Add", ["moe", "half"], ["y"])
    return {
        "graph_input": ([_moe("x", "moe", normalize), add_c], "y", "c"),
        "intermediate": ([mul, _moe("xw", "moe", normalize), add_c], "y", "c"),
        "intermediate_side": ([mul, helper.make_node("Mul", ["x", "one"], ["side"]), _moe("xw", "moe", normalize),
                               helper.make_node("Add", ["moe", "side"], ["y"])], "y", "x"),
        "used_after": ([mul, _moe("xw", "moe", normalize), helper.make_node("Add", ["moe", "half"], ["y0"]),
                        helper.make_node("Add", ["y0", "xw"], ["y"])], "y", "c+x"),
        "graph_output": ([mul, _moe("xw", "y", normalize)], "y", ""),
        "workaround": ([mul, _moe("xw", "moe", normalize), helper.make_node("Where", ["keep", "moe", "xw"], ["moe_k"]),
                        helper.make_node("Add", ["moe_k", "half"], ["y"])], "y", "c"),
    }


def _run(nodes, output, fc1, fc2, x, logits, level: str) -> np.ndarray:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", H]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["tokens", E])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["tokens", H])],
        [numpy_helper.from_array(fc1, "fc1"), numpy_helper.from_array(fc2, "fc2"),
         numpy_helper.from_array(np.array(1, np.float32), "one"),
         numpy_helper.from_array(np.full((T, H), 0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(True), "keep")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "logits": logits})[0]


def check() -> dict:
    fc1, fc2, x, logits = _weights()
    errors: dict[str, float] = {}
    for normalize in (0, 1):
        want = reference(fc1, fc2, x, logits, normalize)
        for name, (nodes, output, plus) in _cases(normalize).items():
            expected = want + (0.5 if "c" in plus else 0.0) + (x if "x" in plus else 0.0)
            worst = 0.0
            for level in LEVELS:
                got = _run(nodes, output, fc1, fc2, x, logits, level).astype(np.float64)
                worst = max(worst, float(np.abs(got - expected).max() / np.abs(expected).max()))
            errors[f"{name}_n{normalize}"] = worst
    return {"onnxruntime": ort.__version__, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(check()))
