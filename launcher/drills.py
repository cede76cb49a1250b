"""Fault drills: a real crash on cue, for the fault tests and for anyone who wants to see their own setup survive
one before trusting it with a week of training.

OFFLOAD_LAUNCH_KILL_AT=WHERE:N sends SIGKILL to rank 0 at a named point: `step:N` in the middle of step N (after its
first backward), `checkpoint:N` after DeepSpeed wrote checkpoint N but before its completion marker, `tokenize:0`
(in the command, which tokenizes before anything starts) after the token cache is written but before it is renamed
into place. `cli@WHERE:N` kills the offload-launch command instead, at the same point: what the OOM killer or a CI
job's timeout does to it (job/supervise.py must then take the runner and the ranks down with it).
"""

from __future__ import annotations

import os
import signal
import sys

KILL_AT_ENV = "OFFLOAD_LAUNCH_KILL_AT"
SUPERVISOR_MODULE = "launcher.job.supervise"  # the runner's parent, a child of the command (job/launch.py)


def kill_point(where: str, step: int, rank: int = 0) -> None:
    """SIGKILL rank 0 (or, for `cli@`, the command) when OFFLOAD_LAUNCH_KILL_AT names this point."""
    who, _, point = os.environ.get(KILL_AT_ENV, "").rpartition("@")
    if rank != 0 or point != f"{where}:{step}" or who not in ("", "cli"):
        return
    pid = command_pid() if who == "cli" else os.getpid()
    sys.stderr.write(f"[offload-launch] {KILL_AT_ENV}={who + '@' if who else ''}{point}: killing pid {pid}\n")
    sys.stderr.flush()  # the line is out before the kill (a process killed by its own hand flushes nothing)
    os.kill(pid, signal.SIGKILL)


def command_pid() -> int:
    """The offload-launch command this process belongs to: the parent of job/supervise.py among this process's
    ancestors, else this process itself (the command, tokenizing)."""
    import psutil

    for ancestor in psutil.Process().parents():
        try:
            if SUPERVISOR_MODULE in ancestor.cmdline():
                return ancestor.ppid()
        except psutil.Error:
            continue
    return os.getpid()
