"""ortgate: a graph diagnostics linter and CI gate for LLMs served with ONNX Runtime."""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it from here ([tool.setuptools.dynamic]), so a source
# tree, an editable install and a wheel all report the same version.
__version__ = "0.1.0"
