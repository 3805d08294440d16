"""genai_config.json for the delivered folder, as onnxruntime-genai's builder writes it, from what the graph tells:
the decoder's input and output names (`past_key_values.%d.key` ...), the layer count (the cache inputs), the head
size and KV head count (the cache's dims), the query head count (GroupQueryAttention's num_heads), the hidden size
(the token embedding's width) and the vocabulary (the logits' width or the embedding's rows).

What the graph cannot tell (the eos and bos token ids, the context length) comes from `ortgate fix`'s flags
(--eos-token-id, --bos-token-id, --context-length) or the policy's throughput.context_length; without them no file
is written and the report names the flags. A genai_config.json beside the input is never replaced: it is copied
as it is, and read to say whether its decoder names are the delivered model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from ortgate.fix.generate import decoder_interface

FILE = "genai_config.json"


@dataclass
class GenaiSettings:
    context_length: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    model_type: str = "decoder"  # onnxruntime-genai's generic decoder-only LLM


@dataclass
class GenaiOutcome:
    written: bool
    note: str  # what was written, kept or refused, and why
    config: dict | None = None


def build_config(model: onnx.ModelProto, filename: str, settings: GenaiSettings) -> tuple[dict | None, str]:
    """The genai_config of `model`, or None and why not."""
    decoder = decoder_interface(model)
    if decoder is None or not decoder.past:
        return None, "the model is not a decoder with a KV cache (input_ids, logits, past_key_values.N.key/value)"
    layers = len({name.split(".")[1] for name in decoder.past})
    names = set(decoder.past)
    if names != {f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")}:
        return None, "the cache inputs are not numbered 0 .. layers-1"
    kv_heads, head_size, _ = decoder.past["past_key_values.0.key"]
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    heads = None
    if gqa:
        attrs = {a.name: helper.get_attribute_value(a) for a in gqa[0].attribute}
        heads = int(attrs["num_heads"])
    inits = {t.name: t for t in model.graph.initializer}
    hidden = None
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == "input_ids":
            table = inits.get(node.input[0])
            if table is not None and len(table.dims) == 2:
                hidden = int(table.dims[1])
    missing = [flag for flag, value in (("--context-length", settings.context_length),
                                         ("--eos-token-id", settings.eos_token_id),
                                         ("--bos-token-id", settings.bos_token_id)) if value in (None, [])]
    if missing:
        return None, (f"the graph cannot tell {', '.join(m.removeprefix('--').replace('-', ' ') for m in missing)}: "
                      f"pass {' '.join(f'{m} N' for m in missing)}"
                      + (" (or the policy's throughput.context_length)" if "--context-length" in missing else ""))
    if not isinstance(kv_heads, int) or not isinstance(head_size, int) or heads is None or decoder.vocab is None:
        return None, "the head counts, head size or vocabulary could not be read from the graph"
    inputs = {"input_ids": "input_ids"}
    for name in ("attention_mask", "position_ids"):
        if name in decoder.inputs:
            inputs[name] = name
    inputs |= {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    # every layer's cache read by GroupQueryAttention: genai may bind past and present to one buffer
    shared = len(gqa) == layers and all(n.input[3] in names for n in gqa)
    eos = settings.eos_token_id
    config = {
        "model": {
            "bos_token_id": settings.bos_token_id,
            "context_length": settings.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": head_size,
                "hidden_size": hidden if hidden is not None else heads * head_size,
                "inputs": inputs,
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": heads,
                "num_hidden_layers": layers,
                "num_key_value_heads": kv_heads,
            },
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": settings.pad_token_id if settings.pad_token_id is not None else eos[0],
            "type": settings.model_type,
            "vocab_size": decoder.vocab,
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": settings.context_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": shared, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 1, "top_p": 1.0,
        },
    }
    return config, (f"written: {layers} layers, {heads} query heads, {kv_heads} KV heads, head size {head_size}, "
                    f"context {settings.context_length}, past/present buffer shared: {str(shared).lower()}")


def write_or_keep(model: onnx.ModelProto, folder: Path, filename: str, settings: GenaiSettings,
                  existing: Path | None) -> GenaiOutcome:
    """Write genai_config.json into `folder`, unless the input had one (already copied there by the caller: read
    here, never replaced)."""
    if existing is not None:
        return GenaiOutcome(False, _read_existing(existing, model))
    config, note = build_config(model, filename, settings)
    if config is None:
        return GenaiOutcome(False, f"not written: {note}")
    (folder / FILE).write_text(json.dumps(config, indent=4, allow_nan=False) + "\n")
    return GenaiOutcome(True, note, config)


def _read_existing(path: Path, model: onnx.ModelProto) -> str:
    try:
        config = json.loads(path.read_text())
        decoder = config["model"]["decoder"]
        wanted = [v for v in decoder.get("inputs", {}).values() if "%d" not in v]
        wanted += [v for v in decoder.get("outputs", {}).values() if "%d" not in v]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"kept from the input as it is ({path}); it could not be read: {exc}"
    names = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    absent = [n for n in wanted if n not in names]
    if absent:
        return f"kept from the input as it is ({path}); it names {', '.join(absent)}, which the model does not have"
    return f"kept from the input as it is ({path}); its decoder names are the delivered model's"
