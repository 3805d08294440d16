"""Two estimates of one deployment side by side: a model and the base it changes (`--compare BASE_MODEL`).

The step as exported and with every fix, for both, on the same device and step; the difference per component and
per group of identical decoder layers; and whether the two models' layers correspond at all (a base of another
family, or with another number of layers, is not the same model: its per-layer difference means nothing).
Every figure is an estimate for the device, never a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortgate.cost.estimate import Estimate, StepEstimate, layer_groups
from ortgate.cost.model import COMPONENTS


@dataclass(frozen=True)
class StepFigures:
    """One step's headline figures (as exported, or with every fix)."""

    tokens_per_s: float | None  # expected
    ms_per_step: float  # expected
    tokens_per_s_ceiling: float | None
    bytes: float
    launches: int
    syncs: int

    @classmethod
    def of(cls, step: StepEstimate) -> StepFigures:
        return cls(step.tokens_per_s_expected, step.expected_s * 1e3, step.tokens_per_s_ceiling, step.totals.bytes,
                   step.totals.launches, step.totals.syncs)

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_per_s_expected": _round(self.tokens_per_s, 3), "ms_per_step_expected": round(self.ms_per_step, 6),
                "tokens_per_s_ceiling": _round(self.tokens_per_s_ceiling, 3), "bytes_per_step": round(self.bytes),
                "kernel_launches": self.launches, "host_syncs": self.syncs}


@dataclass(frozen=True)
class PartDelta:
    """A component's (or a layer group's, per layer) expected time, bytes and launches in the base and the model."""

    name: str
    base_ms: float
    model_ms: float
    base_bytes: float
    model_bytes: float
    base_launches: int
    model_launches: int
    layers: tuple[int, ...] = ()  # a layer group's layers (empty for a component)
    base_form: str = ""
    model_form: str = ""

    @property
    def delta_ms(self) -> float:
        return self.model_ms - self.base_ms

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "base_ms": round(self.base_ms, 6), "model_ms": round(self.model_ms, 6), "delta_ms": round(self.delta_ms, 6),
            "base_bytes": round(self.base_bytes), "model_bytes": round(self.model_bytes),
            "base_kernel_launches": self.base_launches, "model_kernel_launches": self.model_launches}
        if self.layers:
            out.update(layers=list(self.layers), base_form=self.base_form, model_form=self.model_form)
        else:
            out["component"] = self.name
        return out


@dataclass(frozen=True)
class EstimateComparison:
    """The model's estimate against the base's, on the same device and step."""

    device: str
    base: StepFigures
    model: StepFigures
    base_fixed: StepFigures
    model_fixed: StepFigures
    components: tuple[PartDelta, ...]  # every component either model has, the base's order
    layer_groups: tuple[PartDelta, ...]  # per layer of each group of the model's identical layers; () when the
    # layers do not correspond
    layers_differ: str | None  # why the two models' layers do not correspond (None: they do)
    memory: tuple[float, float] | None = None  # the deployment's estimated memory, base and model (bytes)

    @property
    def tokens_change(self) -> float | None:
        """The relative change of the expected tokens/s as exported (-0.1: 10% fewer); None when either is unknown."""
        if not self.base.tokens_per_s or self.model.tokens_per_s is None:
            return None
        return self.model.tokens_per_s / self.base.tokens_per_s - 1.0

    def slower_parts(self) -> tuple[list[PartDelta], list[PartDelta]]:
        """The components and layer groups whose expected time grew, most first."""
        comps = sorted((c for c in self.components if c.delta_ms > 1e-9), key=lambda c: -c.delta_ms)
        groups = sorted((g for g in self.layer_groups if g.delta_ms > 1e-9), key=lambda g: -g.delta_ms * len(g.layers))
        return comps, groups

    def to_dict(self) -> dict[str, Any]:
        change = self.tokens_change
        return {
            "estimate": True,
            "device": self.device,
            "as_exported": {"base": self.base.to_dict(), "model": self.model.to_dict(),
                            "tokens_per_s_change": None if change is None else round(change, 4)},
            "with_fixes": {"base": self.base_fixed.to_dict(), "model": self.model_fixed.to_dict()},
            "components": [c.to_dict() for c in self.components],
            "layer_groups": [g.to_dict() for g in self.layer_groups],
            "layers_differ": self.layers_differ,
            "memory": None if self.memory is None else {"base_bytes": round(self.memory[0]),
                                                        "model_bytes": round(self.memory[1]),
                                                        "delta_bytes": round(self.memory[1] - self.memory[0])},
        }


