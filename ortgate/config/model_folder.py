"""MODEL as the user names it: an .onnx file, or a folder holding the model and onnxruntime-genai's
genai_config.json (which may name the decoder file)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortgate.config.genai import load_genai_config
from ortgate.errors import InputError
from ortgate.graph.load import escapes_folder

GENAI_CONFIG_NAME = "genai_config.json"


@dataclass(frozen=True)
class ModelFiles:
    """The files a model argument names: the .onnx file and the genai_config.json beside it, if any."""

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
            _inside(config, p)  # checked before it is read
            genai = load_genai_config(config)
            filename = genai.decoder_filename
            if filename:
                if escapes_folder(filename):
                    raise InputError(f"model.decoder.filename: {filename!r} is not a file name inside the model "
                                     "folder; ortgate does not follow it", config,
                                     line=genai.line_of("model", "decoder", "filename"))
                candidates.insert(0, p / filename)
        for candidate in candidates:
            if candidate.is_file():
                return ModelFiles(_inside(candidate, p), config if config.is_file() else None)
        onnx_files = sorted(p.glob("*.onnx"))
        if len(onnx_files) == 1:
            return ModelFiles(_inside(onnx_files[0], p), config if config.is_file() else None)
        found = f"{len(onnx_files)} .onnx files" if onnx_files else "no .onnx file"
        raise InputError(f"folder holds no model.onnx ({found}); name the model file instead", p)
    config = p.parent / GENAI_CONFIG_NAME
    return ModelFiles(p, _inside(config, p.parent) if config.is_file() else None)


def _inside(file: Path, folder: Path) -> Path:
    """A file the model folder names must be in it once symlinks are followed: a decoder or a genai_config.json
    symlinked out of the folder is refused, not read."""
    try:
        inside = file.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        raise InputError(f"leads outside the model folder {folder} (a symbolic link); ortgate reads only files "
                         "inside it", file)
    return file
