"""ortgate: a graph diagnostics linter and CI gate for LLMs served with ONNX Runtime."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # The version lives in pyproject.toml only; reading the installed metadata costs milliseconds, so it is read on
    # first use (reports, --version), never when the package is imported.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("ortgate")
        except PackageNotFoundError:  # run from a source tree that was never installed
            value = "0+unknown"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'ortgate' has no attribute {name!r}")
