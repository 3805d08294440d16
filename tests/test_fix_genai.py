"""`ortgate fix` writes genai_config.json beside the fixed model, and the folder runs in onnxruntime-genai generating
the token ids fix's own proof generated on ORT.

onnxruntime-genai pulls its own onnxruntime package, so it lives in another environment: the test runs it there with
the Python ORTGATE_GENAI_PYTHON names (a venv with onnxruntime-genai 0.18 installed) and is skipped without one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from ortgate.fix.generate import prompts
from tests.conftest import EXPORTED
from tests.test_fix import fix_json

GENAI_PYTHON = os.environ.get("ORTGATE_GENAI_PYTHON")
FLAGS = ["--context-length", "64", "--eos-token-id", "127", "--bos-token-id", "1"]

GENERATE = r"""
import json, sys
import numpy as np
import onnxruntime_genai as og

folder, rows, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = og.Model(folder)
params = og.GeneratorParams(model)
prompt = np.array(rows, dtype=np.int32)
params.set_search_options(max_length=prompt.shape[1] + steps, do_sample=False, batch_size=prompt.shape[0])
generator = og.Generator(model, params)
generator.append_tokens(prompt)
out = [[] for _ in rows]
while not generator.is_done() and len(out[0]) < steps:
    generator.generate_next_token()
    for row, token in enumerate(generator.get_next_tokens().tolist()):
        out[row].append(int(token))
print(json.dumps({"version": og.__version__, "ids": out}))
"""


def genai_ids(folder, rows, steps: int) -> list[list[int]]:
    assert GENAI_PYTHON is not None
    done = subprocess.run([GENAI_PYTHON, "-c", GENERATE, str(folder), json.dumps(rows), str(steps)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["ids"]


def until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@pytest.mark.skipif(not GENAI_PYTHON, reason="ORTGATE_GENAI_PYTHON names no Python with onnxruntime-genai")
@pytest.mark.parametrize("folder", ["optimum-qwen3_moe-past", "optimum-llama-past", "dynamo-qwen3_moe",
                                    "dynamo-glm4-interleaved", "dynamo-glm4_moe-rotary16"])
def test_the_fixed_folder_generates_the_same_ids_in_onnxruntime_genai(tmp_path, folder):
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / folder, "-o", out, *FLAGS)
    assert code == 0 and report["genai_config"].startswith("written")
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["num_key_value_heads"] == 2
    assert config["model"]["decoder"]["num_attention_heads"] == 4
    for proven in report["tokens"]["batches"]:
        rows = prompts(proven["batch"], config["model"]["vocab_size"]).tolist()
        got = genai_ids(out, rows, len(proven["ids"][0]))
        for row, expected in enumerate(proven["ids"]):
            want = until_eos(expected, 127)
            assert got[row][: len(want)] == want, (proven["batch"], row)


def test_without_the_ids_the_graph_cannot_tell_no_config_is_written_and_the_flags_are_named(tmp_path):
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "optimum-llama-past", "-o", out)
    assert code == 0 and not (out / "genai_config.json").exists()
    assert "--context-length N --eos-token-id N --bos-token-id N" in report["genai_config"]


def test_a_genai_config_beside_the_input_is_kept_as_it_is(tmp_path):
    source = tmp_path / "in"
    shutil.copytree(EXPORTED / "optimum-llama-past", source)
    mine = {"model": {"decoder": {"filename": "model.onnx", "inputs": {"input_ids": "input_ids"},
                                  "outputs": {"logits": "logits"}}, "type": "llama", "eos_token_id": 5}}
    (source / "genai_config.json").write_text(json.dumps(mine))
    before = (source / "genai_config.json").read_bytes()
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out, *FLAGS)
    assert code == 0
    assert (out / "genai_config.json").read_bytes() == before == (source / "genai_config.json").read_bytes()
    assert report["genai_config"].startswith("kept from the input as it is")
    assert "decoder names are the delivered model's" in report["genai_config"]
