"""What every command shares: Click options made from the settings declarations, the values the user typed,
domain errors as one line and an exit code, and keeping stdout for the one JSON object under --json."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterable

import click

from launcher import settings
from launcher.errors import OffloadLaunchError
from launcher.settings import Kind


class ToolError(click.ClickException):
    """A domain error shown as one line, with the domain's exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def user_errors(func):
    """Turn OffloadLaunchError into a one-line message and its exit code; tracebacks are for bugs only."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except OffloadLaunchError as err:
            raise ToolError(str(err), err.exit_code) from None

    return wrapper


def option(name: str, **overrides):
    """The Click option for setting `name`, as declared in launcher/settings.py (`overrides`: per-command
    wording such as a shorter help text, or required=True)."""
    d = settings.declaration(name)
    kwargs: dict = {"help": d.help, "metavar": d.metavar}
    if d.type is bool:
        kwargs |= (
            {"default": d.default, "show_default": True} if d.negatable else {"is_flag": True, "default": d.default}
        )
    else:
        kwargs["default"] = d.default
        kwargs["show_default"] = d.default is not None and d.show_default
        if d.choices:
            kwargs["type"] = click.Choice(d.choices)
        elif d.file:
            kwargs["type"] = click.Path(dir_okay=False)
        else:
            kwargs["type"] = d.type
    return click.option(d.flags, name, **(kwargs | overrides))


def options(names: Iterable[str]):
    """Decorator: the options for every setting in `names`, in that order in --help."""

    def decorate(func):
        for name in reversed(list(names)):
            func = option(name)(func)
        return func

    return decorate


def typed_values(ctx: click.Context, values: dict) -> dict:
    """The settings the user typed on the command line (not Click's defaults), with a described host's name
    resolved to its file (`this` to None, the live host)."""
    from launcher import recipes

    typed = {}
    for name, value in values.items():
        if name in settings.DECLARATIONS and ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            if settings.declaration(name).kind is Kind.HOST:
                value = recipes.host_spec_path(value)
            typed[name] = value
    return typed


def echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2))


def warn(message: str) -> None:
    """Messages while a command works go to stderr, so stdout holds only the result (one object under --json)."""
    click.echo(message, err=True)


@contextlib.contextmanager
def stdout_to_stderr():
    """Send file descriptor 1 to stderr for the duration (libraries that print from C++ too)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (e.g. under CliRunner): nothing to redirect
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
