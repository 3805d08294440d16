"""ortgate: a graph diagnostics linter and CI gate for LLMs served with ONNX Runtime."""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it from here ([tool.setuptools.dynamic]), so a source
# tree, an editable install and a wheel all report the same version.
__version__ = "0.1.0"

# Importing onnxruntime (1.31 and 1.32 alike) writes a telemetry device-ID database under ~/.cache/Microsoft/ and
# reads /etc/os-release and /proc/1/cgroup unless ORT_DISABLE_TELEMETRY is set before the import
# (disable_telemetry_events() afterwards does not stop it). Every import of onnxruntime in ortgate comes after this
# package's own: set here, once, unless the user set it.
import os as _os

_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
del _os
