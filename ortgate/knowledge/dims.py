"""The one classifier of symbolic dim names: which role a dim plays in an LLM's interface (batch, query length, past
length, total length, sliding-window cache, static buffer length, head size), from the names exporters write
(dim_names.json). The linter's session rules and the runner's input synthesis both read it, so the dims the linter
judges are the dims the runner feeds.

    dim_role("past_sequence_length")                     # "past"
    dim_role("past_sequence_length + sequence_length")   # "total": derived from its terms
    dim_kind("present_sequence_length")                  # "kv" (grows during decode)
    dim_value("past_sequence_length + sequence_length", {"past_sequence_length": 4, "sequence_length": 1}.get)  # 5

A dim named by an expression (optimum's attention mask `past_sequence_length + sequence_length`, genai's
`batch_size * sequence_length`) is parsed, never evaluated as code: only names, integers and + - * // are read.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ortgate.knowledge.loader import build, read_json

DIM_NAMES_JSON = Path(__file__).with_name("dim_names.json")

Role = Literal["batch", "query", "past", "total", "sliding_past", "max", "head"]
Kind = Literal["batch", "query", "kv", "other"]
ROLES: tuple[str, ...] = get_args(Role)
KV_ROLES = frozenset({"past", "total", "sliding_past", "max"})  # lengths that grow (or are sized) with the cache


@dataclass(frozen=True)
class _RoleNames:
    """dim_names.json: the names of one dimension role."""

    about: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class _Pattern:
    """dim_names.json: a name pattern and the role it means."""

    pattern: str
    role: Role | None  # None: not a length (and no role), whatever later patterns say
    unless: str | None = None  # the pattern does not apply when this one also matches
    why: str | None = None


@dataclass(frozen=True)
class _DimNamesFile:
    """dim_names.json."""

    schema: Literal[1]
    about: str
    reflects: Mapping[str, str]
    roles: Mapping[str, _RoleNames]
    patterns: tuple[_Pattern, ...]

    def __post_init__(self) -> None:
        if set(self.roles) != set(ROLES):
            raise ValueError(f"roles must be exactly {', '.join(ROLES)}")
        seen: dict[str, str] = {}
        for role, entry in self.roles.items():
            for name in entry.names:
                if name != name.lower() or name in seen:
                    raise ValueError(f"roles.{role}: {name!r} is not lowercase or is listed for {seen.get(name)!r} too")
                seen[name] = role
        for p in self.patterns:
            for text in (p.pattern, p.unless):
                try:
                    re.compile(text or "")
                except re.error as exc:
                    raise ValueError(f"patterns: {text!r} is not a regular expression: {exc}") from exc


_DATA = build(_DimNamesFile, read_json(DIM_NAMES_JSON), DIM_NAMES_JSON.name)
_EXACT: dict[str, str] = {name: role for role, entry in _DATA.roles.items() for name in entry.names}
_PATTERNS = tuple((re.compile(p.pattern), re.compile(p.unless) if p.unless else None, p.role) for p in _DATA.patterns)


# ---- expressions ---------------------------------------------------------------------------------------------

_EXPRESSION_CHARS = re.compile(r"^[A-Za-z0-9_ +\-*/()]+$")
_MAX_EXPRESSION = 200  # longer names are plain names: nothing an exporter writes, and a bound on the parser's work
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "//"}


@dataclass(frozen=True)
class DimExpr:
    """A dim named by arithmetic on other dims: `left op right`, each side a name, an integer or an expression."""

    op: str  # + - * //
    left: DimExpr | str | int
    right: DimExpr | str | int

    def names(self) -> tuple[str, ...]:
        out: list[str] = []
        for side in (self.left, self.right):
            if isinstance(side, DimExpr):
                out.extend(side.names())
            elif isinstance(side, str):
                out.append(side)
        return tuple(out)

    def sum_terms(self) -> tuple[DimExpr | str | int, ...] | None:
        """The terms of a pure sum (a + b + c), None if the expression is anything else."""
        if self.op != "+":
            return None
        out: list[DimExpr | str | int] = []
        for side in (self.left, self.right):
            if isinstance(side, DimExpr) and side.op == "+":
                out.extend(side.sum_terms() or ())
            else:
                out.append(side)
        return tuple(out)


def _convert(node: ast.AST) -> DimExpr | str | int:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return DimExpr(_OPS[type(node.op)], _convert(node.left), _convert(node.right))
    raise ValueError("not a dim expression")


@functools.lru_cache(maxsize=4096)
def parse_dim(name: str) -> DimExpr | None:
    """The expression a dim name spells, or None for a plain name (or anything that is not simple arithmetic)."""
    if len(name) > _MAX_EXPRESSION or not _EXPRESSION_CHARS.match(name) or not re.search(r"[+\-*/]", name):
        return None
    try:
        tree = ast.parse(name.strip(), mode="eval")
        expr = _convert(tree.body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return expr if isinstance(expr, DimExpr) else None


def dim_terms(name: str) -> tuple[str, ...]:
    """The plain dim names `name` is made of: (name,) for a plain name."""
    expr = parse_dim(name)
    return expr.names() if expr is not None else (name,)


# ---- roles ---------------------------------------------------------------------------------------------------


def _name_role(name: str) -> str | None:
    low = name.strip().lower()
    role = _EXACT.get(low)
    if role is not None:
        return role
    for pattern, unless, role in _PATTERNS:
        if pattern.search(low) and not (unless and unless.search(low)):
            return role
    return None


def _expr_role(expr: DimExpr) -> str | None:
    terms = expr.sum_terms()
    if terms is None or not all(isinstance(t, str) for t in terms):
        return None
    roles = sorted(_name_role(t) or "" for t in terms if isinstance(t, str))
    if roles in (["past", "query"], ["query", "sliding_past"]):
        return "total"  # past + new tokens
    return None


@functools.lru_cache(maxsize=4096)
def dim_role(name: str) -> str | None:
    """batch | query | past | total | sliding_past | max | head, or None (unknown, or derived like batch * seq)."""
    expr = parse_dim(name)
    return _expr_role(expr) if expr is not None else _name_role(name)


def dim_kind(name: str) -> Kind:
    """What a dim means for pinning it: "batch", "query" (tokens in this step), "kv" (grows during decode, or a
    cache buffer's length) or "other". An expression is "kv" if any term is, else "query" if any term is, else
    "batch" if every term is."""
    role = dim_role(name)
    if role is None and parse_dim(name) is not None:
        kinds = {dim_kind(term) for term in dim_terms(name)}
        for kind in ("kv", "query"):
            if kind in kinds:
                return kind
        return "batch" if kinds == {"batch"} else "other"
    if role in KV_ROLES:
        return "kv"
    if role in ("batch", "query"):
        return role  # type: ignore[return-value]
    return "other"


def dim_value(name: str, value_of: Callable[[str], int | None]) -> int | None:
    """The size of dim `name` given the sizes of plain names (`value_of`); None when a term has no size."""
    expr = parse_dim(name)
    return value_of(name) if expr is None else _evaluate(expr, value_of)


def _evaluate(node: DimExpr | str | int, value_of: Callable[[str], int | None]) -> int | None:
    if isinstance(node, int):
        return node
    if isinstance(node, str):
        return value_of(node)
    left, right = _evaluate(node.left, value_of), _evaluate(node.right, value_of)
    if left is None or right is None:
        return None
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    return left // right if right else None


def role_names(role: str) -> tuple[str, ...]:
    """The exact names dim_names.json lists for `role`."""
    return _DATA.roles[role].names
