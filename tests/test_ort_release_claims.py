"""Each release-keyed CPU claim of ortgate's knowledge, re-proved on the installed onnxruntime (and, with
ORTGATE_OTHER_ORT_PYTHON naming another Python, e.g. one with onnxruntime 1.32.0, on that release too):

- scripts/ort_release_check.py builds one-node models (CPU MoE forms, MoEGroupRouter, SwiGLU, a 1.32.0 attribute),
  creates a CPU session and runs it; what the release does must be what op-unknown-to-release (OGX010) and
  provider-refuses-node (OGX011) say of the same model on that release: no finding where it runs, a finding naming
  session creation where it does not load, one naming the first run where it loads and then fails.
- the release's own registered schemas (get_all_operator_schema, and on a CPU wheel get_all_opkernel_def) must be
  what knowledge/op_schemas.json records for it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ortgate.findings import Severity
from ortgate.knowledge.op_schemas import (
    attribute_defined,
    covered_release,
    has_cpu_kernel,
    input_count,
    max_model_opset,
    op_defined,
    op_history,
)
from tests.conftest import REPO
from tests.helpers import lint_findings

CHECK = REPO / "scripts" / "ort_release_check.py"
GEN = REPO / "scripts" / "gen_op_contracts.py"
PYTHONS = [pytest.param(sys.executable, id="installed")]
if os.environ.get("ORTGATE_OTHER_ORT_PYTHON"):
    PYTHONS.append(pytest.param(os.environ["ORTGATE_OTHER_ORT_PYTHON"], id="other"))


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(python: str, *args: str) -> dict:
    done = subprocess.run([python, *args], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("python", PYTHONS)
def test_the_release_does_with_each_one_node_model_what_the_rules_say(python, tmp_path):
    import onnx
    from onnx import helper

    result = _run(python, str(CHECK))
    version = result["onnxruntime"]
    assert covered_release(version) is not None, f"onnxruntime {version} is outside the knowledge"
    check = _module(CHECK, "ort_release_check")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"name: cpu\nexecution_provider: {{name: CPUExecutionProvider, onnxruntime_version: "
                      f"'{version}'}}\n")
    for name, seen in result["cases"].items():
        graph, _ = check.CASES[name]()
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                       helper.make_opsetid("com.microsoft", 1)])
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, path)
        found = lint_findings(path, policy, select=["op-unknown-to-release", "provider-refuses-node"])
        said = " | ".join(f.message for f in found)
        if seen["runs"]:
            assert not found, f"{name} runs on onnxruntime {version}, but ortgate says: {said}"
        elif not seen["loads"]:
            assert found and all(f.severity is Severity.ERROR for f in found), (name, version, seen["message"])
            assert any("fails to load" in f.message or "fails at session creation" in f.message for f in found), \
                (name, version, said)
        else:
            assert any("fails at first run" in f.message for f in found), (name, version, seen["message"], said)


@pytest.mark.parametrize("python", PYTHONS)
def test_the_release_refuses_the_config_entries_ortgate_says_it_refuses(python):
    from ortgate.knowledge.session_keys import refused_key

    result = _run(python, str(CHECK))
    version = result["onnxruntime"]
    check = _module(CHECK, "ort_release_check")
    for name, seen in result["keys"].items():
        said = [refused_key(key, value, version) for key, value in check.KEY_CASES[name].items()]
        refused = any(r is not None for r in said)
        assert refused == (not seen["loads"]), (name, version, seen["message"], said)


@pytest.mark.parametrize("python", PYTHONS)
def test_the_release_registers_the_schemas_op_schemas_json_records(python):
    gen = _module(GEN, "gen_op_contracts")
    done = subprocess.run([python, "-c", "import onnxruntime; print(onnxruntime.get_device())"],
                          capture_output=True, text=True, check=True, timeout=120)
    cpu_wheel = done.stdout.strip() == "CPU"
    # Listing kernels of a GPU build needs its CUDA libraries: only a CPU wheel's kernels are compared.
    dump = _run(python, "-c", gen._DUMP, "1" if cpu_wheel else "0")
    version = dump["version"]
    assert covered_release(version) == version, f"onnxruntime {version}'s wheel was not read into op_schemas.json"
    assert max_model_opset(version) == (dump["max_model_opset"], version), "the newest opset a model may import"
    for op, schema in dump["ops"].items():
        assert op_defined(op, version), f"{op} is defined in {version}; op_schemas.json says not"
        assert input_count(op, version) == len(schema["inputs"]), (op, version)
        for attribute in schema["attributes"]:
            assert attribute_defined(op, attribute, version), (op, attribute, version)
        history = op_history(op)
        assert history is not None
        extra = [a for a in history.attributes if attribute_defined(op, a, version) and a not in schema["attributes"]]
        assert not extra, (op, extra, version)
        if cpu_wheel:
            assert has_cpu_kernel(op, version) == (op in dump["cpu_kernels"]), (op, version)
