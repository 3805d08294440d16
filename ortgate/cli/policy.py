"""`ortgate policy`: policy files on their own."""

from __future__ import annotations

import argparse

from ortgate.cli.output import EXIT_PASS
from ortgate.errors import InputError


def add_parser(sub, parser_class) -> None:
    policy = sub.add_parser("policy", help="policy files")
    policy_sub = policy.add_subparsers(dest="policy_command", parser_class=parser_class)
    validate = policy_sub.add_parser("validate", help="check a policy against the schema (and its extends chain)")
    validate.add_argument("file")


def cmd_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "validate":
        return cmd_policy_validate(args)
    raise InputError("policy: a subcommand is required: validate (see `ortgate policy --help`)")


def cmd_policy_validate(args: argparse.Namespace) -> int:
    from ortgate.config.policy import load_policy
    from ortgate.config.throughput import throughput_policy
    from ortgate.engine.gate import gate_config_from

    policy = load_policy(args.file)
    throughput_policy(policy)  # the device exists, a target names its device, the calibration file reads
    gate_config_from(policy, cli_select=None, cli_ignore=None, fail_on=None)  # rule names in rules: and waivers:
    chain = " <- ".join(str(p) for p in policy.chain[1:])
    print(f"{args.file}: valid policy {policy.name!r}" + (f" (extends {chain})" if chain else ""))
    return EXIT_PASS
