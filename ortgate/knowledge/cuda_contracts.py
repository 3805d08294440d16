"""What the CUDA provider of the onnxruntime-gpu 1.31.1 wheel accepts and which kernel a node gets
(ort_cuda_contracts.json, from the strings of its provider library), with the reported speed of each path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from ortgate.knowledge.loader import build, read_json

ORT_CUDA_CONTRACTS_JSON = Path(__file__).with_name("ort_cuda_contracts.json")


@dataclass(frozen=True)
class NBitsForm:
    bits: int
    block_size: int


@dataclass(frozen=True)
class FpaIntB:
    activation_dtypes: tuple[str, ...]
    forms: tuple[NBitsForm, ...]
    message: str


@dataclass(frozen=True)
class Refusal:
    key: str
    message: str


@dataclass(frozen=True)
class QmoeGemv:
    since: str  # the first release with the fast path
    bits: tuple[int, ...]
    block_sizes: tuple[int, ...]
    activation_dtypes: tuple[str, ...]
    speedup: float
    source: str


@dataclass(frozen=True)
class GqaHeadSize:
    max: int
    slowdown: float
    source: str


@dataclass(frozen=True)
class Mxfp4Shape:
    k_multiple: int
    n_multiple: int
    message: str


@dataclass(frozen=True)
class Fp4Qmoe:
    quant_types: tuple[str, ...]  # QMoE quant_type values with FP4 expert weights
    min_compute_capability: float
    message: str


@dataclass(frozen=True)
class FpaIntBOptIn:
    key: str  # the session config entry that turns fpA_intB on for raw-layout weights
    source: str


@dataclass(frozen=True)
class Fp4DequantGemv:
    message: str
    opt_in_env: str


@dataclass(frozen=True)
class CudaContracts:
    schema: Literal[1]
    reflects: str
    about: str
    since: str
    source: str
    matmulnbits_fpa_intb: FpaIntB
    fpa_intb_compute_capability: Mapping[str, float]  # activation dtype -> the lowest compute capability
    fp4_qmoe: Fp4Qmoe
    fpa_intb_opt_in: FpaIntBOptIn
    fp4_dequant_gemv: Fp4DequantGemv
    qmoe_refusals: tuple[Refusal, ...]
    qmoe_gemv: QmoeGemv
    gqa_fused_head_size: GqaHeadSize
    mxfp4_shape: Mxfp4Shape

    def refusal(self, key: str) -> Refusal:
        return next(r for r in self.qmoe_refusals if r.key == key)


@cache
def cuda_contracts() -> CudaContracts:
    return build(CudaContracts, read_json(ORT_CUDA_CONTRACTS_JSON), ORT_CUDA_CONTRACTS_JSON.name)
