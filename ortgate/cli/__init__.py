"""The command line: one module per subcommand (lint, run, rules/explain, policy), shared output helpers in
`ortgate.cli.output`, parsing and dispatch in `ortgate.cli.main`."""

from ortgate.cli.main import main

__all__ = ["main"]
