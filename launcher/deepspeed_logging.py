"""Importing DeepSpeed from the offload-launch process (the ranks import it as they like).

DeepSpeed's logger binds a handler to the `sys.stdout` it sees when `deepspeed` is first imported, and later
writes warnings through it (on a CPU-only host: "Setting accelerator to CPU ..."). Under --json stdout holds
exactly one JSON object, so every import of DeepSpeed in this process goes through `import_deepspeed()`:
import-time lines are dropped, and the logger's handlers are pointed at stderr, where library logging belongs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys

DEEPSPEED_LOGGER = "DeepSpeed"


class _CurrentStderr:
    """Whatever sys.stderr is when a line is written (a test runner may swap it between commands)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def import_deepspeed():
    """`import deepspeed`, with its log lines on stderr instead of stdout, and only errors (as before this
    module: DeepSpeed's info and warning lines are noise in a plan)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import deepspeed
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    logger.setLevel(logging.ERROR)
    for handler in logger.handlers:
        if type(handler) is logging.StreamHandler and not isinstance(handler.stream, _CurrentStderr):  # DeepSpeed's own
            handler.stream = _CurrentStderr()  # not setStream(): that flushes the stream import bound, maybe gone
    return deepspeed
