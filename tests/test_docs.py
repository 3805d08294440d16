"""docs/: every rule has its generated page (what `ortgate explain` prints), and every local link of README.md and
docs/ names a file that exists."""

from __future__ import annotations

import re

import pytest

from ortgate.rules import all_rules
from tests.conftest import REPO
from tests.helpers import run_cli

PAGES = REPO / "docs" / "rules"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_each_rules_page_is_what_explain_prints(rule):
    page = (PAGES / f"{rule.code}.md").read_text(encoding="utf-8")
    code, out, err = run_cli("explain", rule.code)
    assert code == 0, err
    assert page.split("\n", 1)[1] == out  # after the generated-file comment
    assert "What ortgate reports on this example" in page


def _documents():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_local_links_name_files_that_exist(doc):
    text = doc.read_text(encoding="utf-8")
    missing = [target for target in LINK.findall(text)
               if "://" not in target and not target.startswith("mailto:") and not (doc.parent / target).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to missing files: {missing}"


def test_the_readme_rules_table_links_every_rules_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    index = (PAGES / "README.md").read_text(encoding="utf-8")
    for rule in all_rules():
        assert f"[{rule.code}]({rule.code}.md)" in index
        assert f"docs/rules/{rule.code}.md" in readme or "docs/rules/README.md" in readme
