"""What a rule example or a rule case is made of, turned into real files and linted through the one pipeline.

A model is ONNX textual syntax (onnx.parser), a tests.models.qwen_moe.ModelSpec, or a committed file; a policy is
YAML text; genai_config.json is a JSON object or a committed file; run evidence is ortgate.evidence.RunEvidence as
plain data. Used by tests/test_rule_docs.py (the Bad/Good examples of every rule's docstring) and
tests/test_rule_cases.py (one case file per rule code).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

from ortgate import evidence as evidence_module
from ortgate.engine.baseline import load_baseline
from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs
from ortgate.evidence import RunEvidence
from ortgate.findings import Finding, Location
from ortgate.rules import all_rules
from ortgate.rules.context import EVIDENCE_KEY, RuleContext
from ortgate.rules.needs import unmet
from tests.conftest import REPO

DEFAULT_MODEL = REPO / "examples" / "qwen3-moe-tiny-fused" / "model.onnx"


def model_from_text(text: str) -> onnx.ModelProto:
    """Parse ONNX textual syntax; a typed name in the graph's <...> list that no node computes becomes a weight
    of zeros (an initializer), so the example reads like the graph and stays a valid model."""
    model = onnx.parser.parse_model(text)
    graph = model.graph
    computed = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    weights = [v for v in graph.value_info if v.name not in computed]
    for info in weights:
        tensor_type = info.type.tensor_type
        if any(d.dim_param or not d.HasField("dim_value") for d in tensor_type.shape.dim):
            raise ValueError(f"weight {info.name!r} needs static dims: a weight is a constant")
        dims = [d.dim_value for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        graph.initializer.append(numpy_helper.from_array(np.zeros(dims, dtype=dtype), info.name))
    names = {w.name for w in weights}
    kept = [v for v in graph.value_info if v.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return model


def spec_model(spec: dict, folder: Path) -> Path:
    """The model a ModelSpec describes, built once per spec in `folder`."""
    from tests.models.qwen_moe import ModelSpec, build_model, save_model

    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    path = folder / f"spec-{key}" / "model.onnx"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_model(build_model(ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})), path)
    return path


def _from_data(kind: Any, data: Any) -> Any:
    """Plain data (from YAML) -> an instance of `kind`: dataclasses of ortgate.evidence, Location, containers."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
        origin = typing.get_origin(kind)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind, vars(evidence_module) | {"Location": Location})
        fields = {f.name: f for f in dataclasses.fields(kind)}
        unknown = set(data) - set(fields)
        if unknown:
            raise ValueError(f"{kind.__name__} has no field {sorted(unknown)}")
        values = {name: _from_data(hints[name], value) for name, value in data.items()}
        for name, f in fields.items():  # an optional field without a default may be left out: None
            if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING \
                    and type(None) in typing.get_args(hints[name]):
                values[name] = None
        return kind(**values)
    if origin in (list, tuple):
        item = typing.get_args(kind)[0]
        items = [_from_data(item, v) for v in data]
        return items if origin is list else tuple(items)
    return data


def evidence_from(data: dict) -> RunEvidence:
    return _from_data(RunEvidence, {"model": "model.onnx", "policy": "policy.yaml", **data})


