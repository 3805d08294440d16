"""What ortgate's own source may never do with an input: deserialize code, evaluate it, run a shell, or read
weights. Checked on the syntax tree of every module under ortgate/ (and, as a backstop, on the text)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ortgate

PACKAGE = Path(ortgate.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

# Modules that turn bytes into live objects (or code).
FORBIDDEN_IMPORTS = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "torch"}
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__", "execfile"}
# yaml entry points that construct arbitrary Python objects (or may, depending on the loader passed).
YAML_UNSAFE = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all", "Loader",
               "FullLoader", "UnsafeLoader", "CLoader", "CFullLoader", "CUnsafeLoader", "add_constructor",
               "add_multi_constructor"}
OS_SHELL = {"system", "popen", "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
            "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "startfile"}
# onnx/onnxruntime calls that read weight files or load native code, and where they may appear.
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
import pickle
from yaml import load
import yaml, os, subprocess, onnx
yaml.load(text, Loader=yaml.Loader)
eval(expr)
os.system(cmd)
subprocess.run(cmd, shell=True)
subprocess.run("ls " + path)
onnx.load(path)
so.register_custom_ops_library(lib)
"""
    problems = unsafe_constructs(ast.parse(bad), "graph/x.py")
    for expected in ("imports pickle", "imports yaml.load", "uses yaml.load", "uses yaml.Loader", "calls eval()",
                     "uses os.system", "passes shell=", "not an argument list", "without load_external_data=False",
                     "calls register_custom_ops_library"):
        assert any(expected in p for p in problems), (expected, problems)
    assert unsafe_constructs(ast.parse("onnx.load(p, load_external_data=False)\nyaml.safe_load(t)"), "x.py") == []


def unsafe_constructs(tree: ast.AST, rel: str) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            problems += [f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_IMPORTS]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_IMPORTS:
                problems.append(f"{where} imports from {node.module}")
            if node.module == "yaml":
                problems += [f"{where} imports yaml.{a.name}" for a in node.names if a.name in YAML_UNSAFE]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "yaml" and node.attr in YAML_UNSAFE:
                problems.append(f"{where} uses yaml.{node.attr} (only safe_load / SafeLoader / CSafeLoader)")
            if node.value.id == "os" and node.attr in OS_SHELL:
                problems.append(f"{where} uses os.{node.attr}")
        elif isinstance(node, ast.Call):
            owner, name = _call_name(node)
            if owner is None and name in FORBIDDEN_BUILTINS:
                problems.append(f"{where} calls {name}()")
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    problems.append(f"{where} passes shell=... to {name}")
                if kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    problems.append(f"{where} passes allow_pickle=... to {name}")
            if owner == "subprocess" and node.args and not isinstance(node.args[0], (ast.List, ast.Tuple)):
                problems.append(f"{where} runs subprocess.{name} with a command that is not an argument list")
            if owner == "onnx" and name in ("load", "load_model") and not any(
                    kw.arg == "load_external_data" and isinstance(kw.value, ast.Constant) and kw.value.value is False
                    for kw in node.keywords):
                problems.append(f"{where} calls onnx.{name} without load_external_data=False (reads the weights)")
            if name in ALLOWED_CALL_SITES and rel not in ALLOWED_CALL_SITES[name]:
                problems.append(f"{where} calls {name}")
            if name == "import_module":
                problems.append(f"{where} imports a module by name at run time")
    return problems


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
