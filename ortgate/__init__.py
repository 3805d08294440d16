"""ortgate: a graph diagnostics linter and CI gate for LLMs served with ONNX Runtime."""

__version__ = "0.1.0"
