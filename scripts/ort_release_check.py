"""One-node probes of what an ONNX Runtime release's CPU provider does with the node forms ortgate judges
(ortgate/knowledge/ort_cpu_limits.json, op_schemas.json): builds each model with onnx.helper, creates a CPU session
and runs it once, and prints one JSON line: the release and, per case, `loads`, `runs` and ORT's message.

    python scripts/ort_release_check.py                      # the onnxruntime of this Python
    PYTHONPATH=UNPACKED_WHEEL python scripts/ort_release_check.py

Needs only onnxruntime, onnx and numpy (not ortgate): tests/test_ort_release_claims.py runs it in this Python and
in ORTGATE_OTHER_ORT_PYTHON, and checks each outcome against what the knowledge files claim for that release.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

E, H, INTER, T = 4, 8, 8, 3


def _moe(attrs: dict, fc3: bool = False, fc1_rows: int = 2 * INTER, op: str = "MoE"):
    rng = np.random.default_rng(0)
    inits = [
        helper.make_tensor("fc1", TensorProto.FLOAT, [E, fc1_rows, H], rng.standard_normal(E * fc1_rows * H) * 0.1),
        helper.make_tensor("fc2", TensorProto.FLOAT, [E, H, INTER], rng.standard_normal(E * H * INTER) * 0.1),
    ]
    inputs = ["x", "logits", "fc1", "", "fc2"]
    if fc3:
        inits.append(helper.make_tensor("fc3", TensorProto.FLOAT, [E, INTER, H],
                                        rng.standard_normal(E * INTER * H) * 0.1))
        inputs += ["", "fc3"]
    node = helper.make_node(op, inputs, ["y"], domain="com.microsoft", k=2, **attrs)
    graph = helper.make_graph([node], "moe", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, H]),
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [T, E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, H])], inits)
    return graph, {"x": rng.standard_normal((T, H)).astype(np.float32),
                   "logits": rng.standard_normal((T, E)).astype(np.float32)}


def _one(op: str, inputs: dict[str, tuple[int, ...]], outputs: list[str], **attrs):
    rng = np.random.default_rng(0)
    node = helper.make_node(op, list(inputs), outputs, domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                                           for n, s in inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    return graph, {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}


CASES = {
    "moe_swiglu_interleaved": lambda: _moe({"activation_type": "swiglu", "swiglu_fusion": 1}),
    "moe_swiglu_fusion_2": lambda: _moe({"activation_type": "swiglu", "swiglu_fusion": 2}),
    "moe_geglu": lambda: _moe({"activation_type": "geglu", "swiglu_fusion": 1}),
    "moe_relu2": lambda: _moe({"activation_type": "relu2"}, fc1_rows=INTER),
    "moe_silu_fc3": lambda: _moe({"activation_type": "silu"}, fc3=True, fc1_rows=INTER),
    "moe_swiglu_limit_after_activation": lambda: _moe(
        {"activation_type": "swiglu", "swiglu_fusion": 1, "swiglu_limit_after_activation": 1}),
    "moe_group_router": lambda: _one("MoEGroupRouter", {"logits": (T, 8), "expert_bias": (8,)}, ["router_probs"],
                                     top_k=2, n_group=2, topk_group=1),
    "swiglu": lambda: _one("SwiGLU", {"gate": (T, INTER), "up": (T, INTER)}, ["y"]),
}


# Session config entries a release checks at session creation (knowledge/ort_session_keys.json), on a one-Identity model.
KEY_CASES = {
    "offload_key_misspelt": {"session.moe.offload.gpu_budget_byte": "1"},
    "offload_key_known": {"session.moe.offload.gpu_budget_bytes": "auto"},
    "offload_mode_bad": {"session.moe.offload.mode": "true"},
    "offload_mode_required": {"session.moe.offload.mode": "REQUIRED"},
    "offload_mode_on": {"session.moe.offload.mode": "on"},
    "offload_placement_bad": {"session.moe.offload.placement": "basic"},
    "offload_cpu_threads_bad": {"session.moe.offload.cpu_threads": "x"},
    "prototype_offload_key": {"moe.cpu_offload.enable": "1"},
    "kernel_dispatch_policy_bad": {"session.kernel_dispatch_policy": "fast"},
    "kernel_dispatch_policy_known": {"session.kernel_dispatch_policy": "latency"},
    "weightless_mode_bad": {"ep.enable_weightless_mode": "3"},
    "weightless_mode_known": {"ep.enable_weightless_mode": "2"},
}


def probe_keys(entries: dict[str, str]) -> dict:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    options = ort.SessionOptions()
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return {"loads": False, "message": str(exc).splitlines()[0][:400]}
    return {"loads": True, "message": ""}


def probe(name: str) -> dict:
    graph, feeds = CASES[name]()
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        return {"loads": False, "runs": False, "message": str(exc).splitlines()[0][:400]}
    try:
        session.run(None, feeds)
    except Exception as exc:
        return {"loads": True, "runs": False, "message": str(exc).splitlines()[0][:400]}
    return {"loads": True, "runs": True, "message": ""}


def main() -> None:
    ort.set_default_logger_severity(4)
    print(json.dumps({"onnxruntime": ort.__version__, "cases": {name: probe(name) for name in CASES},
                      "keys": {name: probe_keys(entries) for name, entries in KEY_CASES.items()}}))


if __name__ == "__main__":
    main()
