"""Shared test setup: rules run strict (a rule's exception fails the test), models are built per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ["ORTGATE_STRICT"] = "1"

POLICIES = REPO / "policies"
EXAMPLES = REPO / "examples"
EXPORTED = REPO / "tests" / "fixtures" / "exported"


@pytest.fixture
def make_model(tmp_path):
    """Build a generator model from ModelSpec keyword arguments and save it; returns its path."""
    from tests.models.qwen_moe import ModelSpec, build_model, save_model

    counter = iter(range(10_000))

    def make(name: str | None = None, *, external_data: bool = False, drop_data: bool = False, **spec) -> Path:
        path = tmp_path / f"{name or 'model'}-{next(counter)}.onnx"
        return Path(save_model(build_model(ModelSpec(**spec)), path, external_data=external_data, drop_data=drop_data))

    return make


@pytest.fixture
def write_policy(tmp_path):
    """Write a policy YAML text to a file in the test's folder; returns its path."""

    def write(text: str, name: str = "policy.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
