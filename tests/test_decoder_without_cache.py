"""A causal-LM export with no KV cache: named by decoder-without-kv-cache, priced as the recompute it is, and
measured by `ortgate run` as the prefill it is."""

from __future__ import annotations

import onnx
import pytest

from ortgate.cost import CostSetup, StepShape, estimate
from ortgate.graph import build_graph
from ortgate.graph.patterns.decoder import cacheless_decoder
from ortgate.knowledge.devices import find_device
from ortgate.rules.inventory import kv_cache_export_advice
from tests.conftest import EXPORTED
from tests.helpers import run_cli
from tests.models.qwen_moe import ModelSpec, build_model


def _graph(folder: str):
    path = EXPORTED / folder / "model.onnx"
    return build_graph(onnx.load(str(path), load_external_data=False), str(path))


def _flops(graph, context: int) -> float:
    device = find_device("h100-sxm")  # a catalog device with every figure: FLOPs do not depend on it
    assert device is not None
    return estimate(graph, CostSetup(device, StepShape(1, 1, context))).as_exported.totals.flops


@pytest.mark.parametrize("folder", ["dynamo-qwen3_moe", "dynamo-mixtral", "dynamo-minimax"])
def test_dynamo_exports_without_cache_are_recognised(folder):
    found = cacheless_decoder(_graph(folder))
    assert found is not None and (found.tokens, found.logits, found.vocab) == ("input_ids", "logits", 128)


@pytest.mark.parametrize("folder", ["optimum-llama-past", "genai-qwen3_5_moe-fp32-cpu", "olive-mixtral"])
def test_graphs_with_a_cache_or_present_outputs_are_not(folder):
    assert cacheless_decoder(_graph(folder)) is None


def test_a_cache_less_step_is_priced_as_a_prefill_of_the_context():
    graph = _graph("dynamo-qwen3_moe")
    # every projection and expert runs over the whole context: 128 times the positions, 128 times the FLOPs
    assert _flops(graph, 2048) == pytest.approx(128 * _flops(graph, 16), rel=1e-6)
    cached = build_graph(build_model(ModelSpec()), "cached")
    linear_cached = _flops(cached, 2048) - _flops(cached, 16)  # only the attention over the cache grows
    assert linear_cached < 0.5 * _flops(cached, 16) * 127


def test_the_advice_names_the_exporter_that_made_the_model():
    dynamo = kv_cache_export_advice(_graph("dynamo-qwen3_moe"))
    torchscript = kv_cache_export_advice(_graph("optimum-llama-past"))  # pytorch, without the dynamo metadata
    optimizer = kv_cache_export_advice(_graph("olive-mixtral"))
    assert dynamo.startswith("This model was made by torch.onnx.export(dynamo=True)") and "export_for_generation" in dynamo
    assert "TorchScript" in torchscript and "--task text-generation-with-past" in torchscript
    assert "transformers optimizer" in optimizer
    unknown = build_graph(build_model(ModelSpec(naming="opaque")), "m")
    assert "text-generation-with-past" in kv_cache_export_advice(unknown)


def test_run_labels_the_measured_step_a_prefill(write_policy):
    policy = write_policy("name: p\nextends: builtin:cpu\nmodel: {kind: decoder}\n"
                          "runner: {warmup: 1, iterations: 2, sequence_length: 8}\n")
    code, out, _ = run_cli("run", EXPORTED / "dynamo-qwen3_moe", "--policy", policy)
    assert "tokens/s of prefill (batch 1 x 8 tokens" in out
    assert "decoder-without-kv-cache" in out and code == 1


