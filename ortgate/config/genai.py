"""onnxruntime-genai's genai_config.json: the session the genai runtime will really create.

Read as onnxruntime-genai 0.18 reads it (src/config.cpp): `model.decoder.session_options` holds a few named
session options, `provider_options: [{"cuda": {...}}]`, and every other scalar key becomes a session config
entry (AddConfigEntry). Provider names are normalised case-insensitively ("cuda", "CUDAExecutionProvider").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortgate.config.source import LocatedDocument, format_key_path, load_json
from ortgate.errors import InputError
from ortgate.knowledge.facts import ORT_FACTS

# session_options keys genai maps to SessionOptions fields (provider_options included); any other scalar is a
# config entry.
GENAI_NAMED_SESSION_OPTIONS = frozenset(ORT_FACTS.genai.session_option_keys)
GENAI_OPTIMIZATION_LEVELS = ORT_FACTS.genai.graph_optimization_levels


@dataclass
class GenaiConfig:
    """A read genai_config.json: its path and its located document."""

    path: Path
    document: LocatedDocument

    @property
    def data(self) -> dict:
        return self.document.data

    @property
    def decoder(self) -> dict:
        return self.data["model"]["decoder"]

    @property
    def model_type(self) -> str | None:
        value = self.data["model"].get("type")
        return value if isinstance(value, str) else None

    def decoder_int(self, key: str) -> int | None:
        value = self.decoder.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def session_options(self) -> dict:
        return self.decoder.get("session_options") or {}

    @property
    def layer_types(self) -> list[str] | None:
        value = self.decoder.get("layer_types")
        return [str(v) for v in value] if isinstance(value, list) else None

    @property
    def sliding_window_layers(self) -> list[int]:
        window = self.decoder.get("sliding_window")
        if isinstance(window, dict) and isinstance(window.get("layers"), list):
            return [int(i) for i in window["layers"] if isinstance(i, int)]
        return []

    @property
    def past_present_share_buffer(self) -> bool | None:
        search = self.data.get("search")
        value = search.get("past_present_share_buffer") if isinstance(search, dict) else None
        return value if isinstance(value, bool) else None

    @property
    def max_length(self) -> int | None:
        """search.max_length: with past_present_share_buffer, the length of the static KV buffer."""
        search = self.data.get("search")
        value = search.get("max_length") if isinstance(search, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def decoder_filename(self) -> str | None:
        value = self.decoder.get("filename")
        return value if isinstance(value, str) and value else None

    def line_of(self, *key_path: str | int) -> int | None:
        return self.document.line_of(tuple(key_path))


def load_genai_config(path: str | Path) -> GenaiConfig:
    path = Path(path)
    doc = load_json(path)
    data = doc.data

    def require(container: Any, key: str, prefix: tuple, kind: type, kind_name: str) -> Any:
        where = format_key_path(prefix + (key,))
        if not isinstance(container, dict) or key not in container:
            raise InputError(f"{where}: missing (not an onnxruntime-genai genai_config.json?)", path,
                             line=doc.line_of(prefix))
        value = container[key]
        if not isinstance(value, kind):
            raise InputError(f"{where}: expected {kind_name}, got {type(value).__name__}", path,
                             line=doc.line_of(prefix + (key,)))
        return value

    if not isinstance(data, dict):
        raise InputError("expected a JSON object (onnxruntime-genai genai_config.json)", path)
    model = require(data, "model", (), dict, "an object")
    decoder = require(model, "decoder", ("model",), dict, "an object")
    session = decoder.get("session_options", {})
    prefix = ("model", "decoder", "session_options")
    if not isinstance(session, dict):
        raise InputError(f"{format_key_path(prefix)}: expected an object", path, line=doc.line_of(prefix))
    providers = session.get("provider_options", [])
    if not isinstance(providers, list):
        raise InputError(f"{format_key_path(prefix + ('provider_options',))}: expected a list of objects", path,
                         line=doc.line_of(prefix + ("provider_options",)))
    for i, entry in enumerate(providers):
        entry_path = prefix + ("provider_options", i)
        if not isinstance(entry, dict) or len(entry) != 1 or not isinstance(next(iter(entry.values())), dict):
            raise InputError(f"{format_key_path(entry_path)}: expected {{\"<provider>\": {{options}}}}", path,
                             line=doc.line_of(entry_path))
        (name, options), = entry.items()
        for key, value in options.items():
            if key == "device_filtering_options":
                continue
            if not isinstance(value, str):
                raise InputError(
                    f"{format_key_path(entry_path + (name, key))}: provider option values must be strings, "
                    f"got {type(value).__name__} {value!r}", path, line=doc.line_of(entry_path + (name, key)))
    level = session.get("graph_optimization_level")
    if level is not None and level not in GENAI_OPTIMIZATION_LEVELS:
        raise InputError(
            f"{format_key_path(prefix + ('graph_optimization_level',))}: {level!r} is not one of "
            f"{', '.join(GENAI_OPTIMIZATION_LEVELS)}", path, line=doc.line_of(prefix + ("graph_optimization_level",)))
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_size", "hidden_size"):
        if key in decoder and (not isinstance(decoder[key], int) or isinstance(decoder[key], bool)):
            raise InputError(f"model.decoder.{key}: expected an integer, got {decoder[key]!r}", path,
                             line=doc.line_of(("model", "decoder", key)))
    return GenaiConfig(path, doc)
