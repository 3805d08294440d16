"""The ONNX Runtime releases ortgate's knowledge covers (ort_releases.json), and which one it assumes.

A deployment's release is the policy's `execution_provider.onnxruntime_version` (or `--ort-version`); without one,
ortgate assumes `assumed_release()` in every install, so the same inputs give the same report whether onnxruntime
is installed, and which, or not. No rule, price or rewrite reads the installed package's version to judge a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ortgate.knowledge.deployment_facts import at_least, release
from ortgate.knowledge.loader import build, read_json

ORT_RELEASES_JSON = Path(__file__).with_name("ort_releases.json")


@dataclass(frozen=True)
class _ReleasesFile:
    """ort_releases.json."""

    schema: Literal[1]
    reflects: str
    about: str
    oldest: str
    oldest_source: str
    newest: str
    newest_source: str
    assumed: str
    assumed_why: str
    pin_hint: str


_RELEASES = build(_ReleasesFile, read_json(ORT_RELEASES_JSON), ORT_RELEASES_JSON.name)


def covered_range() -> tuple[str, str]:
    """The oldest and newest ONNX Runtime release ortgate judges a deployment on."""
    return _RELEASES.oldest, _RELEASES.newest


def assumed_release() -> str:
    return _RELEASES.assumed


def assumed_why() -> str:
    return _RELEASES.assumed_why


def pin_hint() -> str:
    return _RELEASES.pin_hint


def release_problem(text: str) -> str | None:
    """Why `text` cannot name a release ortgate judges (None: it can): not a version, or older than the knowledge
    covers. A release newer than the knowledge is judged by the newest known (`judged_as`), not refused."""
    oldest, newest = covered_range()
    if release(text) is None:
        return f"{text!r} is not an ONNX Runtime release (e.g. 1.31.1); ortgate covers {oldest} to {newest}"
    if not at_least(text, oldest):
        return f"onnxruntime {text} is older than ortgate's knowledge covers ({oldest} to {newest})"
    return None


def judged_as(text: str) -> str:
    """The release whose knowledge judges `text`: itself, or the newest known for a newer one."""
    newest = covered_range()[1]
    return text if at_least(newest, text) else newest
