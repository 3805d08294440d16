"""The one spelling of an op as a key: a leaf module that imports nothing of ortgate, so every knowledge module
(and the graph index) can use it without importing another's tables."""

from __future__ import annotations

ONNX_DOMAIN = "ai.onnx"


def normalize_domain(domain: str | None) -> str:
    """'' and 'ai.onnx' are the same (default ONNX) domain; the table spells it 'ai.onnx'."""
    return ONNX_DOMAIN if domain in (None, "", ONNX_DOMAIN) else domain


# The one spelling of an op as a key, as knowledge files, findings and reports write it: "[domain.]op_type", the
# ONNX domain left out.
def op_key(domain: str | None, op_type: str) -> str:
    """("com.microsoft", "MoE") -> "com.microsoft.MoE"; ("", "MatMul") and ("ai.onnx", "MatMul") -> "MatMul"."""
    domain = normalize_domain(domain)
    return op_type if domain == ONNX_DOMAIN else f"{domain}.{op_type}"


def parse_op_key(key: str) -> tuple[str, str]:
    """"com.microsoft.MoE" -> ("com.microsoft", "MoE"); "MatMul" and "ai.onnx.MatMul" -> ("ai.onnx", "MatMul")."""
    domain, _, op_type = key.rpartition(".")
    return normalize_domain(domain), op_type
