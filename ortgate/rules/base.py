"""What a rule is: a code, a kebab-case name, a default severity, a docstring that IS its documentation,
and one function from the lint context to findings.

A rule's docstring starts with a one-line summary, followed by these sections (Markdown):

    ## What it checks
    ## Why it costs throughput
    ## Bad
    ## Good
    ## Fix

Bad and Good are examples that tests/test_rule_docs.py executes: Bad must fire the rule, Good must not. Each is
one or more fenced blocks whose info string says what the block is:

    ```onnx               the model, in ONNX textual syntax (onnx.parser.parse_model). A name declared with a
                          type in the graph's <...> list that no node computes is a weight (the test gives it
                          zeros: ortgate never reads weight values).
    ```onnx optimized     ORT's optimized dump of the model (alone: the model and its dump are the same graph)
    ```yaml               the policy (`name:` may be left out)
    ```json               genai_config.json
    ```yaml evidence      what `ortgate run` saw: ortgate.evidence.RunEvidence as YAML
    ```json baseline      the findings baseline (`--baseline FILE`)
    ```onnx base          the base model the model is compared with (`--compare BASE_MODEL`)
    ```text               prose, not executed (beside an executed block)

A section without a model lints examples/qwen3-moe-tiny-fused/model.onnx (float16, two decoder layers with
GroupQueryAttention and MoE, inputs [batch_size, sequence_length] and a KV cache of past_sequence_length).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ortgate.findings import Finding, Severity

if TYPE_CHECKING:
    from ortgate.rules.context import RuleContext

REQUIRED_SECTIONS = ("What it checks", "Why it costs throughput", "Bad", "Good", "Fix")
_CODE = re.compile(r"^OG[A-Z]\d{3}$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

CheckFunction = Callable[["RuleContext"], Iterable[Finding]]


class FixKind(str, Enum):
    """A repair `ortgate fix` makes, in the order it makes them: what `@rule(fix=)` names. A member is its name as
    a string (compares, hashes, formats and serializes as the name)."""

    moe = "moe"
    rmsnorm = "rmsnorm"
    rotary = "rotary"
    attention = "attention"

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


@dataclass(frozen=True)
class Rule:
    """A registered rule: its code, name, severity, family, check function, documentation and metadata."""

    code: str
    name: str
    severity: Severity
    family: str
    check: CheckFunction
    doc: str
    # What the rule needs to find anything (ortgate.rules.needs.NEEDS): without one of them it yields nothing.
    needs: tuple[str, ...] = ()
    # The cost model's repair kind (ortgate.cost.repairs.RepairKind, a str) that prices its findings; None: unpriced.
    price: str | None = None
    # Its one finding is about every node of its kind (it names the first): priced with all repairs of `price`.
    price_all: bool = False
    # The repair `ortgate fix` makes for its findings (a FixKind, a str); None: no automatic fix.
    fix: str | None = None
    # It judges the policy's declared session alone: `ortgate policy validate` runs it as lint does.
    policy_only: bool = False
    # A new rule, not yet promoted: it runs only under `--preview`, a policy's `rules: {preview: true}`, or when
    # selected by its own code or name, so that an update adding it never fails a gate that passed before.
    preview: bool = False

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0].strip()

    def section(self, title: str) -> str:
        return doc_sections(self.doc).get(title, "")


@dataclass(frozen=True)
class Example:
    """One fenced block of a Bad or Good section."""

    kind: str  # one of EXAMPLE_KINDS
    text: str


# Info string of a fenced block -> what the block is.
EXAMPLE_KINDS = {"onnx": "model", "onnx optimized": "optimized", "yaml": "policy", "json": "genai_config",
                 "yaml evidence": "evidence", "json baseline": "baseline", "onnx base": "base", "text": "text"}
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)


def doc_examples(section: str) -> list[Example]:
    """The fenced blocks of a Bad or Good section; an info string outside EXAMPLE_KINDS is kind "unknown"."""
    return [Example(EXAMPLE_KINDS.get(" ".join(info.split()), "unknown"), body)
            for info, body in _FENCE.findall(section)]


def doc_sections(doc: str) -> dict[str, str]:
    sections: dict[str, str] = {}
    current = None
    lines: list[str] = []
    for line in doc.splitlines():
        if line.startswith("## "):
            if current:
                sections[current] = "\n".join(lines).strip()
            current, lines = line[3:].strip(), []
        elif current:
            lines.append(line)
    if current:
        sections[current] = "\n".join(lines).strip()
    return sections


# Code prefix -> family. A family may span several modules.
FAMILIES = {
    "OGF": "fusion",      # the graph computes with many standard ops what one ORT kernel does
    "OGM": "model",       # the model's structure disagrees with the policy or the model family
    "OGS": "session",     # session options: optimization level, free dimensions, config entries
    "OGP": "provider",    # execution-provider options
    "OGK": "placement",   # which provider runs each node: kernels, Memcpy, CUDA graph capture
    "OGC": "drift",       # two declarations of one deployment disagree
    "OGR": "runtime",     # what `ortgate run` saw the real session do
    "OGW": "waivers",     # the policy's waivers
    "OGX": "contract",    # a node breaks its operator's documented contract: ORT refuses the model
    "OGT": "throughput",  # the policy's throughput targets against the decode cost model's estimate
}

_REGISTRY: dict[str, Rule] = {}


def rule(code: str, name: str, severity: Severity, *, needs: tuple[str, ...] = (), price: str | None = None,
         price_all: bool = False, fix: str | None = None, policy_only: bool = False, preview: bool = False
         ) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check function as a rule. Its docstring is the rule's documentation; the keywords are what the
    engine and `ortgate fix` know of it: what it needs (`needs`, the names of ortgate.rules.needs.NEEDS), the cost
    model's repair kind that prices its findings (`price`; `price_all`: with every repair of that kind, for a rule
    whose one finding is about every node of its kind), the repair `ortgate fix` makes for them (`fix`), and
    whether it judges the policy alone (`policy_only`), and whether it is new and not yet promoted (`preview`: it
    runs only when asked for)."""

    def register(func: CheckFunction) -> CheckFunction:
        import inspect  # only when the rule modules load: `ortgate rules` reads the catalog and never gets here

        doc = inspect.cleandoc(func.__doc__ or "")
        if not _CODE.match(code):
            raise ValueError(f"rule code {code!r} must look like OGF001")
        if not _NAME.match(name):
            raise ValueError(f"rule name {name!r} must be kebab-case")
        sections = doc_sections(doc)
        missing = [s for s in REQUIRED_SECTIONS if s not in sections]
        if missing:
            raise ValueError(f"rule {name}: docstring lacks sections {missing}")
        for existing in _REGISTRY.values():
            if existing.code == code or existing.name == name:
                raise ValueError(f"rule {code} {name} clashes with {existing.code} {existing.name}")
        family = FAMILIES.get(code[:3])
        if family is None:
            raise ValueError(f"rule code {code!r}: unknown family prefix {code[:3]!r}")
        _check_metadata(code, needs, price)
        if price_all and price is None:
            raise ValueError(f"rule {code}: price_all without a price")
        _REGISTRY[code] = Rule(code, name, severity, family, func, doc, tuple(needs), price, price_all, fix,
                               policy_only, preview)
        return func

    return register


def _check_metadata(code: str, needs: tuple[str, ...], price: str | None) -> None:
    from ortgate.cost.repairs import REPAIR_KINDS
    from ortgate.rules.needs import NEEDS

    unknown = [n for n in needs if n not in NEEDS]
    if unknown or len(set(needs)) != len(needs):
        raise ValueError(f"rule {code}: needs {list(needs)}: each one of {', '.join(NEEDS)}, once")
    if price is not None and price not in REPAIR_KINDS:
        raise ValueError(f"rule {code}: price {price!r} is not a repair kind ({', '.join(REPAIR_KINDS)})")


def registered_rules() -> list[Rule]:
    return sorted(_REGISTRY.values(), key=lambda r: r.code)
