"""The `ortgate` command line: parse, dispatch to one module per subcommand, turn errors into exit codes.

Exit codes: 0 the gate passes, 1 it fails, 2 usage or input error, 3 internal error (always an ortgate bug).
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ortgate.cli import estimate, fix, lint, policy, rules, run, upgrade
from ortgate.cli.output import EXIT_INPUT, EXIT_INTERNAL, EXIT_PASS, Terminated, error
from ortgate.errors import InputError


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line in ortgate's error format."""

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = RENAMED_FLAGS.get((self.prog, message))
        raise InputError(f"{message} ({hint + '; ' if hint else ''}see `{self.prog} --help`)")


# Usage errors that an old spelling of a flag produces, with what to write now (see CHANGELOG.md).
RENAMED_FLAGS = {
    ("ortgate run", "argument --baseline: expected one argument"):
        "measuring ORT's default session is --compare-default now; --baseline FILE is a findings baseline",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ortgate", description="Graph diagnostics linter and CI gate for LLMs on ONNX Runtime.")
    parser.add_argument("--version", action="store_true", help="print versions (ortgate, onnxruntime, kernel table)")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    lint.add_parser(sub)
    run.add_parser(sub)
    estimate.add_parser(sub)
    fix.add_parser(sub)
    rules.add_parsers(sub)
    policy.add_parser(sub, _Parser)
    upgrade.add_parser(sub)
    return parser


COMMANDS = {
    "lint": lint.cmd_lint,
    "run": run.cmd_run,
    "estimate": estimate.cmd_estimate,
    "fix": fix.cmd_fix,
    "rules": rules.cmd_rules,
    "explain": rules.cmd_explain,
    "policy": policy.cmd_policy,
    "upgrade": upgrade.cmd_upgrade,
}


# Commands whose whole run is short and allocates little garbage: the cyclic garbage collector stays off while one
# runs (it would only rescan the modules, knowledge tables and graph index they build, which hold no garbage).
_WITHOUT_COLLECTOR = frozenset(("lint", "estimate", "rules", "explain", "policy", "upgrade"))


def _command(args: Sequence[str]) -> str | None:
    """The command the arguments name (their first that is no flag), None for none (`--help`, `--version`)."""
    return next((a for a in args if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = _command(args)
    paused = gc.isenabled() and (command is None or command in _WITHOUT_COLLECTOR)
    if paused:
        gc.disable()
    try:
        return _main(args)
    finally:
        if paused:
            gc.enable()
        if argv is None:
            # The process ends now (the console script, `python -m ortgate`): what it holds is freed with it, so
            # the collections of the interpreter's shutdown need not walk every object first.
            gc.freeze()


def console() -> NoReturn:
    """The `ortgate` process (the console script, `python -m ortgate`): main(), then the exit. After a short
    command (lint, estimate, rules, explain, policy) the process leaves without the interpreter's teardown: what the
    command built (lint's graph index: freeing it takes as long as a rule pass) goes with the process instead of
    being freed object by object. Everything an exit does that can be seen still happens, in the interpreter's
    order: atexit callbacks, then stdout and stderr flushed; the exit code is main()'s. A stream that cannot be
    flushed (its reader went away), a thread still running or a longer command gets the interpreter's own exit."""
    fast = _command(sys.argv[1:]) in _WITHOUT_COLLECTOR
    if fast:
        lint.KEPT_UNTIL_EXIT = []
    code = main()
    if fast:
        _leave(code)
    raise SystemExit(code)


def _leave(code: int) -> None:
    """os._exit(code) after what the interpreter's exit would do that matters here; returns when that is unsafe."""
    import atexit
    import threading

    if threading.active_count() != 1:
        return
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # (a reader gone away): the interpreter's exit says so, as it always did
        return
    os._exit(code)


# A stream write that fails for want of room or a device error: the output cannot be written, as with a full disk.
_WRITE_FAILURES = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO))


def _main(args: list[str]) -> int:
    if sys.stdout is None:  # `>&-`: there is nowhere to write what the command says
        error("standard output is closed: nowhere to write the output (open it, or redirect it to a file)")
        return EXIT_INPUT
    try:
        return _dispatch(build_parser(), args)
    except InputError as exc:
        error(exc.one_line())
        return EXIT_INPUT
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except Terminated:
        error("terminated")
        return 143
    except MemoryError:
        error("out of memory")
        return EXIT_INPUT
    except BrokenPipeError:
        # The reader of stdout or stderr went away (`| head -1`): what the command said was not all read, so it
        # cannot pass; exit 2 as for any output that cannot be written. Python's own flush at exit is silenced.
        _silence_stdout()
        return EXIT_INPUT
    except OSError as exc:
        if exc.filename is None and exc.errno in _WRITE_FAILURES:
            # A stream write failed (`> /dev/full`): the output is not all there, so the command cannot pass. A full
            # disk is the machine's state, not an ortgate bug. Every file ortgate writes is written under its name
            # (an error naming it), so a nameless write is standard output's (a full stderr could not say so anyway).
            _silence_stdout()
            error(f"standard output: cannot be written: {exc.strerror}")
            return EXIT_INPUT
        if exc.filename is None:
            return _internal(exc)
        # A path the command line named (or one reached through it) that the system refuses: too long, unreadable,
        # a full disk, a busy mount point. The user's input, not an ortgate bug.
        error(InputError(exc.strerror or str(exc), exc.filename).one_line())
        return EXIT_INPUT
    except RuntimeError as exc:
        if str(exc).startswith("Symlink loop from "):  # pathlib's resolve(): the path is a cycle of symlinks
            error(InputError("a loop of symbolic links", str(exc).split("from ", 1)[1].strip("'")).one_line())
            return EXIT_INPUT
        return _internal(exc)
    except Exception as exc:
        return _internal(exc)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's StringIO): nothing to silence
        pass


def _internal(exc: Exception) -> int:
    """Never a traceback in CI logs; ORTGATE_STRICT=1 shows it."""
    if os.environ.get("ORTGATE_STRICT") == "1":
        raise exc
    error(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} (please report this)")
    return EXIT_INTERNAL


def _dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    args = parser.parse_args(argv)
    if args.version:
        print(version_text())
        return EXIT_PASS
    command = COMMANDS.get(args.command)
    if command is None:
        raise InputError("a command is required: lint, run, estimate, fix, rules, explain or policy (see `ortgate --help`)")
    return command(args)


# The distributions that install the `onnxruntime` module: one build per provider family.
ORT_DISTRIBUTIONS = ("onnxruntime-gpu", "onnxruntime", "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn",
                     "onnxruntime-rocm", "onnxruntime-migraphx", "onnxruntime-cann")


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, read from its metadata (the package itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def version_text() -> str:
    from ortgate import __version__
    from ortgate.knowledge import kernel_table

    found = [(d, v) for d in ORT_DISTRIBUTIONS if (v := installed_version(d)) is not None]
    if found:
        ort = "; ".join(f"{v} ({d})" for d, v in found)
    else:
        ort = "not installed (`ortgate run` needs it: pip install 'ortgate[gpu]' or 'ortgate[cpu]')"
    table = kernel_table()
    return (f"ortgate {__version__}\nonnxruntime {ort}\nonnx {installed_version('onnx') or 'not installed'}\n"
            f"kernel table: {table.ort_version} (commit {table.commit[:12]})")