@dataclass
class RuleInputs:
    """One example or case: what the user would give ortgate."""

    model_text: str | None = None  # ONNX textual syntax
    model_spec: dict | None = None  # tests.models.qwen_moe.ModelSpec keyword arguments
    model_file: str | None = None  # a committed .onnx file or model folder, relative to the repository
    optimized_text: str | None = None
    optimized_file: str | None = None
    policy: str | None = None  # YAML text
    genai_config: dict | str | None = None  # a JSON object, or a committed file relative to the repository
    evidence: dict | None = None
    baseline: dict | None = None  # a findings baseline document
    base_text: str | None = None  # the base model (`--compare BASE_MODEL`) in ONNX textual syntax
    base_spec: dict | None = None  # ... or a ModelSpec
    select: list[str] = field(default_factory=list)  # rules to run beside the one under test
    cache: Path | None = None  # where models built from a ModelSpec are kept between examples

    def write(self, folder: Path) -> tuple[LintRequest, RunEvidence | None]:
        """Real files in `folder` for the pipeline: model.onnx, model.optimized.onnx, policy.yaml,
        genai_config.json."""
        folder.mkdir(parents=True, exist_ok=True)
        model = folder / "model.onnx"
        if self.model_text is not None:
            onnx.save(model_from_text(self.model_text), model)
        elif self.model_spec is not None:
            model = spec_model(self.model_spec, self.cache or folder)
        elif self.model_file is not None:
            source = REPO / self.model_file
            model = source if source.is_file() else source / "model.onnx"
            if source.is_dir() and (source / "genai_config.json").is_file() and self.genai_config is None:
                self.genai_config = str((source / "genai_config.json").relative_to(REPO))
        elif self.optimized_text is not None:
            onnx.save(model_from_text(self.optimized_text), model)
        else:
            shutil.copy(DEFAULT_MODEL, model)
        optimized = None
        if self.optimized_text is not None:
            optimized = folder / "model.optimized.onnx"
            onnx.save(model_from_text(self.optimized_text), optimized)
        elif self.optimized_file is not None:
            optimized = REPO / self.optimized_file
        policy = None
        if self.policy is not None:
            policy = folder / "policy.yaml"
            text = self.policy if re.search(r"^name:", self.policy, re.M) else f"name: example\n{self.policy}"
            policy.write_text(text)
        config = None
        if isinstance(self.genai_config, dict):
            config = folder / "genai_config.json"
            config.write_text(json.dumps(self.genai_config, indent=4))
        elif isinstance(self.genai_config, str):
            config = REPO / self.genai_config
        request = LintRequest(str(model), str(policy) if policy else None, str(optimized) if optimized else None,
                              str(config) if config else None)
        return request, evidence_from(self.evidence) if self.evidence is not None else None


def lint_rule(code: str, given: RuleInputs, folder: Path) -> list[Finding]:
    """The gated findings of rule `code` (and of the rules `given.select` adds) on these inputs."""
    request, run = given.write(folder)
    inputs = load_inputs(request)
    base = _base_model(given, folder)
    if base is not None:
        from dataclasses import replace

        inputs = replace(inputs, base=load_inputs(LintRequest(str(base), request.policy)))
    if run is not None:
        inputs = inputs.with_evidence(EVIDENCE_KEY, run)
    baseline = None
    if given.baseline is not None:
        path = folder / "baseline.json"
        path.write_text(json.dumps(given.baseline, indent=2))
        baseline = load_baseline(path)
    config = gate_config_from(inputs.policy, cli_select=[code, *given.select], cli_ignore=None, fail_on=None,
                              baseline=baseline, baseline_path=str(folder / "baseline.json") if baseline else None)
    result = lint(inputs, config)
    check_needs(code, inputs)
    return [f for f in result.findings if f.code == code]


def _base_model(given: RuleInputs, folder: Path) -> Path | None:
    """The base model file of a case or example that compares (`--compare BASE_MODEL`), in its own folder."""
    if given.base_text is None and given.base_spec is None:
        return None
    if given.base_spec is not None:
        return spec_model(given.base_spec, given.cache or folder / "base")
    path = folder / "base" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model_from_text(given.base_text or ""), path)
    return path


def check_needs(code: str, inputs) -> None:
    """A rule yields nothing on inputs that lack one of its declared needs (`@rule(needs=...)`): what lets the engine
    skip it there and name it on the `not checked:` line. Checked on every example and case lint_rule runs, by
    running the rule itself (the engine no longer does on such inputs)."""
    rule = next(r for r in all_rules() if r.code == code)
    lacking = unmet(rule.needs, inputs)
    found = list(rule.check(RuleContext(inputs, rule)) or ()) if lacking else []
    assert not (lacking and found), (f"{code} declares needs {list(rule.needs)} and these inputs lack "
                                     f"{list(lacking)}, yet it found: {found[0].message}")
