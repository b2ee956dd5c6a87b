"""What the commands of the command line share: the usage error and the parser that
prints it as one line, the argument types (each names what it wants), the check of an
output folder, and running the program itself (``run``, armed or not)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback

from ..core._paths import PACKAGE_DIR


class _CliError(Exception):
    """A bad argument: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (naming the argument), exit code 2."""

    run_parser: argparse.ArgumentParser  # the top-level parser's `run` (cli._parser)

    def error(self, message):
        self.exit(2, f"gpuprof: error: {message} (see {self.prog} --help)\n")


# -- argument types: each names what it wants ---------------------------------------------
def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo:
            want = "a positive integer" if lo == 1 else f"an integer >= {lo}"
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def _seconds(positive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            want = "> 0" if positive else ">= 0"
            raise argparse.ArgumentTypeError(f"must be a number of seconds {want}, got {text!r}")
        return value

    parse.__name__ = "seconds"
    return parse


def _sort_key(text: str) -> str:
    from ..results.tables import SORT_KEYS

    if text not in SORT_KEYS:
        raise argparse.ArgumentTypeError(
            f"unknown sort key {text!r}; use one of " + ", ".join(sorted(SORT_KEYS))
        )
    return text


def _step_fn(text: str) -> str:
    from ..core._steps import parse

    try:
        parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


_positive = _int_at_least(1)
_natural = _int_at_least(0)


def _check_output_dir(path: str) -> None:
    """--output names a folder that exists or can be created, and can be written."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise _CliError(
                f"--output: {path!r} is a file, not a folder; name a folder (created if missing)"
            )
        parent = path
    else:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise _CliError(f"--output: cannot create {path!r}: {parent!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _CliError(
            f"--output: cannot write in {parent!r} (permission denied); name another folder"
        )


def _check_cuda_usable(side: str) -> None:
    """For --cuda: a one-line error when GPU capture cannot work on this machine;
    ``side`` says what the command does without it ("profile", "capture")."""
    import gpuprof

    status = gpuprof.cuda_status()
    if not status["usable"]:
        raise _CliError(
            f"--cuda: GPU capture is not usable here: {status['reason']}; "
            f"leave --cuda out to {side} the CPU side"
        )


def _find_program(args):
    """The program that `run` is to start (a script, or -m module), with its folder
    first on sys.path, as python itself puts it; a one-line error when not found."""
    from . import _launch

    try:
        program = _launch.find(args.target, args.module)
    except _launch.LaunchError as e:
        raise _CliError(str(e)) from None
    if program.path0 not in sys.path[:1]:
        sys.path.insert(0, program.path0)
    return program


def _run_program(program, code, argv, init_globals) -> int:
    """Run the program; return its exit code.

    An exception escaping the program is printed as Python would print it
    (without gpuprof's frames) and gives exit code 1, or 130 for
    KeyboardInterrupt, after which the profile is still reported.
    """
    try:
        program.run(code, argv, init_globals)
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - the program's own exception, reported as-is
        tb = e.__traceback__
        while tb is not None and _is_ours(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    return 0


def _is_ours(filename: str) -> bool:
    """Whether ``filename`` is a file of the gpuprof package (this file's grandparent)."""
    return filename.startswith(PACKAGE_DIR)


def _flush(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass
