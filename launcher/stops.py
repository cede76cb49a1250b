"""Ctrl-C and SIGTERM that are never lost.

Python raises KeyboardInterrupt (and our handler raises Terminated) wherever the program happens to be. When
that is inside a finalizer (`__del__`, a weakref callback, run by the garbage collector at any allocation)
Python cannot propagate it: it prints "Exception ignored in ..." with a traceback and carries on, so a Ctrl-C
during tokenization once trained the whole run and exited 0 (CI, 2026-12-02: the signal landed in the
`regex` package's `Group.__del__` while transformers compiled its patterns).

`install()` sets the handlers and an unraisable-exception hook that remembers such a swallowed stop instead
of printing a traceback; `honour()` raises it again. The CLI calls `honour()` before each step that commits
work (writing the run's files, starting DeepSpeed's launcher), so a stop is at worst acted on a moment late.
"""

from __future__ import annotations

import signal
import sys


class Terminated(BaseException):
    """SIGTERM, raised where the program is so that it unwinds like a Ctrl-C (finally blocks run)."""


_swallowed: list[BaseException] = []


def install() -> None:
    """SIGINT raises KeyboardInterrupt (unless the parent started us with it ignored, as a script's
    background job is: that stays as Python keeps it), SIGTERM raises Terminated; a swallowed one is kept."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _terminate)
    default_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
            _swallowed.append(unraisable.exc_value)
        else:
            default_hook(unraisable)

    sys.unraisablehook = hook


def honour() -> None:
    """Raise a stop that arrived while a finalizer ran (and was swallowed there); nothing otherwise."""
    if _swallowed:
        stop = _swallowed.pop(0)
        _swallowed.clear()
        raise stop


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt()


def _terminate(_signum, _frame) -> None:
    raise Terminated()
