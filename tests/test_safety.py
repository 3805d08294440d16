"""What ortgate's own source may never do with an input: deserialize code, evaluate it, run a shell, or read
weights. ruff's rules (pyproject.toml) ban most of it; the syntax-tree checks here cover what ruff cannot express,
and a text grep is the backstop."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

import ortgate

PACKAGE = Path(ortgate.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

# What ruff cannot express (its rules in pyproject.toml cover the rest: the banned APIs (TID251) for pickle, marshal,
# torch, unsafe yaml, os.system, importlib.import_module, ctypes and weight-reading onnx helpers; S102 / S307 for
# exec / eval; S602 / S604 / S605 / S606 for shells): builtins without a ruff rule, `shell=` and `allow_pickle=` set
# to anything but a literal False, subprocess commands that are not argument lists, onnx.load without
# load_external_data=False, and calls known by their method name on any object, allowed only where listed.
FORBIDDEN_BUILTINS = {"compile", "__import__", "execfile"}
ALLOWED_CALL_SITES = {
    "register_custom_ops_library": {"runner/session.py"},
    "load_external_data_for_model": set(),
    "load_external_data_for_tensor": set(),
    "get_all_opkernel_def": set(),
    "LoadLibrary": set(),
    "CDLL": set(),
    "PyDLL": set(),
    "dlopen": set(),
}


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _call_name(node: ast.Call) -> tuple[str | None, str | None]:
    """(object, attribute) of `obj.attr(...)`, or (None, name) of `name(...)`."""
    func = node.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, None


def test_the_package_has_sources_to_check():
    assert len(SOURCES) > 20 and PACKAGE / "config" / "source.py" in SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_deserialization_evaluation_or_shell(path):
    problems = unsafe_constructs(_tree(path), _rel(path))
    assert not problems, "\n".join(problems)


def test_the_checker_catches_each_construct():
    bad = """
import subprocess, onnx
compile(src, "f", "exec")
__import__(name)
subprocess.run(cmd, shell=flag)
subprocess.run("ls " + path)
numpy.load(path, allow_pickle=True)
onnx.load(path)
so.register_custom_ops_library(lib)
C.get_all_opkernel_def()
"""
    problems = unsafe_constructs(ast.parse(bad), "graph/x.py")
    for expected in ("calls compile()", "calls __import__()", "passes shell=", "not an argument list",
                     "passes allow_pickle=", "without load_external_data=False", "calls register_custom_ops_library",
                     "calls get_all_opkernel_def"):
        assert any(expected in p for p in problems), (expected, problems)
    assert unsafe_constructs(ast.parse("onnx.load(p, load_external_data=False)\nyaml.safe_load(t)"), "x.py") == []
    assert unsafe_constructs(ast.parse("so.register_custom_ops_library(lib)"), "runner/session.py") == []


def unsafe_constructs(tree: ast.AST, rel: str) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if not isinstance(node, ast.Call):
            continue
        owner, name = _call_name(node)
        if owner is None and name in FORBIDDEN_BUILTINS:
            problems.append(f"{where} calls {name}()")
        for kw in node.keywords:
            if kw.arg in ("shell", "allow_pickle") and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                problems.append(f"{where} passes {kw.arg}=... to {name}")
        if owner == "subprocess" and node.args and not isinstance(node.args[0], (ast.List, ast.Tuple)):
            problems.append(f"{where} runs subprocess.{name} with a command that is not an argument list")
        if owner == "onnx" and name in ("load", "load_model") and not any(
                kw.arg == "load_external_data" and isinstance(kw.value, ast.Constant) and kw.value.value is False
                for kw in node.keywords):
            problems.append(f"{where} calls onnx.{name} without load_external_data=False (reads the weights)")
        if name in ALLOWED_CALL_SITES and rel not in ALLOWED_CALL_SITES[name]:
            problems.append(f"{where} calls {name}")
    return problems


RUFF_BANNED = """
import pickle
import marshal
import torch
import ctypes
import yaml, os, subprocess, importlib
from yaml import load as innocent
from onnx.external_data_helper import load_external_data_for_model
from onnxruntime.capi import _pybind_state as C
yaml.load(text, Loader=yaml.Loader)
eval(expr)
exec(code)
os.system(cmd)
os.execv(path, args)
subprocess.run(cmd, shell=True)
importlib.import_module(name)
C.get_all_opkernel_def()
"""


def _ruff(source: str, filename: str) -> list[str]:
    from ruff.__main__ import find_ruff_bin

    done = subprocess.run([find_ruff_bin(), "check", "--no-cache", "--output-format", "concise", "--config",
                           str(PACKAGE.parent / "pyproject.toml"), "--stdin-filename", filename, "-"],
                          input=source, capture_output=True, text=True, cwd=PACKAGE.parent, check=False)
    return done.stdout.splitlines()


def test_ruff_bans_in_the_package_what_it_may_never_do():
    """The ruff rules that replaced the hand-written ban-list: each construct is reported in the package, and only
    there (fixture and corpus scripts may import torch or write pickles)."""
    lines = _ruff(RUFF_BANNED, "ortgate/graph/x.py")
    for expected in ("`pickle` is banned", "`marshal` is banned", "`torch` is banned", "`ctypes` is banned",
                     "`yaml.load` is banned", "`yaml.Loader` is banned", "S506", "S307", "S102",
                     "`os.system` is banned", "S605", "S606", "S602", "`importlib.import_module` is banned",
                     "load_external_data_for_model` is banned", "get_all_opkernel_def` is banned"):
        assert any(expected in line for line in lines), (expected, lines)
    assert not any(" TID251 " in line or " S60" in line for line in _ruff(RUFF_BANNED, "tests/make_corpus_x.py"))


TEXT_PATTERNS = {
    r"\byaml\.(load|load_all|unsafe_load|full_load)\(": "yaml.load(...)",
    r"\bpickle\b": "pickle",
    r"\bmarshal\b": "marshal",
    r"(?<![\w.])eval\(": "eval(",
    r"(?<![\w.])exec\(": "exec(",
    r"shell\s*=\s*True": "shell=True",
}


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_dangerous_text_either(path):
    """A grep, in case the syntax-tree check above misses an aliasing trick (`from yaml import load as l`)."""
    text = path.read_text(encoding="utf-8")
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # comments may name them
    found = [what for pattern, what in TEXT_PATTERNS.items()
             if re.search(pattern, code) and not (what == "pickle" and _only_in_strings(path, "pickle"))]
    assert not found, f"{_rel(path)}: {found}"


def _only_in_strings(path: Path, word: str) -> bool:
    """`pickle` may appear in messages ("this is a Python pickle"), never as code."""
    names = {n.id for n in ast.walk(_tree(path)) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(_tree(path)) if isinstance(n, ast.Attribute)}
    return word not in names


def test_the_custom_op_library_call_is_reached_only_through_the_explicit_flag():
    """session.py registers what `custom_op_libraries(..., allowed=...)` returns; that function returns
    nothing unless `allowed` (the --allow-custom-ops flag) is set."""
    source = (PACKAGE / "runner" / "session.py").read_text()
    assert source.count("register_custom_ops_library(") == 1
    command = (PACKAGE / "runner" / "collect.py").read_text()
    assert "custom_op_libraries(inputs.model, setup, allowed=request.allow_custom_ops)" in command


def test_yaml_is_read_with_the_safe_loader_only():
    import yaml

    from ortgate.config import source

    assert source._LOADER in (getattr(yaml, "CSafeLoader", None), yaml.SafeLoader)
    assert type(source._SCALAR_CONSTRUCTOR) is yaml.SafeLoader
