"""Command-line usage errors as one line: which option or argument is wrong and what it needs, never the value.

Click (under Typer) reports a bad option value in a framed panel of several lines that quotes what was
typed (``'1e10' is not a valid integer``). The project's rule for bad input is one line naming the
parameter, exit code 2: ``kepsilon release: invalid value for '--k': give a whole number``. The
command group below keeps Click's parsing and exit codes and only changes how a usage error is told.
A bare ``kepsilon`` or ``kepsilon audit`` still prints its help.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from typer import echo
from typer._click import exceptions as click  # the Click that Typer ships and raises from (not ``click``)
from typer.core import TyperGroup
from typer.exceptions import Abort

USAGE_EXIT_CODE = 2
_TYPE_NEEDS = {int: "a whole number", float: "a number", bool: "true or false", str: "some text"}


def usage_line(error: click.UsageError) -> str:
    """The one line for a usage error: the command, the option or argument, what it needs."""
    command = error.ctx.command_path if error.ctx is not None else "kepsilon"
    if isinstance(error, click.BadParameter) and not isinstance(error, click.MissingParameter):
        return f"{command}: invalid value for {_parameter_name(error)}: give {_needs(error.param)}"
    message = " ".join(error.format_message().split())
    if message.startswith("Got unexpected extra argument"):
        message = "unexpected extra argument(s)"  # the argument's text is not repeated
    return f"{command}: {message} (see {command} --help)"


def _parameter_name(error: click.BadParameter) -> str:
    if error.param_hint is not None:
        return str(error.param_hint)
    if error.param is not None:
        return error.param.get_error_hint()
    return "a parameter"


def _needs(param) -> str:
    """What the parameter takes, in words, from its declared type (never from the value given)."""
    descriptor = getattr(param, "type_descriptor", None)
    kind = getattr(descriptor, "annotation", None)
    if typing.get_origin(kind) is typing.Union or type(kind).__name__ == "UnionType":
        kind = next((arg for arg in typing.get_args(kind) if arg is not type(None)), None)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(str(member.value) for member in kind)
    if isinstance(kind, type) and issubclass(kind, Path):
        return "a path"
    return _TYPE_NEEDS.get(kind, "a valid value") if isinstance(kind, type) else "a valid value"


class OneLineUsageErrors(TyperGroup):
    """The ``kepsilon`` command group: Typer's, with usage errors told in one line (exit code 2)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except click.NoArgsIsHelpError as error:
            error.show()
            sys.exit(error.exit_code)
        except click.UsageError as error:
            echo(usage_line(error), err=True)
            sys.exit(USAGE_EXIT_CODE)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except Abort:
            echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
