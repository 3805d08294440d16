"""`ortgate fix` prices a rewrite with the cost model itself: the expert weight bytes it quotes per decode token are
`ortgate estimate`'s for the same model before the rewrite, and for the model it wrote after."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from ortgate.cli import main
from tests.conftest import EXPORTED

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# one model of each unfused expert form the rewrite handles
MODELS = {
    "dense": EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx",
    "batched": EXPORTED / "dynamo-olmoe" / "model.onnx",  # 8 experts, k=2: a step reads 2 of 8
    "gather": EXPORTED / "optimum-qwen3_moe-past" / "model.onnx",
}


def _json(*args: str | Path) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*map(str, args), "--format", "json"])
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else {}


def _estimated(model: Path) -> dict:
    # context 1: a graph without a KV cache recomputes every position of the context per step (OLMoE's export has
    # none), and a one-token step is what fix quotes; bytes read do not depend on the device
    code, report = _json("estimate", model, "--device", "h100-sxm", "--batch", "1", "--context", "1")
    assert code == 0
    return {layer["layer"]: layer["expert_bytes_read"] for layer in report["moe_layers"]}


@pytest.mark.parametrize("form", sorted(MODELS))
def test_fix_quotes_the_bytes_ortgate_estimate_gives(form, tmp_path):
    src, out = MODELS[form], tmp_path / "out"
    code, report = _json("fix", src, "-o", out, "--select", "moe-not-fused")
    assert code == 0 and report["rewrites"] and report["verification"]["passed"]
    quoted = {rw["layer"]: rw["weight_bytes_per_decode_token"] for rw in report["rewrites"]}
    before, after = _estimated(src), _estimated(out / "model.onnx")
    assert {layer: q["before"] for layer, q in quoted.items()} == before
    assert {layer: q["after"] for layer, q in quoted.items()} == after
    # one decode token reads k experts once fused, and the dense loop all of them before
    experts, k = report["rewrites"][0]["experts"], report["rewrites"][0]["k"]
    first = next(iter(quoted.values()))
    assert first["before"] * (k if form == "dense" else 1) == first["after"] * (experts if form == "dense" else 1)
