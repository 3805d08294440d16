"""The one spelling of each ONNX Runtime execution provider name that the code names: a leaf module that imports
nothing of ortgate, so every layer can use it without an import circle. The full list of providers a release
knows is data (knowledge/ort_facts.json, `known_providers`); these are the ones rules and the runner name."""

from __future__ import annotations

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
TRT_RTX = "NvTensorRTRTXExecutionProvider"
CANN = "CANNExecutionProvider"
ROCM = "ROCMExecutionProvider"
DML = "DmlExecutionProvider"
ACL = "ACLExecutionProvider"
