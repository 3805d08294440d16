"""`ortgate fix` on transformers' own exporter's output, whose dims are named after torch.export's symbols (s54,
s70, ...): which dim is batch, new tokens, past and total length is read from the graph (the token input, the
cache inputs, the attention mask), and a `runner.dims` value the user sets for such a dim is honoured."""

from __future__ import annotations

import onnx

from ortgate.fix.verify import kv_cache_pairs
from ortgate.graph import build_graph
from ortgate.graph.load import load_model
from ortgate.runner.inputs import graph_dim_roles
from tests.conftest import EXPORTED
from tests.test_fix import fix_json

TRANSFORMERS = EXPORTED / "transformers-qwen3-past"


def _dims(path) -> dict[str, list]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


def test_the_dims_roles_are_read_from_the_graph():
    dims = _dims(TRANSFORMERS / "model.onnx")
    batch, query = dims["input_ids"]
    mask_batch, total = dims["attention_mask"]
    past = dims["past_key_values.layers.0.keys"][2]
    assert all(d.startswith("s") for d in (batch, query, mask_batch, total, past))  # names that say nothing
    graph = build_graph(load_model(TRANSFORMERS / "model.onnx"), "m")
    assert graph_dim_roles(graph) == {batch: "batch", query: "query", past: "past", mask_batch: "batch",
                                      total: "total"}
    assert kv_cache_pairs(graph)["past_key_values.layers.0.keys"] == "cache.layers.0.keys"


def test_fix_runs_on_the_transformers_exporter_output(tmp_path):
    code, report = fix_json(TRANSFORMERS, "-o", tmp_path / "out", "--select", "rmsnorm-not-fused")
    assert code == 0, report
    v = report["verification"]
    assert report["written"] and v["passed"] and not v["not_checked"]
    steps = [s["step"] for s in v["steps"]]
    assert "batch 2, 16 new tokens" in steps
    assert any("KV cache" in s for s in steps)  # the decode step fed the prompt's present cache


def test_runner_dims_the_user_sets_are_honoured(tmp_path, write_policy):
    batch = _dims(TRANSFORMERS / "model.onnx")["input_ids"][0]
    policy = write_policy(f"name: t\nexecution_provider: {{name: CPUExecutionProvider}}\nrunner:\n  dims:\n"
                          f"    {batch}: 1\n")
    code, report = fix_json(TRANSFORMERS, "-o", tmp_path / "out", "--select", "rmsnorm-not-fused", "--policy", policy)
    assert code == 0, report
    v = report["verification"]
    assert v["passed"] and v["steps"]
    assert all(s["step"].startswith("batch 1,") for s in v["steps"])
    assert all(shape[0] == 1 for s in v["steps"] for shape in s["inputs"].values())
