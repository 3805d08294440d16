"""Argument groups shared by the subcommands: one class per concern, each adding its flags to a parser
(`add_to`) and reading them back from the parsed namespace into a typed, immutable request (`parse`). A command that
takes a concern's flags takes them from its group, so their names, defaults, choices and help are one definition."""

from __future__ import annotations

import argparse
from typing import NamedTuple

from ortgate.cli.output import split_list


def _owned(action: argparse.Action, group: type) -> argparse.Action:
    """Mark `action` as added by `group` (tests check that every command's flags of a concern come from its group)."""
    action.ortgate_group = group.__name__  # type: ignore[attr-defined]
    return action


class GateRequest(NamedTuple):
    """The gate's flags: the baseline it reads and writes, the severity that fails it and the rules it runs.

    (Immutable; a NamedTuple, not a dataclass, as cli.output.Output: `ortgate --help` imports this module.)"""

    baseline: str | None
    write_baseline: str | None
    prune_baseline: bool
    fail_on: str | None
    select: list[str] | None
    ignore: list[str] | None
    preview: bool


class GateArgs:
    """--baseline, --write-baseline, --prune-baseline, --fail-on, --select, --ignore, --preview (lint, run)."""

    FLAGS = ("--baseline", "--write-baseline", "--prune-baseline", "--fail-on", "--select", "--ignore", "--preview")

    @classmethod
    def add_to(cls, parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        _owned(add("--baseline", metavar="FILE",
                   help="an ortgate baseline: findings listed in it are reported as suppressed"), cls)
        _owned(add("--write-baseline", metavar="FILE",
                   help="write every current finding (not covered by a waiver) to FILE as the new baseline, "
                        "then judge against it"), cls)
        _owned(add("--prune-baseline", action="store_true",
                   help="rewrite the --baseline file without its stale entries (entries that matched no "
                        "finding), as the current baseline version"), cls)
        _owned(add("--fail-on", choices=("error", "warning", "info"),
                   help="lowest severity that fails the gate (default: the policy's rules.fail_on, else error)"), cls)
        _owned(add("--select", metavar="RULES",
                   help="comma-separated rule names, codes or code prefixes to run"), cls)
        _owned(add("--ignore", metavar="RULES",
                   help="comma-separated rule names, codes or code prefixes to skip"), cls)
        _owned(add("--preview", action="store_true",
                   help="also run the rules in preview: new rules, not yet promoted, which otherwise run only "
                        "when selected by code or name (`ortgate rules` marks them)"), cls)

    @staticmethod
    def parse(args: argparse.Namespace) -> GateRequest:
        return GateRequest(baseline=args.baseline, write_baseline=args.write_baseline,
                           prune_baseline=args.prune_baseline, fail_on=args.fail_on, select=split_list(args.select),
                           ignore=split_list(args.ignore), preview=args.preview)


class ReleaseRequest(NamedTuple):
    """The ONNX Runtime release the deployment is judged on (None: the policy's, else the one ortgate assumes)."""

    ort_version: str | None


class ReleaseArgs:
    """--ort-version (lint, estimate)."""

    FLAGS = ("--ort-version",)

    @classmethod
    def add_to(cls, parser: argparse.ArgumentParser) -> None:
        _owned(parser.add_argument("--ort-version", metavar="RELEASE",
                                   help="judge the deployment on this ONNX Runtime release (default: the policy's "
                                        "execution_provider.onnxruntime_version, else the release ortgate assumes, "
                                        "1.31.1)"), cls)

    @staticmethod
    def parse(args: argparse.Namespace) -> ReleaseRequest:
        return ReleaseRequest(ort_version=args.ort_version)


# The gate's report formats (lint, run); cli.lint.LINT_FORMATS.
REPORT_FORMATS = ("text", "json", "sarif", "github", "markdown", "junit", "codequality")


class ReportRequest(NamedTuple):
    """The main report: its format and the file it goes to (None: stdout)."""

    format: str
    output: str | None


class ReportArgs:
    """--format (one of the gate's report formats) and --output (lint, run)."""

    FLAGS = ("--format", "--output")

    @classmethod
    def add_to(cls, parser: argparse.ArgumentParser) -> None:
        _owned(parser.add_argument("--format", choices=REPORT_FORMATS, default="text",
                                   help="report format on stdout (or --output): text, json, sarif, github (workflow "
                                        "annotations), markdown (job summary), junit (JUnit XML), codequality "
                                        "(GitLab Code Quality)"), cls)
        _owned(parser.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout"), cls)

    @staticmethod
    def parse(args: argparse.Namespace) -> ReportRequest:
        return ReportRequest(format=args.format, output=args.output)


class GenaiConfigRequest(NamedTuple):
    """The onnxruntime-genai genai_config.json given (None: the one beside the model, if any)."""

    config: str | None


class GenaiConfigArgs:
    """--config, the model's onnxruntime-genai configuration (lint, estimate, run, upgrade)."""

    FLAGS = ("--config",)

    @classmethod
    def add_to(cls, parser: argparse.ArgumentParser) -> None:
        _owned(parser.add_argument("--config",
                                   help="onnxruntime-genai genai_config.json (default: the one beside the model)"), cls)

    @staticmethod
    def parse(args: argparse.Namespace) -> GenaiConfigRequest:
        return GenaiConfigRequest(config=args.config)


# Every group, for the tests that check each command takes a concern's flags from its group.
GROUPS = (GateArgs, ReleaseArgs, ReportArgs, GenaiConfigArgs)
