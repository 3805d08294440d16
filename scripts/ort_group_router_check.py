"""What com.microsoft.MoEGroupRouter + com.microsoft.MoE compute on this onnxruntime (1.32.0 on): which routing.

Builds one graph, MoEGroupRouter(logits, bias) -> MoE(x, router_probs, fc1, fc2) (ReLU experts, E 8, k 2, groups
4, 2 of them kept, the top 2 of each group summed), for normalize_routing_weights 0 and 1, and compares it with numpy
references of DeepSeek-V3's noaux_tc routing: sigmoid scores s, groups ranked by the sum of the top 2 of s + bias,
the top k of s + bias inside the kept groups, each picked expert weighted by
  renormalised      s_i / sum of the picked s   (norm_topk_prob true)
  not_renormalised  s_i                         (norm_topk_prob false)
Prints one JSON object: the onnxruntime version and, per normalize_routing_weights setting and reference, the max
|error| / max |reference|. ortgate/knowledge/ort_group_router.json (with_moe) records what they give;
tests/test_fix_group_router.py runs this under ORTGATE_OTHER_ORT_PYTHON.

    python scripts/ort_group_router_check.py          # needs numpy, onnx, onnxruntime >= 1.32 only
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

T, E, H, INTER, K = 6, 8, 16, 8, 2
N_GROUP, TOPK_GROUP, GROUP_TOPK = 4, 2, 2


def session(normalize: int) -> tuple:
    rng = np.random.default_rng(1)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    fc1 = (rng.standard_normal((E, INTER, H)) * 0.3).astype(np.float32)
    fc2 = (rng.standard_normal((E, H, INTER)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("MoEGroupRouter", ["logits", "bias"], ["probs"], domain="com.microsoft", top_k=K,
                              n_group=N_GROUP, topk_group=TOPK_GROUP, group_topk=GROUP_TOPK),
             helper.make_node("MoE", ["x", "probs", "fc1", "", "fc2"], ["y"], domain="com.microsoft", k=K,
                              activation_type="relu", normalize_routing_weights=normalize)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [T, H]),
                                           helper.make_tensor_value_info("logits", 1, [T, E])],
                              [helper.make_tensor_value_info("y", 1, [T, H])],
                              [numpy_helper.from_array(bias, "bias"), numpy_helper.from_array(fc1, "fc1"),
                               numpy_helper.from_array(fc2, "fc2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]), bias, fc1, fc2


def reference(x, logits, bias, fc1, fc2, renormalise: bool) -> np.ndarray:
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    biased = s + bias
    size = E // N_GROUP
    group_scores = np.sort(biased.reshape(T, N_GROUP, size), -1)[..., -GROUP_TOPK:].sum(-1)
    out = np.zeros((T, H))
    for t in range(T):
        mask = np.full(E, -np.inf)
        for g in np.argsort(-group_scores[t])[:TOPK_GROUP]:
            mask[g * size:(g + 1) * size] = 0
        picked = np.argsort(-(biased[t] + mask))[:K]
        weights = s[t, picked] / (s[t, picked].sum() if renormalise else 1.0)
        for w, e in zip(weights, picked):
            out[t] += w * (fc2[e] @ np.maximum(fc1[e] @ x[t], 0))
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, H)).astype(np.float32)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    errors = {}
    for normalize in (0, 1):
        sess, bias, fc1, fc2 = session(normalize)
        got = sess.run(None, {"x": x, "logits": logits})[0]
        for name, renormalise in (("renormalised", True), ("not_renormalised", False)):
            want = reference(x, logits, bias, fc1, fc2, renormalise)
            errors[f"{name}_n{normalize}"] = float(np.abs(got - want).max() / np.abs(want).max())
    print(json.dumps({"onnxruntime": ort.__version__, "errors": errors}))


if __name__ == "__main__":
    main()
