"""Where an op takes each input, read from the kernel table's formal inputs (kernels.json, generated from
OperatorKernels.md): com.microsoft MoE and QMoE as typed positions, checked at import; any op by input name.

    from ortgate.knowledge.moe import moe_inputs
    moe_inputs("MoE").fc3_experts_weights    # 6
    moe_inputs("QMoE").fc3_experts_weights   # 8
    moe_inputs("QMoE").fc1_scales            # 3  (None for MoE: not quantized)
    input_position("com.microsoft", "GroupQueryAttention", "past_key")   # 3
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ortgate.knowledge.kernels import kernel_table
from ortgate.knowledge.loader import KnowledgeError

MS_DOMAIN = "com.microsoft"
MOE_OPS = ("MoE", "QMoE")


@dataclass(frozen=True)
class MoeInputs:
    """Input positions of one MoE op. Optional inputs may be "" (absent) in a node: read them with Node.input()."""

    op_type: str
    ort_version: str  # of the kernel table the positions come from
    input: int
    router_probs: int
    fc1_experts_weights: int
    fc1_experts_bias: int
    fc2_experts_weights: int
    fc2_experts_bias: int
    fc3_experts_weights: int
    fc3_experts_bias: int
    # QMoE only (block-quantized expert weights)
    fc1_scales: int | None = None
    fc2_scales: int | None = None
    fc3_scales: int | None = None
    fc1_zero_points: int | None = None
    fc2_zero_points: int | None = None
    fc3_zero_points: int | None = None

    @property
    def quantized(self) -> bool:
        return self.fc1_scales is not None

    def position(self, name: str) -> int | None:
        """The position of the formal input `name`, None if this op has no such input."""
        value = getattr(self, name, None) if name in _POSITION_FIELDS else None
        return value if isinstance(value, int) else None


_POSITION_FIELDS = tuple(f.name for f in dataclasses.fields(MoeInputs) if f.name not in ("op_type", "ort_version"))
_REQUIRED = tuple(f.name for f in dataclasses.fields(MoeInputs)
                  if f.name in _POSITION_FIELDS and f.default is dataclasses.MISSING)


def formal_inputs(domain: str, op_type: str) -> tuple[str, ...]:
    """The formal input names of (domain, op_type), the same for every provider that registers it."""
    table = kernel_table()
    seen: dict[tuple[str, ...], list[str]] = {}
    for provider in table.providers():
        entry = table.op(provider, domain, op_type)
        if entry is not None:
            for signature in entry.signatures:
                seen.setdefault(tuple(f.name for f in signature.inputs), []).append(provider)
    if len(seen) != 1:
        found = "; ".join(f"{', '.join(p)}: {list(names)}" for names, p in seen.items()) or "no provider lists it"
        raise KnowledgeError(f"kernels.json: {domain}.{op_type} has no single list of formal inputs ({found})")
    return next(iter(seen))


@functools.cache
def input_position(domain: str, op_type: str, name: str) -> int | None:
    """Where (domain, op_type) takes its formal input `name`, from every signature the kernel table lists for it (an
    op whose opsets append inputs, like ONNX Attention, keeps the position); None if no signature has the input."""
    table = kernel_table()
    positions = set()
    for provider in table.providers():
        entry = table.op(provider, domain, op_type)
        for signature in entry.signatures if entry is not None else ():
            names = [f.name for f in signature.inputs]
            if name in names:
                positions.add(names.index(name))
    if len(positions) > 1:
        raise KnowledgeError(f"kernels.json: {domain}.{op_type} takes {name!r} at positions {sorted(positions)}")
    return positions.pop() if positions else None


def _moe_inputs(op_type: str) -> MoeInputs:
    names = formal_inputs(MS_DOMAIN, op_type)
    positions = {name: i for i, name in enumerate(names) if name in _POSITION_FIELDS}
    missing = [name for name in _REQUIRED if name not in positions]
    if missing:
        raise KnowledgeError(f"kernels.json: {MS_DOMAIN}.{op_type} lacks the inputs {missing} (has {list(names)})")
    return MoeInputs(op_type=op_type, ort_version=kernel_table().ort_version, **positions)


_MOE_INPUTS = {op: _moe_inputs(op) for op in MOE_OPS}


def moe_inputs(op_type: str) -> MoeInputs:
    """The input positions of com.microsoft `op_type` ("MoE" or "QMoE"); KeyError for any other op."""
    return _MOE_INPUTS[op_type]
