"""No report line can be forged by an input: a policy key, a waiver reason, a policy name or a node name with a
newline, a carriage return or a terminal escape in it is printed escaped, in every format. A GitHub runner
executes any stdout line that starts with `::` (a workflow command), so the only such lines are ortgate's own
annotations in the `github` format; XML formats stay well-formed, JSON formats stay JSON."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from xml.etree import ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ortgate.engine.gate import decide
from ortgate.engine.pipeline import LintResult, LintSummary, ModelSummary
from ortgate.findings import Finding, Location, Severity
from ortgate.report import render
from tests.conftest import EXAMPLES
from tests.helpers import run_cli
from tests.test_fuzz import fuzz_settings

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
FORMATS = ("text", "json", "sarif", "github", "markdown", "junit", "codequality")
ANNOTATION = re.compile(r"::(error|warning|notice) [^\n]*::")
FORGED_KEY = "\n::set-output name=verdict::PASS"
FORGED_REASON = "migrating\n::error::forged\r\n::warning file=x::forged"
ESC_NAME = "forge\x1b[2K\x07"


def assert_unforged(fmt: str, report: str) -> None:
    """Nothing in `report` a CI runner or a terminal would take for something ortgate did not write."""
    assert "\x1b" not in report and "\r" not in report and "\x07" not in report, fmt
    for line in report.splitlines():
        stripped = line.lstrip()
        if fmt == "github" and stripped.startswith("::"):
            assert line == stripped and ANNOTATION.match(line), line
            assert not line.startswith("::set-output"), line  # a hostile `::` stays inside the message
        else:
            assert not stripped.startswith(("::", "##[")), (fmt, line)
    if fmt in ("json", "sarif", "codequality"):
        json.loads(report)
    if fmt == "junit":
        ET.fromstring(report)


@pytest.fixture(scope="module")
def hostile_policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "policy.yaml"
    path.write_text(f"name: {json.dumps(ESC_NAME)}\nextends: builtin:cpu\nsession:\n"
                    f"  free_dimension_overrides: {{{json.dumps(FORGED_KEY)}: 1}}\n"
                    f"waivers:\n  - rule: moe-not-fused\n    reason: {json.dumps(FORGED_REASON)}\n")
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_hostile_policy_forges_no_line_in_any_format(hostile_policy, fmt):
    code, out, err = run_cli("lint", UNFUSED, "--policy", hostile_policy, "--format", fmt)
    assert code == 1 and err == ""
    assert_unforged(fmt, out)
    assert "set-output" in out  # the key is reported, escaped, not dropped
    if fmt in ("text", "markdown", "github", "junit"):
        assert "\\n::set-output name=verdict::PASS" in out


def test_junit_keeps_the_waiver_reason_and_the_policy_name_escaped(hostile_policy):
    _, out, _ = run_cli("lint", UNFUSED, "--policy", hostile_policy, "--format", "junit")
    root = ET.fromstring(out)
    [name] = [p.get("value") for p in root.iter("property") if p.get("name") == "policy"]
    assert name == "forge\\x1b[2K\\x07"
    outs = "\n".join(e.text or "" for e in root.iter("system-out"))
    assert "[waiver: migrating\\n::error::forged\\r\\n::warning file=x::forged]" in outs
    assert not any(line.lstrip().startswith("::") for line in outs.splitlines())


# ---- the reporters, fuzzed with control-character-laden values ---------------------------------------------------

hostile_text = st.lists(st.sampled_from(["\n", "\r", "\x1b", "\x00", "\x07", "\x0b", "\u2028", "\ufffe",
                                         "::", "::error::", "::set-output name=x::", "%", ",", ":", "|",
                                         "`", "<", "</details>", "&", "a", " ", "é"]),
                         min_size=1, max_size=12).map("".join)


@fuzz_settings(60)
@given(key=hostile_text, reason=hostile_text, name=hostile_text, node=hostile_text, file=hostile_text)
def test_reporters_fuzzed_with_hostile_values_forge_no_line(key, reason, name, node, file):
    policy = Location(f"{file}.yaml", 3, f"session.free_dimension_overrides.{key}")
    findings = [
        Finding("OGS003", "free-dim-override-unknown", Severity.ERROR, f"free-dimension override {key!r} names no dim",
                policy, fix=f"Remove {key}"),
        Finding("OGF001", "moe-not-fused", Severity.ERROR, f"router {node} -> softmax", Location(f"{file}.onnx"),
                node=node, layer=0, fix="Fuse it"),
    ]
    findings.append(replace(findings[1], layer=1).suppress("waiver", reason, Location(f"{file}.yaml", 7)))
    summary = LintSummary((ModelSummary(f"{file}.onnx", policy=name, provider=name, nodes=10, layers=2),))
    result = LintResult(findings, decide(findings, Severity.ERROR), summary, [])
    for fmt in FORMATS:
        assert_unforged(fmt, render(fmt, result))


FORGED_PATH = "o\n::error::FORGED-OUT[bold]\x1b[2K"


def test_fix_text_report_prints_out_and_the_model_on_one_line(tmp_path):
    model = tmp_path / FORGED_PATH.replace("o", "m", 1)
    shutil.copytree(UNFUSED, model)
    code, out, err = run_cli("fix", model, "-o", tmp_path / FORGED_PATH, "--no-verify")
    assert code == 0, err
    assert_unforged("text", out)
    assert "o\\n::error::FORGED-OUT" in out


def test_estimate_text_report_prints_the_models_path_on_one_line(tmp_path):
    model = tmp_path / FORGED_PATH
    shutil.copytree(UNFUSED, model)
    code, out, err = run_cli("estimate", model, "--device", "h100-sxm")
    assert code == 0, err  # a `[bold]` in a path is text, not markup
    assert_unforged("text", out)
    assert "FORGED-OUT[bold]" in out


@pytest.mark.parametrize("command", ["validate", "show"])
def test_policy_commands_print_a_forged_file_name_on_one_line(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    base = "b\n::error::FORGED.yaml"
    (tmp_path / base).write_text("name: base\nexecution_provider:\n  name: cpu\n")
    policy = tmp_path / "::error::p.yaml"
    policy.write_text(f"name: child\nextends: {json.dumps(base)}\n")
    code, out, err = run_cli("policy", command, policy.name)
    assert "::error::" in out, (code, out, err)
    assert_unforged("text", out)


def test_run_text_report_prints_the_models_path_on_one_line(tmp_path):
    pytest.importorskip("onnxruntime")
    from tests.conftest import POLICIES

    model = tmp_path / FORGED_PATH
    shutil.copytree(UNFUSED, model)
    code, out, err = run_cli("run", model, "--policy", POLICIES / "tiny-moe-cpu.yaml", "--allow-cpu",
                             "--iterations", "2", "--warmup", "1")
    assert code in (0, 1), err
    assert_unforged("text", out)
    assert "o\\n::error::FORGED-OUT[bold]" in out