def compare_estimates(base: Estimate, model: Estimate,
                      memory: tuple[float, float] | None = None) -> EstimateComparison:
    """`model`'s estimate against `base`'s (both for the same device and step); `memory`: the deployment's
    estimated memory of each (base, model)."""
    a_base, a_model = base.as_exported, model.as_exported
    names = [c for c in COMPONENTS if c in a_base.components or c in a_model.components]
    components = tuple(_part(c, a_base, a_model, a_base.components.get(c), a_model.components.get(c)) for c in names)
    differ = layers_differ(base, model)
    groups: tuple[PartDelta, ...] = ()
    if differ is None:
        base_groups = layer_groups(base)
        base_group = {layer: i for i, g in enumerate(base_groups) for layer in g.layers}
        out = []
        for g in layer_groups(model):
            # layers alike in the model and alike in the base: a group of each splits the other's
            split: dict[int, list[int]] = {}
            for layer in g.layers:
                split.setdefault(base_group.get(layer, -1), []).append(layer)
            for i, layers in split.items():
                first = layers[0]
                out.append(PartDelta(
                    _span(layers), _layer_ms(a_base, first), _layer_ms(a_model, first),
                    sum(t.bytes for t in a_base.layers.get(first, {}).values()),
                    sum(t.bytes for t in a_model.layers.get(first, {}).values()),
                    sum(t.launches for t in a_base.layers.get(first, {}).values()),
                    sum(t.launches for t in a_model.layers.get(first, {}).values()),
                    tuple(layers), base_groups[i].forms if i >= 0 else "", g.forms))
        groups = tuple(sorted(out, key=lambda p: p.layers[0]))
    return EstimateComparison(model.device.name, StepFigures.of(a_base), StepFigures.of(a_model),
                              StepFigures.of(base.with_fixes), StepFigures.of(model.with_fixes), components, groups,
                              differ, memory)


def layers_differ(base: Estimate, model: Estimate) -> str | None:
    """Why the two models' decoder layers do not correspond (None: the same layer indexes in both)."""
    mine = sorted(k for k in model.as_exported.layers if k is not None)
    theirs = sorted(k for k in base.as_exported.layers if k is not None)
    if mine == theirs:
        return None
    return (f"the base has {len(theirs)} decoder layer{'s' if len(theirs) != 1 else ''} and the model "
            f"{len(mine)}: not the same model, so its layers are not compared")


def _part(name: str, base: StepEstimate, model: StepEstimate, tb, tm) -> PartDelta:
    return PartDelta(name, base.component_time_s(name) * 1e3, model.component_time_s(name) * 1e3,
                     tb.bytes if tb else 0.0, tm.bytes if tm else 0.0, tb.launches if tb else 0,
                     tm.launches if tm else 0)


def _layer_ms(step: StepEstimate, layer: int) -> float:
    """One decoder layer's expected time on the step: its nodes' roofline time plus its launches and syncs."""
    comps = step.layers.get(layer, {})
    roofline = sum((t.roofline_cache_s if step.in_cache else t.roofline_s) for t in comps.values())
    launches = sum(t.launches for t in comps.values())
    syncs = sum(t.syncs for t in comps.values())
    return (roofline + launches * step.kernel_us * 1e-6 + syncs * step.sync_us * 1e-6) * 1e3


def _span(layers: list[int]) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return "layers " + ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
