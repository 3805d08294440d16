"""One vocabulary per domain: an ONNX Runtime execution provider's name is spelled in code in one module,
ortgate/knowledge/provider_names.py, and every other module imports it from there. Docstrings and comments (a rule's
documented policy, an example) may name a provider; a string the code compares, passes to ORT or prints may not."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

OWNER = REPO / "ortgate" / "knowledge" / "provider_names.py"
PROVIDER_NAME = re.compile(r"\b\w+ExecutionProvider\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are a module's, class's or function's docstring."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def provider_literals(source: str) -> list[tuple[int, str]]:
    """(line, name) for each provider name a string constant of the code (not a docstring) spells."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [(node.lineno, name) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            for name in PROVIDER_NAME.findall(node.value)]


def test_provider_names_are_spelled_only_by_their_owner_module():
    stray = [f"{path.relative_to(REPO)}:{line}: {name}" for path in sorted((REPO / "ortgate").rglob("*.py"))
             if path != OWNER for line, name in provider_literals(path.read_text(encoding="utf-8"))]
    assert stray == [], "import the name from ortgate.knowledge.provider_names instead:\n" + "\n".join(stray)


def test_the_check_sees_code_literals_and_f_strings_but_not_docstrings():
    assert len(provider_literals(OWNER.read_text(encoding="utf-8"))) == 8
    source = ('"""Runs on CUDAExecutionProvider."""\n\ndef f(p):\n    """On CPUExecutionProvider."""\n'
              '    return p == "CUDAExecutionProvider" or f"{p} on TensorrtExecutionProvider"\n')
    assert provider_literals(source) == [(5, "CUDAExecutionProvider"), (5, "TensorrtExecutionProvider")]
