"""A rule's documentation names what it rests on in a References section (ORT and onnxruntime-genai issues, the
operator documentation), each entry a link and what it shows: every issue its prose cites is listed there."""

from __future__ import annotations

import re

import pytest

from ortgate.rules import all_rules

RULES = all_rules()
# microsoft/onnxruntime#123, onnxruntime-genai#45, or a bare #678 after one of those in the same parentheses
CITED = re.compile(r"(?:microsoft/)?(onnxruntime(?:-genai)?)#(\d+)")
ENTRY = re.compile(r"^- \[[^\]]+\]\(https://[^)\s]+\)(?:, \[[^\]]+\]\(https://[^)\s]+\))*: \S")


def _entries(section: str) -> list[str]:
    """The section's bullet entries, each joined with its continuation lines."""
    entries: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            entries.append(line)
        elif line.startswith("  ") and entries:
            entries[-1] += " " + line.strip()
        elif line.strip():
            entries.append(line)
    return entries


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_every_cited_issue_is_in_the_references(rule):
    references = rule.section("References")
    prose = rule.doc.split("## References")[0]
    for repo, number in CITED.findall(prose):
        url = f"https://github.com/microsoft/{repo}/issues/{number}"
        assert url in references, f"{rule.code} cites {repo}#{number}: list it under ## References ({url})"
    if "ContribOperators.md" in prose:
        assert "ContribOperators.md" in references, f"{rule.code} cites ContribOperators.md: list it"


@pytest.mark.parametrize("rule", [r for r in RULES if r.section("References")], ids=lambda r: r.code)
def test_each_reference_is_a_link_and_what_it_shows(rule):
    for entry in _entries(rule.section("References")):
        assert ENTRY.match(entry), f"{rule.code}: a reference is '- [name](https://...): what it shows': {entry!r}"


def test_references_are_found():
    assert len([r for r in RULES if r.section("References")]) >= 11
