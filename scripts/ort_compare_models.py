"""Run two models from disk in plain onnxruntime CPU sessions (default session options, no added outputs) on the
same token inputs and compare their first outputs: what a user of the delivered folder runs.

    python scripts/ort_compare_models.py ORIGINAL.onnx FIXED.onnx     # needs numpy, onnx, onnxruntime only

Inputs: every int64 / int32 input of rank 2 ([batch, sequence]): `*mask*` all ones, others token ids in [0, 100)
(the committed exports' vocabularies are larger), at batch 2 x 16 tokens and batch 1 x 1 token. Prints one JSON
object: the onnxruntime version, the com.microsoft ops of the fixed model, and per step the max |diff| / max
|original| and whether every position's arg-max agrees. tests/test_fix_group_router.py runs it under
onnxruntime 1.32.0 (ORTGATE_OTHER_ORT_PYTHON) on what `ortgate fix` delivered.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort


def feeds(session: ort.InferenceSession, batch: int, tokens: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for arg in session.get_inputs():
        dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}.get(arg.type)
        if dtype is None or len(arg.shape) != 2:
            raise SystemExit(f"input {arg.name}: {arg.type} {arg.shape} is not a [batch, sequence] integer input")
        shape = (batch, tokens)
        out[arg.name] = np.ones(shape, dtype) if "mask" in arg.name else rng.integers(0, 100, shape).astype(dtype)
    return out


def main(original: str, fixed: str) -> None:
    options = ort.SessionOptions()
    a = ort.InferenceSession(original, options, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(fixed, options, providers=["CPUExecutionProvider"])
    steps = {}
    for batch, tokens in ((2, 16), (1, 1)):
        given = feeds(a, batch, tokens, seed=batch * 100 + tokens)
        want, got = a.run(None, given)[0], b.run(None, given)[0]
        steps[f"{batch}x{tokens}"] = {
            "max_rel": float(np.abs(want - got).max() / max(float(np.abs(want).max()), 1e-30)),
            "argmax_equal": bool((want.argmax(-1) == got.argmax(-1)).all()),
        }
    graph = onnx.load(fixed, load_external_data=False).graph
    ops = sorted({n.op_type for n in graph.node if n.domain == "com.microsoft"})
    print(json.dumps({"onnxruntime": ort.__version__, "ops": ops, "steps": steps}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
