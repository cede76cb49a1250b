"""Domain errors. The core raises these; only the CLI turns them into exit codes and one-line messages."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3


class OffloadLaunchError(Exception):
    """Base class: a problem the user can fix. `str(err)` is the one line shown to them."""

    exit_code = EXIT_BAD_INPUT


class UserInputError(OffloadLaunchError):
    """A flag, file or described host is wrong (exit code 2)."""


class DoesNotFit(OffloadLaunchError):
    """No candidate strategy fits the host (exit code 3). Carries the plan so the table can be shown."""

    exit_code = EXIT_DOES_NOT_FIT

    def __init__(self, message: str, plan: object = None):
        super().__init__(message)
        self.plan = plan


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The closest valid spelling of `word`, for 'did you mean' hints (None when nothing is close)."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


def unknown_key_message(key: str, choices: Iterable[str], where: str) -> str:
    choices = sorted(choices)
    hint = nearest(key, choices)
    tail = f"did you mean '{hint}'?" if hint else f"valid keys: {', '.join(choices)}"
    shown = f"'{key}'" if key.isprintable() else repr(key)  # a key holding a newline stays on one line
    return f"unknown key {shown} in {where}; {tail}"


class Stopped(OffloadLaunchError):
    """A run that stopped for a reason with its own exit code: a host limit (2 or 3), a failed smoke check
    (10-18), or the training processes' own exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
