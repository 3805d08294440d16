"""Sizes the cost model needs: bytes per element of each dtype, and symbolic dims resolved to the step's batch,
new tokens and context length. A dim that cannot be resolved stays unknown: nothing is invented for it."""

from __future__ import annotations

import re
from dataclasses import dataclass

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


# Dim names by role (lowercase), as exporters write them (onnxruntime-genai, torch.onnx, optimum).
_BATCH = {"batch_size", "batch", "batchsize", "bs", "b", "n", "num_seqs", "batch_dim"}
_QUERY = {"sequence_length", "seq_len", "seqlen", "sequence", "seq", "s", "q_len", "query_length", "num_tokens",
          "input_len", "sequence_len"}
_CONTEXT_PATTERNS = (re.compile(r"past"), re.compile(r"total"), re.compile(r"kv_seq"), re.compile(r"all_seq"),
                     re.compile(r"^max"), re.compile(r"cache_len"))


def dim_role(name: str) -> str | None:
    """"batch", "query" (new tokens), "context" (cached or total positions), or None."""
    low = name.strip().lower()
    if low in _BATCH:
        return "batch"
    if low in _QUERY:
        return "query"
    if any(p.search(low) for p in _CONTEXT_PATTERNS):
        return "context"
    if "batch" in low:
        return "batch"
    if "seq" in low:
        return "query"
    return None


@dataclass(frozen=True)
class StepShape:
    """One decode step: `batch` sequences, `new_tokens` each, attending over `context` positions."""

    batch: int = 1
    new_tokens: int = 1
    context: int = 2048

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    def dim(self, dim: int | str | None) -> int | None:
        """A dim's value in this step: an int stays, a symbolic name is resolved by its role, else None."""
        if isinstance(dim, int) and not isinstance(dim, bool):
            return dim if dim >= 0 else None
        if not isinstance(dim, str):
            return None
        role = dim_role(dim)
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
