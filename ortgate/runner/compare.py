"""Do the policy session's outputs match ORT_DISABLE_ALL's? A fusion that changes results is a bug, not a speedup.

Tolerances depend on the output dtype: fused kernels reorder float additions (and fp16/bf16 kernels accumulate
differently), so bit-exact equality is not expected; a difference beyond these bounds is. Integer and bool
outputs must match exactly.
"""

from __future__ import annotations

import numpy as np

from ortgate.evidence import OutputComparison

# dtype -> (rtol, atol): |actual - reference| <= atol + rtol * |reference|, element-wise.
TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}
EXACT = (0.0, 0.0)


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, EXACT)


def compare_outputs(actual: dict[str, np.ndarray], reference: dict[str, np.ndarray],
                    types: dict[str, str] | None = None,
                    written: dict[str, tuple[int, int]] | None = None) -> list[OutputComparison]:
    """One comparison per reference output. `types` names ORT's element type ("tensor(bfloat16)") where numpy
    cannot (bfloat16 arrives as raw 16-bit patterns). `written` limits a KV-cache output to the positions the
    step wrote: output -> (sequence axis, past + new tokens); a cache buffer larger than that (GQA's sliding-window
    cache holds the whole window) has uninitialised memory beyond it, which differs from run to run."""
    out = []
    for name, ref in reference.items():
        dtype = _dtype(ref, (types or {}).get(name))
        if name not in actual:
            out.append(OutputComparison(name, dtype, tuple(ref.shape), 0.0, 0.0, None, int(ref.size), int(ref.size),
                                        note="the policy session produced no such output"))
            continue
        got = actual[name]
        if written and name in written and got.shape == ref.shape:
            axis, length = written[name]
            if 0 <= axis < ref.ndim and length < ref.shape[axis]:
                got, ref = np.take(got, range(length), axis=axis), np.take(ref, range(length), axis=axis)
        out.append(compare_one(name, got, ref, dtype))
    return out


def compare_one(name: str, actual: np.ndarray, reference: np.ndarray, dtype: str | None = None) -> OutputComparison:
    dtype = dtype or _dtype(reference, None)
    rtol, atol = tolerance(dtype)
    shape = tuple(int(d) for d in reference.shape)
    if tuple(actual.shape) != shape:
        return OutputComparison(name, dtype, shape, rtol, atol, None, int(reference.size), int(reference.size),
                                note=f"shape {tuple(actual.shape)} differs from the reference's {shape}")
    if dtype == "bfloat16":
        actual, reference = _bfloat16_to_float32(actual), _bfloat16_to_float32(reference)
    if reference.dtype.kind in "fc":
        with np.errstate(invalid="ignore", over="ignore"):
            return _compare_float(name, actual, reference, dtype, shape, rtol, atol)
    if reference.dtype.kind in "biu":
        mismatched = int(np.count_nonzero(actual != reference))
        max_abs = float(np.abs(actual.astype(np.float64) - reference.astype(np.float64)).max()) if reference.size else 0.0
        return OutputComparison(name, dtype, shape, 0.0, 0.0, max_abs, mismatched, int(reference.size))
    return OutputComparison(name, dtype, shape, 0.0, 0.0, None, 0, int(reference.size), compared=False,
                            note=f"{dtype} outputs are not compared")


def _compare_float(name: str, actual: np.ndarray, reference: np.ndarray, dtype: str, shape: tuple[int, ...],
                   rtol: float, atol: float) -> OutputComparison:
    a = actual.astype(np.float64)
    r = reference.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(r)
    # Non-finite values must sit at the same places with the same value (NaN == NaN here).
    special = ~finite & ~((np.isnan(a) & np.isnan(r)) | (a == r))
    diff = np.abs(a - r)
    bad = finite & (diff > atol + rtol * np.abs(r))
    mismatched = int(np.count_nonzero(bad) + np.count_nonzero(special))
    max_abs = float(diff[finite].max()) if np.any(finite) else 0.0
    return OutputComparison(name, dtype, shape, rtol, atol, max_abs, mismatched, int(reference.size))


def _dtype(array: np.ndarray, ort_type: str | None) -> str:
    if ort_type and "bfloat16" in ort_type:
        return "bfloat16"
    return str(array.dtype)


def _bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32) if bits.dtype == np.uint16 else bits.astype(np.float32)
