"""Command line: the only place that parses arguments, prints, and decides exit codes.

Exit codes: 0 success/clean, 1 findings (lint) or failures (verify), 2 bad
input, 3 the machine lacks something the command needs.
"""

from __future__ import annotations

import errno
import os
import sys

from ..errors import EnvironmentProblem, ToolError, descriptors_said
from ..vocabulary import Format


def main(argv: list[str] | None = None) -> int:
    try:
        with descriptors_said():
            from .parser import no_command, parser, unrecognized
    except ToolError as e:  # no free descriptor, before the arguments are known
        print(e.render(), file=sys.stderr)
        return e.exit_code

    hook = sys.modules.get("_torchgen_patch_hook")  # an enabled environment's (or run's): not in the tool itself
    if hook is not None:
        hook.stand_down()
    argv = list(sys.argv[1:] if argv is None else argv)
    program = None
    if next((a for a in argv if not a.startswith("-")), None) == "run" and "--" in argv:
        # `run`'s program is the program's own: no @file expansion, no option parsing past `--`
        i = argv.index("--")
        argv, program = argv[:i], argv[i + 1:]
    p = parser()
    args, extra = p.parse_known_args(argv)
    if args.cmd is None:
        p.error(no_command(p))
    if extra:  # named by the subcommand, whose --help lists what it takes
        p.commands[args.cmd].error(unrecognized(p.commands[args.cmd], extra))
    if program is not None:
        args.program = program
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        with descriptors_said():
            from .commands import COMMANDS, notes
            from .environment import ENVIRONMENT_COMMANDS

            with notes(args):
                rc = {**COMMANDS, **ENVIRONMENT_COMMANDS}[args.cmd](args)
        out.flush()  # here, where a full disk is said: not at the interpreter's exit
        return rc
    except StdoutFailed as e:
        _silence_stdout()
        hint = "run it with standard output open" if e.errno == errno.EBADF else "free space where it goes"
        print(EnvironmentProblem(f"cannot write to standard output: {e.strerror or e}",
                                 f"{hint}, or write the result to a file with -o where the command takes one"
                                 ).render(), file=sys.stderr)
        return EnvironmentProblem.exit_code
    except ToolError as e:  # bad input (exit 2) and what this machine lacks (exit 3), said the same way
        if getattr(args, "format", None) == Format.LINTRUNNER:  # lintrunner's protocol: a message, exit 0
            from ..diagnostics.render import lintrunner_failure

            sys.stdout.write(lintrunner_failure(e))
            return 0
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("torchgen-patch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        if sys.stdout is out:
            sys.stdout = out.stream


class StdoutFailed(OSError):
    """Standard output could not take what a command wrote (a full disk, an I/O error, closed)."""


class _Stdout:
    """The command's standard output: a write or flush it cannot take raises StdoutFailed (one line,
    exit 3, where it would have been a traceback); a closed pipe stays BrokenPipeError (exit 0)."""

    def __init__(self, stream):
        self._stream = stream

    @property
    def stream(self):
        return self._stream

    @property
    def buffer(self):  # the bytes under it, held to the same rule
        return _Stdout(getattr(self._stream, "buffer", None))

    def write(self, text):
        return self._call("write", text)

    def flush(self):
        return self._call("flush")

    def _call(self, name, *args):
        if self._stream is None:  # started with descriptor 1 closed
            raise StdoutFailed(errno.EBADF, "it is closed")
        try:
            return getattr(self._stream, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutFailed(e.errno, e.strerror) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """What could not be written is dropped, so the interpreter's own flush at exit fails no more."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
    except OSError:
        pass
