"""No run outlives the command that started it: DeepSpeed's runner and its ranks, stopped when offload-launch dies.

`launch.run` starts DeepSpeed's runner in a session of its own, so that a Ctrl-C reaches the ranks through the tool
(which forwards it, then escalates) and not twice. The price was that a hard kill of the tool (SIGKILL, the OOM
killer, a CI job's timeout, which signals the tool's process group and not this one) left the runner and every rank
running, holding the run folder's lock and the GPUs, for as long as the run had left.

So the session's leader is this small process: `python -m launcher.job.supervise PARENT GRACE FDS -- ARGV...`
starts ARGV (DeepSpeed's runner) in its own process group, passes on the file descriptors FDS (the run folder's
lock), and waits. It ignores SIGINT and SIGTERM itself (the tool signals the whole group; the runner and the ranks
act on them) and exits with the runner's status (128 + N when a signal N ended it). When PARENT, the tool, is gone,
it sends SIGTERM to the group, and SIGKILL after GRACE seconds: the ranks may write what they can, then nothing of
the run is left and the lock is free. Linux's PR_SET_PDEATHSIG tells it at once; polling the parent covers the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

POLL_SECONDS = 0.2
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def command(parent: int, grace: float, fds: tuple[int, ...], argv: list[str]) -> list[str]:
    """The argv that runs `argv` under this supervisor for the process `parent`."""
    fds_arg = ",".join(map(str, fds))
    return [sys.executable, "-m", "launcher.job.supervise", str(parent), str(grace), fds_arg, "--", *argv]


def _on_parent_death(sig: int) -> None:
    """Have the kernel send `sig` to this process when its parent dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def die_with_parent() -> None:
    """A child's preexec_fn: SIGTERM to it when the process that started it dies (job/measuring_process.py)."""
    _on_parent_death(signal.SIGTERM)


def _stop_group(grace: float, runner: subprocess.Popen) -> None:
    """SIGTERM to the group (the runner, its launcher, the ranks), SIGKILL to what is left after `grace` s."""
    group = os.getpgrp()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while runner.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    os.killpg(group, signal.SIGKILL)  # the ranks too, and this process last of all


def _default_signals() -> None:
    """In the runner, before exec: an ignored signal would stay ignored across exec (a handler would not)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def main(args: list[str]) -> int:
    parent, grace, fds = int(args[0]), float(args[1]), tuple(int(fd) for fd in args[2].split(",") if fd)
    argv = args[args.index("--") + 1 :]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # the group's signals are for the runner and the ranks
    orphaned: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, _frame: orphaned.append(signum))
    _on_parent_death(signal.SIGUSR1)
    runner = subprocess.Popen(argv, pass_fds=fds, preexec_fn=_default_signals)
    for fd in fds:  # the runner holds them now; this process must not keep the lock once the runner is gone
        os.close(fd)
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = runner.wait(timeout=POLL_SECONDS)
            return code if code >= 0 else 128 - code
        if orphaned or os.getppid() != parent:
            _stop_group(grace, runner)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
