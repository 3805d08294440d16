"""The quick schema check (ortgate.config.schema_check) agrees with jsonschema on every document it decides: the
committed policies, every key of the schema set to hostile values, and fuzzed policies. A lint of a valid policy
never imports jsonschema; an invalid one still gets jsonschema's messages."""

from __future__ import annotations

import copy
import datetime as _dt
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ortgate.config.policy import _without_nulls, policy_schema
from ortgate.config.schema_check import verdict
from tests.conftest import EXAMPLES, POLICIES
from tests.test_fuzz import SEED_POLICIES, apply_data_edits, apply_text_edits, data_edit, fuzz_settings, text_edit

REPO = Path(__file__).resolve().parents[1]
SCHEMA = policy_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


def agrees(document) -> bool | None:
    """Assert the quick check's answer (when it gives one) is jsonschema's; return it."""
    found = verdict(SCHEMA, document)
    errors = list(VALIDATOR.iter_errors(document))
    if found is not None:
        assert found is (not errors), (found, [e.message for e in errors], document)
    return found


def _committed_policies():
    paths = sorted({*REPO.glob("policies/*.yaml"), *REPO.glob("ortgate/config/builtin/*.yaml"),
                    *REPO.glob("examples/**/*.yaml"), *REPO.glob("docs/**/*.yaml")})
    return [p for p in paths if isinstance(yaml.safe_load(p.read_text()), dict)]


@pytest.mark.parametrize("path", _committed_policies(), ids=lambda p: str(p.relative_to(REPO)))
def test_committed_policies_are_decided_valid_without_jsonschema(path):
    document = _without_nulls(yaml.safe_load(path.read_text()))
    assert agrees(document) is True


def _leaf_paths(schema, path=()):
    """Every key path the schema names, with the schema there."""
    yield path, schema
    if not isinstance(schema, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        yield from _leaf_paths(sub, (*path, name))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _leaf_paths(schema["additionalProperties"], (*path, "some_key"))
    if isinstance(schema.get("items"), dict):
        yield from _leaf_paths(schema["items"], (*path, 0))
    for option in schema.get("oneOf", []):
        yield from _leaf_paths(option, path)


HOSTILE = [0, -1, 1, 2, 1.5, 3.0, -0.5, 1e308, float("inf"), float("nan"), 10**30, True, False, None, "", "x", " ",
           "1", [], [1], ["a"], [None], {}, {"a": 1}, {1: "a"}, "2025-01-01", "2025-02-30", "2025-1-1",
           "20250101", _dt.date(2025, 1, 1), b"bytes", {"a"}, "ORT_ENABLE_ALL", "CUDAExecutionProvider",
           "error", "warning", "ERROR", "OGF001", "moe-not-fused", "é", "\x00"]


def _set(document, path, value):
    """A copy of `document` with the value at `path` set (containers made on the way)."""
    out = copy.deepcopy(document)
    node = out
    for key, nxt in zip(path, path[1:]):
        if isinstance(node, list):
            node = node[0] if node and isinstance(node[0], (dict, list)) else None
            if node is None:
                return None
            continue
        if not isinstance(node.get(key), (dict, list)):
            node[key] = [] if isinstance(nxt, int) else {}
            if isinstance(nxt, int):
                node[key].append({})
        node = node[key]
    if isinstance(node, list):
        node[:] = [value]
    else:
        node[path[-1]] = value
    return out


def _schema_values(schema):
    """Values at and around each limit and enum the schema at one key names."""
    if not isinstance(schema, dict):
        return []
    values = list(schema.get("enum", []))
    values += [f"{v}x" for v in schema.get("enum", [])]
    for key in ("minimum", "maximum", "exclusiveMinimum", "minLength", "minItems"):
        if key in schema:
            n = schema[key]
            values += [n, n - 1, n + 1, n - 0.5, n + 0.5, float(n)]
    return values


def test_every_schema_key_with_hostile_values():
    seeds = [_without_nulls(yaml.safe_load(text)) for _, text in sorted(SEED_POLICIES.items())]
    decided = {True: 0, False: 0, None: 0}
    for seed in seeds:
        for path, schema in _leaf_paths(SCHEMA):
            if not path:
                continue
            for value in HOSTILE + _schema_values(schema):
                document = _set(seed, path, value)
                if document is not None:
                    decided[agrees(document)] += 1
    # The check decides most documents both ways (it is not a check that always says "ask jsonschema").
    assert decided[True] > 200 and decided[False] > 1000, decided


# Schemas beyond the policy's own: keywords the quick check decides, in combinations the policy schema lacks.
SYNTHETIC = [
    {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
    {"oneOf": [{"type": "string"}, {"minLength": 2}]},
    {"type": ["integer", "array"], "minItems": 2, "items": {"type": "string", "pattern": "^a"}},
    {"type": "object", "required": ["a"], "properties": {"a": {"enum": ["x", "y"]}}, "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 2},
    {"properties": {"a": True, "b": False}},
    {"type": "string", "format": "date"},
    {"format": "date"},
    {"exclusiveMinimum": 0, "maximum": 1},
    {"enum": [1, "1"]},
    {"type": "nothing"},
    {"patternProperties": {"^a": {"type": "string"}}, "additionalProperties": False},
    {"items": False},
    False,
    True,
]


@pytest.mark.parametrize("schema", SYNTHETIC, ids=lambda s: json.dumps(s)[:40])
def test_synthetic_schemas_agree_with_jsonschema(schema):
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for value in [*HOSTILE, {"a": "x"}, {"a": "z"}, {"a": "x", "b": 1}, {"a": True, "b": False}, ["ab", "ac"],
                  ["ab", "b"], "2025-12-31", "2025-13-01", 0.5, 2.0]:
        found = verdict(schema, value)
        try:
            valid = not list(validator.iter_errors(value))
        except (jsonschema.exceptions.UnknownType, TypeError):  # an unknown type name; a key that is not a string
            assert found is None
            continue
        assert found is None or found is valid, (schema, value, found)


@fuzz_settings(300)
@given(seed=st.sampled_from(sorted(SEED_POLICIES)), structural=st.booleans(),
       data_edits=st.lists(data_edit, min_size=1, max_size=4), text_edits=st.lists(text_edit, min_size=1, max_size=4))
def test_fuzzed_policies_agree_with_jsonschema(seed, structural, data_edits, text_edits):
    text = SEED_POLICIES[seed]
    try:
        data = yaml.safe_load(text if structural else apply_text_edits(text, text_edits))
    except yaml.YAMLError:
        return
    if structural:
        data = apply_data_edits(data, data_edits)
    agrees(_without_nulls(data) if isinstance(data, dict) else data)


def _imported_by_lint(*args: str) -> set[str]:
    probe = ("import sys, io\nfrom ortgate.cli import main\nsys.stdout = io.StringIO()\n"
             f"code = main({list(args)!r})\nsys.stdout = sys.__stdout__\n"
             "print(code, ' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    code, modules = done.stdout.split(" ", 1)
    return set(modules.split())


def test_a_lint_with_a_valid_policy_does_not_import_jsonschema(tmp_path):
    model = str(EXAMPLES / "qwen3-moe-tiny-unfused")
    assert "jsonschema" not in _imported_by_lint("lint", model, "--policy", str(POLICIES / "tiny-moe-cpu.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text((POLICIES / "tiny-moe-cpu.yaml").read_text() + "\nunknown_key: 1\n")
    assert "jsonschema" in _imported_by_lint("lint", model, "--policy", str(broken))
