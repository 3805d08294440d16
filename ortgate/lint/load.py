"""Finding and parsing model files. Only the protobuf is read: external weight files are never opened."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ortgate.errors import InputError

GENAI_CONFIG_NAME = "genai_config.json"
PROTOBUF_LIMIT = 2**31 - 1  # protobuf refuses messages of 2 GiB and more

_NOT_ONNX_SIGNATURES = (
    (b"PK\x03\x04", "a zip archive (a PyTorch checkpoint?)"),
    (b"\x80\x02", "a Python pickle"),
    (b"\x80\x03", "a Python pickle"),
    (b"\x80\x04", "a Python pickle"),
    (b"\x80\x05", "a Python pickle"),
    (b"\x89HDF", "an HDF5 file"),
    (b"GGUF", "a GGUF file"),
    (b"\x7fELF", "an executable"),
)


@dataclass(frozen=True)
class ModelFiles:
    model: Path
    genai_config: Path | None


def resolve_model_path(path: str | Path) -> ModelFiles:
    """MODEL is an .onnx file, or a folder holding model.onnx (or the file genai_config.json names)."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file or directory", p)
    if p.is_dir():
        config = p / GENAI_CONFIG_NAME
        candidates = [p / "model.onnx"]
        if config.is_file():
            from ortgate.lint.genai import load_genai_config

            filename = load_genai_config(config).decoder_filename
            if filename:
                candidates.insert(0, p / filename)
        for candidate in candidates:
            if candidate.is_file():
                return ModelFiles(candidate, config if config.is_file() else None)
        onnx_files = sorted(p.glob("*.onnx"))
        if len(onnx_files) == 1:
            return ModelFiles(onnx_files[0], config if config.is_file() else None)
        found = f"{len(onnx_files)} .onnx files" if onnx_files else "no .onnx file"
        raise InputError(f"folder holds no model.onnx ({found}); name the model file instead", p)
    config = p.parent / GENAI_CONFIG_NAME
    return ModelFiles(p, config if config.is_file() else None)


def load_model(path: str | Path) -> onnx.ModelProto:
    """Parse an ONNX file without its external data. Every failure is an InputError naming the file."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", p)
    if not p.is_file():
        raise InputError("not a regular file", p)
    try:
        size = p.stat().st_size
        if size == 0:
            raise InputError("empty file, not an ONNX model", p)
        if size > PROTOBUF_LIMIT:
            raise InputError(
                f"file is {size / 2**30:.1f} GiB; an ONNX protobuf cannot exceed 2 GiB, so its weights must be "
                "saved as external data (onnx.save(..., save_as_external_data=True))", p)
        with open(p, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", p) from None
    for signature, what in _NOT_ONNX_SIGNATURES:
        if data.startswith(signature):
            raise InputError(f"not an ONNX model: this is {what}", p)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        reason = "truncated or corrupt protobuf" if isinstance(exc, DecodeError) else str(exc)
        raise InputError(f"not an ONNX model ({reason})", p) from None
    del data
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InputError("not an ONNX model (no IR version or graph in the protobuf)", p)
    if not model.graph.node:
        raise InputError("the ONNX graph has no nodes", p)
    return model


def check_external_data_locations(model: onnx.ModelProto, model_path: Path) -> list[str]:
    """External data locations that would escape the model's folder (absolute or '..'). Never opened."""
    bad = []
    base = os.path.realpath(model_path.parent)
    for tensor in _all_initializers(model):
        for entry in tensor.external_data:
            if entry.key != "location":
                continue
            location = entry.value
            target = os.path.realpath(os.path.join(base, location))
            if os.path.isabs(location) or os.path.commonpath([base, target]) != base:
                bad.append(location)
    return sorted(set(bad))


def _all_initializers(model: onnx.ModelProto):
    stack = [model.graph]
    while stack:
        g = stack.pop()
        yield from g.initializer
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)
