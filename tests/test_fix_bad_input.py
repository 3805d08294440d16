"""`ortgate fix` on external weights that are missing or truncated: exit 2 naming the file and the tensor, whichever
step notices first (the MoE rewrite, onnxscript's fusions), and nothing left behind. And Olive's
OrtTransformersOptimization output is fixed, never an internal error."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from ortgate.cli import main
from ortgate.errors import InputError
from ortgate.fix.fusions import run_fusions
from tests.conftest import EXPORTED
from tests.models.qwen_moe import ModelSpec, build_model

# A real-width skeleton, every weight declared external, no bytes (hidden 1024: its norm weights are small enough
# for onnx_ir's initializer deduplication to read them, which is where the fusions used to fail with exit 3).
WEIGHTLESS = ModelSpec(layers=2, hidden=1024, experts=16, top_k=2, moe_intermediate=512, vocab=4096, num_heads=8,
                       kv_num_heads=2, head_dim=128, moe="dense_loop", weights="external_stub", norm="decomposed",
                       attention="decomposed", rotary="decomposed", kv_cache=False)
SELECTS = (None, "moe-not-fused", "rmsnorm-not-fused", "rotary-not-fused", "gqa-not-fused")


@pytest.fixture(scope="module")
def weightless(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("weightless") / "model.onnx"
    onnx.save(build_model(WEIGHTLESS), str(path))
    assert not path.with_name("model.onnx.data").exists()
    return path


def _nothing_left(folder: Path, out: Path) -> bool:
    return not out.exists() and not [p for p in folder.iterdir() if "ortgate-tmp" in p.name]


@pytest.mark.parametrize("select", SELECTS)
def test_weightless_export_exits_2_naming_the_file_and_a_tensor(tmp_path, weightless, select, capsys):
    out = tmp_path / "out"
    code = main(["fix", str(weightless), "-o", str(out), *(["--select", select] if select else [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.onnx.data" in err and "tensor '" in err and "missing" in err and "internal error" not in err
    assert _nothing_left(tmp_path, out)


def test_truncated_weights_before_the_fusions_exit_2(tmp_path, make_model, capsys):
    src = make_model(moe="fused", norm="decomposed", external_data=True)  # nothing for the MoE rewrite to read
    data = src.with_name(src.name + ".data")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    out = tmp_path / "out"
    code = main(["fix", str(src), "-o", str(out), "--select", "rmsnorm-not-fused"])
    err = capsys.readouterr().err
    assert code == 2 and "truncated" in err and "tensor '" in err and data.name in err
    assert _nothing_left(tmp_path, out)


def test_a_weight_file_onnxscript_cannot_read_is_an_input_error_naming_it(weightless):
    """The fusions' own guard, for what the pipeline's check does not see: onnx_ir's PassError over a missing
    file becomes the user's error, not an internal one."""
    model = onnx.load(str(weightless), load_external_data=False)
    with pytest.raises(InputError) as caught:
        run_fusions(model, ("rmsnorm",), weightless.parent)
    assert "model.onnx.data" in str(caught.value) and "external weights" in str(caught.value)


@pytest.mark.parametrize("select", SELECTS)
def test_olive_transformers_optimization_output_is_fixed_or_left_alone(tmp_path, select, capsys):
    out = tmp_path / "out"
    code = main(["fix", str(EXPORTED / "olive-mixtral"), "-o", str(out), *(["--select", select] if select else [])])
    captured = capsys.readouterr()
    assert code == 0, captured.err + captured.out
    assert "internal error" not in captured.err
