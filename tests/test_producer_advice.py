"""Fix advice that knows the tool that made the model (knowledge/producers.json, rules/advice.py): a model the
onnxruntime-genai builder wrote is never told to run that builder; it is told which release writes the fused form,
or what turned the form off. A model with no known producer keeps the generic advice."""

from __future__ import annotations

import shutil

import onnx
import pytest

from ortgate.knowledge.loader import KnowledgeError
from ortgate.knowledge.producers import producer_of, release
from tests.conftest import EXPORTED
from tests.helpers import rule_findings

OLD_QWEN3 = EXPORTED / "genai0.13-qwen3-fp32-cpu"  # onnxruntime-genai 0.13.2: q/k/v kept apart, no version recorded
GPT_OSS = EXPORTED / "genai-gpt_oss-fp32-cpu"  # onnxruntime-genai 0.18.0
QKV = "qkv-not-packed"
ROUTING = "moe-routing-mismatch"
BUILDER_PACKS = "onnxruntime-genai's model builder writes one packed qkv_proj for Qwen3"


def restamp(folder, tmp_path, *, name: str | None = None, version: str | None = None, strip_attr: str | None = None):
    """A copy of a fixture folder with the model's producer_name / producer_version rewritten (None: as made) and,
    given `strip_attr`, that attribute removed from every node. The weights file is copied unchanged."""
    out = tmp_path / folder.name
    shutil.copytree(folder, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    if name is not None:
        model.producer_name = name
    if version is not None:
        model.producer_version = version
    if strip_attr is not None:
        for node in model.graph.node:
            kept = [a for a in node.attribute if a.name != strip_attr]
            del node.attribute[:]
            node.attribute.extend(kept)
    onnx.save(model, str(out / "model.onnx"))
    return out


def test_old_builder_release_is_told_the_release_that_packs_qkv():
    model = onnx.load(str(OLD_QWEN3 / "model.onnx"), load_external_data=False)
    assert (model.producer_name, model.producer_version) == ("onnxruntime-genai", "")  # what 0.13.2 records
    found = rule_findings(OLD_QWEN3 / "model.onnx", QKV, config=OLD_QWEN3 / "genai_config.json")
    assert [f.layer for f in found] == [0, 1]
    for f in found:
        assert BUILDER_PACKS not in f.fix  # that builder already ran
        assert "re-export with onnxruntime-genai 0.14.0 or later" in f.fix
        assert "recorded no release number (releases before 0.16.0 record none)" in f.fix
        assert "disable_qkv_fusion" in f.fix  # an unknown release may be new and built with packing off
        assert f.fix.startswith("Pack Q, K and V into one projection")  # the how-to stays


def test_recorded_new_release_is_told_what_turned_packing_off(tmp_path):
    folder = restamp(OLD_QWEN3, tmp_path, version="0.18.0+00d66ef")
    found = rule_findings(folder / "model.onnx", QKV, config=folder / "genai_config.json")
    assert found
    for f in found:
        assert "made by onnxruntime-genai's model builder 0.18.0+00d66ef, which writes one packed qkv_proj" in f.fix
        assert "this model was built with --extra_options disable_qkv_fusion=1" in f.fix
        assert "or later" not in f.fix and BUILDER_PACKS not in f.fix


def test_recorded_older_release_is_told_to_upgrade(tmp_path):
    folder = restamp(OLD_QWEN3, tmp_path, version="0.13.2")
    (f, *_) = rule_findings(folder / "model.onnx", QKV, config=folder / "genai_config.json")
    assert "made by onnxruntime-genai's model builder 0.13.2; from 0.14.0 on" in f.fix
    assert "disable_qkv_fusion" not in f.fix  # the release is known: it predates packing with q/k norms


@pytest.mark.parametrize("producer", ["", "pytorch"])
def test_no_known_producer_keeps_the_generic_advice(tmp_path, producer):
    folder = restamp(OLD_QWEN3, tmp_path, name=producer, version="")
    found = rule_findings(folder / "model.onnx", QKV, config=folder / "genai_config.json")
    assert [f.layer for f in found] == [0, 1]
    for f in found:
        assert BUILDER_PACKS in f.fix and "This model was made by" not in f.fix


def test_builder_output_without_swiglu_limit_is_told_the_config_lacked_it(tmp_path, write_policy):
    policy = write_policy("name: p\nmodel:\n  family: gpt_oss\n")
    folder = restamp(GPT_OSS, tmp_path, strip_attr="swiglu_limit")
    (f,) = [f for f in rule_findings(folder / "model.onnx", ROUTING, policy) if "swiglu_limit" in f.message]
    assert dict(f.properties)["found"] is None
    assert "every release checked (0.13.2 to 0.18.0) writes swiglu_limit on the MoE / QMoE node" in f.fix
    assert "this model was built with a config.json without swiglu_limit" in f.fix
    assert "onnxruntime-genai's builder does" not in f.fix
    # the same graph from an unknown tool: the generic text, naming the builder as one that writes it
    folder = restamp(GPT_OSS, tmp_path / "anon", name="", version="", strip_attr="swiglu_limit")
    (f,) = [f for f in rule_findings(folder / "model.onnx", ROUTING, policy) if "swiglu_limit" in f.message]
    assert "Builders write these from config.json (onnxruntime-genai's builder does)." in f.fix
    assert "This model was made by" not in f.fix


def test_a_mismatch_the_builder_cannot_explain_keeps_its_fix_without_the_builder(write_policy):
    # GPT-OSS's SwiGLU constants against a family without them: the fix drops only the aside naming the builder.
    policy = write_policy("name: p\nmodel:\n  family: qwen3_5_moe\n")
    found = rule_findings(GPT_OSS / "model.onnx", ROUTING, policy)
    assert found
    for f in found:
        assert "Builders write these from config.json." in f.fix and "onnxruntime-genai" not in f.fix


def test_release_numbers_compare_as_numbers():
    assert release("0.18.0+00d66ef") == (0, 18, 0)
    assert release("v0.9") == (0, 9) and release("0.10.0") > release("0.9.1")  # type: ignore[operator]
    assert release("") is None and release("dev") is None


def test_producers_knowledge_reads_and_rejects_a_bad_release(tmp_path, monkeypatch):
    tool = producer_of(" ONNXRuntime-GenAI ")
    assert tool is not None and tool.forms["qkv_packed"].since == "0.14.0"
    assert producer_of("pytorch") is None and producer_of("") is None
    assert tool.advice("no_such_form", "0.18.0") is None

    import json

    from ortgate.knowledge import producers

    data = json.loads(producers.PRODUCERS_JSON.read_text())
    data["producers"]["onnxruntime-genai"]["forms"]["qkv_packed"]["since"] = "soon"
    bad = tmp_path / "producers.json"
    bad.write_text(json.dumps(data))
    monkeypatch.setattr(producers, "PRODUCERS_JSON", bad)
    with pytest.raises(KnowledgeError, match="'soon' is not a release number"):
        producers._load()


def test_unfused_moe_from_the_builder_is_told_the_execution_provider_turned_fusion_off(tmp_path):
    # The builder writes GPT-OSS's experts as standard ops for execution providers without a fused MoE kernel;
    # such a graph (here a standard-op GPT-OSS, stamped as the builder's) is not told to run the builder.
    folder = restamp(EXPORTED / "dynamo-gpt_oss", tmp_path, name="onnxruntime-genai", version="0.18.0")
    found = rule_findings(folder / "model.onnx", "moe-not-fused")
    assert [f.layer for f in found] == [0, 1]
    for f in found:
        assert "onnxruntime-genai's model builder writes it" not in f.fix
        assert "every release checked (0.13.2 to 0.18.0) writes one com.microsoft MoE / QMoE node per MoE layer" in f.fix
        assert "this model was built with an execution provider other than cpu, cuda, trt-rtx or webgpu" in f.fix
    anonymous = rule_findings(EXPORTED / "dynamo-gpt_oss" / "model.onnx", "moe-not-fused")
    assert all("onnxruntime-genai's model builder writes it" in f.fix for f in anonymous)
