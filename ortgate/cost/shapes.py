"""Sizes the cost model needs: bytes per element of each dtype, and symbolic dims resolved to the step's batch,
new tokens and context length. A dim that cannot be resolved stays unknown: nothing is invented for it."""

from __future__ import annotations

from dataclasses import dataclass

from ortgate.knowledge.dims import dim_role, dim_value

# Bytes per element, by dtype as the graph index spells it (onnx TensorProto names, lowercase).
DTYPE_BYTES: dict[str, float] = {
    "float": 4, "float32": 4, "double": 8, "float16": 2, "bfloat16": 2,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1,
    "int4": 0.5, "uint4": 0.5, "float4e2m1": 0.5,
    "float8e4m3fn": 1, "float8e4m3fnuz": 1, "float8e5m2": 1, "float8e5m2fnuz": 1, "float8e8m0": 1,
}


def dtype_bytes(dtype: str | None) -> float | None:
    """Bytes per element, or None for an unknown dtype (never guessed)."""
    return DTYPE_BYTES.get(dtype or "")


# The roles that mean "positions the step attends over": the cost model prices them all at the step's context.
_CONTEXT_ROLES = frozenset({"past", "total", "sliding_past", "max"})


def step_role(name: str) -> str | None:
    """"batch", "query" (new tokens), "context" (cached or total positions), "head" (a head size), or None:
    the one classifier of dim names (ortgate.knowledge.dims.dim_role), with its cache roles read as the step's
    context."""
    role = dim_role(name)
    return "context" if role in _CONTEXT_ROLES else role


@dataclass(frozen=True)
class StepShape:
    """One decode step: `batch` sequences, `new_tokens` each, attending over `context` positions (the cached past
    and the new tokens). The runner's synthesized inputs and the cost model read the same shape."""

    batch: int = 1
    new_tokens: int = 1
    context: int = 2048

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def past(self) -> int:
        """Cached positions before this step's new tokens."""
        return self.context - self.new_tokens

    def dim(self, dim: int | str | None) -> int | None:
        """A dim's value in this step: an int stays, a symbolic name is resolved by its role, else None."""
        if isinstance(dim, int) and not isinstance(dim, bool):
            return dim if dim >= 0 else None
        if not isinstance(dim, str):
            return None
        return dim_value(dim, self._named)  # an expression (`batch_size * sequence_length`) from its terms

    def _named(self, name: str) -> int | None:
        role = step_role(name)
        if role == "batch":
            return self.batch
        if role == "query":
            return self.new_tokens
        if role == "context":
            return self.context
        return None

    def numel(self, shape: tuple[int | str | None, ...] | None) -> tuple[int | None, list[str]]:
        """(elements, the dims that could not be resolved). Elements is None when any dim is unresolved."""
        if shape is None:
            return None, ["rank unknown"]
        n = 1
        unresolved: list[str] = []
        for d in shape:
            value = self.dim(d)
            if value is None:
                unresolved.append(str(d) if d is not None else "?")
            else:
                n *= value
        return (None if unresolved else n), unresolved