def test_the_prefill_graph_of_a_split_export_returns_its_cache():
    """transformers' OnnxExporter.export_for_generation writes prefill.onnx (token ids in; logits and
    cache.layers.N.keys/values out) beside decode.onnx: the prefill graph has no past input and is no cache-less
    decoder."""
    from onnx import TensorProto, helper

    table = helper.make_tensor("embed", TensorProto.FLOAT, [8, 4], [0.1] * 32)
    head = helper.make_tensor("head", TensorProto.FLOAT, [4, 8], [0.1] * 32)
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h"]),
             helper.make_node("MatMul", ["h", "head"], ["logits"]),
             helper.make_node("Unsqueeze", ["h", "axes"], ["cache.layers.0.keys"])]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", 8]),
               helper.make_tensor_value_info("cache.layers.0.keys", TensorProto.FLOAT, ["B", 1, "T", 4])]
    graph = helper.make_graph(nodes, "prefill", [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                                                               ["B", "T"])],
                              outputs, initializer=[table, head, axes])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    assert cacheless_decoder(build_graph(model, "prefill")) is None
    del model.graph.output[1]
    assert cacheless_decoder(build_graph(model, "logits only")) is not None


def _wide_cacheless(tmp_path):
    """A one-layer skeleton of Qwen3-30B-A3B's widths in bfloat16 (hidden 2048, vocabulary 151,936), exported
    without a KV cache: its weights are external stubs, never bytes."""
    from tests.models.qwen_moe import save_model

    model = build_model(ModelSpec(layers=1, hidden=2048, vocab=151936, experts=4, moe_intermediate=768, num_heads=32,
                                  kv_num_heads=4, head_dim=128, dtype="bfloat16", weights="external_stub",
                                  kv_cache=False, attention="decomposed", qkv="separate", moe="dense_loop"))
    for info in model.graph.input:  # a cache-less export's mask spans the sequence it is given
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param == "total_sequence_length":
                dim.dim_param = "sequence_length"
    folder = tmp_path / "wide"
    folder.mkdir()
    save_model(model, folder / "model.onnx")
    return folder


def _json(*args):
    import json

    code, out, err = run_cli(*map(str, args), "--format", "json")
    assert code in (0, 1), err
    return json.loads(out)


def test_memory_of_a_cache_less_decoder_is_that_of_recomputing_every_position(tmp_path):
    """Each step recomputes all 32,768 positions: the logits alone are 32,768 x 151,936 x 2 B = 9.3 GiB, not one
    token's; the decomposed attention's scores over them (32 heads x 32,768 x 32,768, and their softmax) more."""
    folder = _wide_cacheless(tmp_path)
    memory = _json("estimate", folder, "--device", "h100-sxm", "--context", "32768")["memory"]
    logits = 32768 * 151936 * 2
    scores = 2 * 32 * 32768 * 32768 * 2
    workspace = memory["parts"]["workspace"]
    assert workspace["bytes"] >= logits + scores
    assert "recomputes all 32,768 positions" in workspace["how"] and "32 heads x 32,768 x 32,768" in workspace["how"]
    assert memory["parts"]["kv_cache"]["how"].startswith("none: the graph has no KV cache")
    short = _json("estimate", folder, "--device", "h100-sxm", "--context", "2048")["memory"]["parts"]["workspace"]
    assert 16 * short["bytes"] < workspace["bytes"]  # 16 times the context: more than 16 times the workspace


def test_one_memory_model_per_batch_for_lint_estimate_and_the_sweep(tmp_path):
    folder = _wide_cacheless(tmp_path)
    sweep = _json("estimate", folder, "--device", "h100-sxm", "--context", "32768", "--batch", "1,64")
    alone = _json("estimate", folder, "--device", "h100-sxm", "--context", "32768", "--batch", "64")["memory"]
    by_batch = {b["batch_size"]: b["memory_bytes"] for b in sweep["batches"]}
    assert by_batch[1] == sweep["memory"]["total_bytes"] and by_batch[64] == alone["total_bytes"]
    assert by_batch[64] > 60 * by_batch[1] * 0.9  # the workspace grows with every sequence recomputed
    assert [b["share_of_device"] > 1 for b in sweep["batches"]] == [True, True]
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nthroughput: {device: h100-sxm, batch_size: 64, context_length: 32768}\n")
    found = [f for f in _json("lint", folder, "--policy", policy)["findings"] if f["rule"] == "memory-exceeds-device"]
    assert [f["properties"]["total_bytes"] for f in found] == [alone["total_bytes"]]
    code, out, _ = run_cli("estimate", folder, "--device", "h100-sxm", "--context", "32768", "--batch", "1,64")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("batch"))
    assert "memory" in header
