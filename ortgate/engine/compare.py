"""The model against the base it changes (`ortgate lint MODEL --compare BASE_MODEL`, the Action's compare-ref).

The base is loaded and linted with the model's policy and gate (no findings baseline: the base's findings are
what the model is compared with). Findings are matched by the identity baselines use (`Finding.identity`: rule,
file, layer, structural signature or config key; never a node name, so a re-export that renames nodes keeps its
findings), with the base's files named as the model's: a finding of the model is new or unchanged, a finding of
the base that the model no longer has is absent. The estimates of both, on the policy's device, are compared
with `ortgate.cost.compare`, and the findings that appeared or disappeared with a price say what explains the
change. This module compares; the gate (the throughput-regression rule) decides.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ortgate.config.model_folder import resolve_model_path
from ortgate.cost.compare import EstimateComparison, compare_estimates
from ortgate.engine.baseline import GATE_FAMILY
from ortgate.engine.gate import GateConfig
from ortgate.engine.pipeline import LintRequest, LintResult, lint, load_inputs
from ortgate.engine.throughput import CostOverrides
from ortgate.errors import InputError
from ortgate.findings import Finding
from ortgate.rules.context import LintInputs

NEW, UNCHANGED, ABSENT = "new", "unchanged", "absent"  # SARIF 2.1.0 result.baselineState values
# Rules about the comparison itself (they need a base: the base's own lint has none), left out of it.
_ABOUT_THE_COMPARISON = frozenset({"throughput-regression"})


@dataclass(frozen=True)
class Explanation:
    """A rule's findings that appeared (they cost the model time) or disappeared (the model saved what fixing them
    would have saved), with their price on the device: what explains the estimate's change."""

    change: str  # "appeared" | "disappeared"
    code: str
    rule: str
    findings: int
    layers: tuple[int, ...]
    ms_per_token: float  # what fixing them saves on the model (appeared) or saved on the base (disappeared)

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "code": self.code, "rule": self.rule, "findings": self.findings,
                "layers": list(self.layers), "ms_per_token": round(self.ms_per_token, 4), "estimate": True}


@dataclass
class Comparison:
    """What changed from the base to the model: findings by baseline state, the estimates, the explanations."""

    base: str  # the base's model file
    model: str  # the model's file
    appeared: list[Finding]  # the model's findings the base does not have
    unchanged: list[Finding]  # the model's findings the base has too
    disappeared: list[Finding]  # the base's findings the model does not have (their file named as the model's)
    estimate: EstimateComparison | None = None  # None: no device priced
    explained_by: list[Explanation] = field(default_factory=list)
    base_label: str | None = None  # how to name the base in reports ("main:models/qwen"); None: its path
    _states: dict[int, str] = field(default_factory=dict, repr=False)

    def state(self, finding: Finding) -> str | None:
        """The SARIF baselineState of one of the model's findings: new or unchanged (None: not compared)."""
        return self._states.get(id(finding))

    @property
    def base_name(self) -> str:
        return self.base_label or self.base

    def to_dict(self, finding_dict: Callable[[Finding], dict]) -> dict[str, Any]:
        return {
            "base": self.base_name,
            "base_file": self.base,
            "model": self.model,
            "appeared": [finding_dict(f) for f in self.appeared],
            "disappeared": [finding_dict(f) for f in self.disappeared],
            "unchanged": len(self.unchanged),
            "estimate": self.estimate.to_dict() if self.estimate is not None else None,
            "explained_by": [e.to_dict() for e in self.explained_by],
        }


