"""`ortgate policy`: policy files on their own. `validate` runs every check lint runs on a policy and reports every
problem at once; `show` prints the merged effective policy with the file and line each value came from."""

from __future__ import annotations

import argparse

from ortgate.cli.output import EXIT_PASS
from ortgate.errors import InputError, printable


def add_parser(sub, parser_class) -> None:
    policy = sub.add_parser("policy", help="policy files")
    policy_sub = policy.add_subparsers(dest="policy_command", parser_class=parser_class)
    validate = policy_sub.add_parser(
        "validate", help="run every check lint runs on a policy (schema, extends chain, rule references, provider and "
                         "session option catalogs, waivers, model family) and report every problem")
    validate.add_argument("files", nargs="+", metavar="FILE")
    show = policy_sub.add_parser("show", help="print the merged effective policy, each value with the file and line "
                                              "it came from")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--format", choices=("yaml", "json"), default="yaml")


def cmd_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "validate":
        return cmd_policy_validate(args)
    if args.policy_command == "show":
        return cmd_policy_show(args)
    raise InputError("policy: a subcommand is required: validate or show (see `ortgate policy --help`)")


def cmd_policy_validate(args: argparse.Namespace) -> int:
    """Exit 2 when lint would refuse a policy, 1 when it would report an error about it, else 0.

    What lint would refuse is said as lint says it, one `ortgate: error: FILE:LINE: problem` line each on stderr,
    every one of them in line order; what lint would report about a policy that loads goes to stdout with a verdict
    line per file."""
    from ortgate.cli.output import error
    from ortgate.config.policy import display_source
    from ortgate.engine.policy_check import check_policy
    from ortgate.report import unforgeable

    code = EXIT_PASS
    for file in args.files:
        check = check_policy(file)
        refused = [p for p in check.problems if p.refused]
        for p in refused:
            error(printable(f"{p.file}:{p.line}: {p.message}" if p.line else f"{p.file}: {p.message}"))
        if not refused:
            for p in check.problems:
                where = f"{display_source(p.file)}:{p.line}" if p.line else display_source(p.file)
                rule = f" [{p.rule}]" if p.rule else ""
                print(unforgeable(printable(f"{where}: {p.severity}: {p.message}{rule}")))
            print(unforgeable(_verdict(file, check)))
        code = max(code, check.exit_code)
    return code


def _verdict(file: str, check) -> str:
    from ortgate.config.policy import display_source

    counts = {level: sum(p.severity == level for p in check.problems) for level in ("error", "warning", "info")}
    said = ", ".join(f"{n} {level}{'s' if n != 1 else ''}" for level, n in counts.items() if n)
    chain = " <- ".join(display_source(p) for p in check.policy.chain[1:])
    head = printable(f"{file}: valid policy {check.policy.name!r}" + (f" (extends {chain})" if chain else ""))
    if check.exit_code == 1:
        return f"{head}; lint reports {said} about it"
    return head + (f"; {said}" if said else "")


def cmd_policy_show(args: argparse.Namespace) -> int:
    from ortgate.config.policy import load_policy
    from ortgate.config.show import effective_policy_json, effective_policy_yaml
    from ortgate.report import unforgeable

    policy = load_policy(args.file)
    print(effective_policy_json(policy) if args.format == "json" else unforgeable(effective_policy_yaml(policy)), end="")
    return EXIT_PASS