def load_base(base: str, model: LintInputs, policy: str | None,
              progress: Callable[[str], None] | None = None, cost: CostOverrides | None = None) -> LintInputs:
    """The base model's inputs, with the model's policy (its own genai_config.json beside it). A base that is the
    model itself, or that is no model, is an InputError naming it."""
    try:
        files = resolve_model_path(base)
    except InputError as exc:
        raise InputError(f"--compare: {exc.problem}", exc.path, line=exc.line) from None
    if _same_file(files.model, Path(model.model.path)):
        raise InputError(f"--compare: the base is the model itself ({model.model.path}); name the model the change "
                         "starts from", base)
    try:
        # the base is judged on the model's release (the same --ort-version, else the same policy's)
        ort = model.deployment.ort
        release = ort.version if ort.source == "--ort-version" else None
        return load_inputs(LintRequest(base, policy, cost=cost, ort_version=release), progress)
    except InputError as exc:
        raise InputError(f"--compare: {exc.problem}", exc.path, line=exc.line) from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:
        return False


def compare(result: LintResult, inputs: LintInputs, base: LintInputs, config: GateConfig,
            progress: Callable[[str], None] | None = None, *, base_label: str | None = None) -> Comparison:
    """Lint the base as the model was linted (without a findings baseline) and compare the two."""
    base_config = dataclasses.replace(config, baseline=None, baseline_path=None)
    if progress is not None:
        progress(f"linting the base {base.model.path}")
    base_result = lint(base, base_config)
    renamed = _renaming(base, inputs)
    mine = [f for f in result.findings if _compared(f)]
    theirs = [_as_model(f, renamed) for f in base_result.findings if _compared(f)]
    left = Counter(f.identity() for f in theirs)
    states: dict[int, str] = {}
    appeared, unchanged = [], []
    for f in mine:
        key = f.identity()
        if left[key] > 0:
            left[key] -= 1
            unchanged.append(f)
            states[id(f)] = UNCHANGED
        else:
            appeared.append(f)
            states[id(f)] = NEW
    ours = Counter(f.identity() for f in mine)
    disappeared = []
    for f in theirs:
        key = f.identity()
        if ours[key] > 0:
            ours[key] -= 1
        else:
            disappeared.append(f)
    est = estimate_comparison(base, inputs)
    return Comparison(base.model.path, inputs.model.path, appeared, unchanged, disappeared, est,
                      _explanations(appeared, disappeared), base_label or base.model.label, states)


def estimate_comparison(base: LintInputs, inputs: LintInputs) -> EstimateComparison | None:
    """The two estimates (and memory) side by side; None when the device is not priced."""
    if inputs.estimate is None or base.estimate is None:
        return None
    memory = (base.memory.total, inputs.memory.total) if base.memory is not None and inputs.memory is not None \
        else None
    return compare_estimates(base.estimate, inputs.estimate, memory)


def _compared(f: Finding) -> bool:
    return not f.code.startswith(GATE_FAMILY) and f.rule not in _ABOUT_THE_COMPARISON


def _renaming(base: LintInputs, inputs: LintInputs) -> dict[str, str]:
    """The base's files -> the model's files they stand for (the model, genai_config.json)."""
    out = {base.model.path: inputs.model.path}
    if base.genai is not None and inputs.genai is not None:
        out[str(base.genai.path)] = str(inputs.genai.path)
    return out


def _as_model(f: Finding, renamed: dict[str, str]) -> Finding:
    file = renamed.get(f.location.file)
    return f if file is None else replace(f, location=replace(f.location, file=file, label=None))


def _explanations(appeared: list[Finding], disappeared: list[Finding]) -> list[Explanation]:
    out = []
    for change, findings in (("appeared", appeared), ("disappeared", disappeared)):
        by_rule: dict[str, list[Finding]] = {}
        for f in findings:
            if f.price is not None and f.price.ms_per_token > 0 and f.suppressed is None:
                by_rule.setdefault(f.code, []).append(f)
        for code, group in by_rule.items():
            layers = tuple(sorted({f.layer for f in group if f.layer is not None}))
            out.append(Explanation(change, code, group[0].rule, len(group), layers,
                                   sum(f.price.ms_per_token for f in group if f.price is not None)))
    return sorted(out, key=lambda e: (-e.ms_per_token, e.change, e.code))


def with_comparison(result: LintResult, comparison: Comparison) -> LintResult:
    return replace(result, comparison=comparison)
