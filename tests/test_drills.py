"""launcher/drills.py: the kill points fire only where named, on rank 0, at the rank or at the command."""

from __future__ import annotations

import signal
import subprocess
import sys

from launcher import drills
from launcher.drills import KILL_AT_ENV, kill_point


def test_kill_point_kills_rank_0_only_at_the_named_point(monkeypatch):
    kills = []
    monkeypatch.setattr(drills.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setenv(KILL_AT_ENV, "checkpoint:4")
    kill_point("step", 4, rank=0)
    kill_point("checkpoint", 2, rank=0)
    kill_point("checkpoint", 4, rank=1)
    assert kills == []
    kill_point("checkpoint", 4, rank=0)
    assert kills == [(drills.os.getpid(), signal.SIGKILL)]
    monkeypatch.setenv(KILL_AT_ENV, "someone@checkpoint:4")  # an unknown target is no cue
    kill_point("checkpoint", 4, rank=0)
    monkeypatch.delenv(KILL_AT_ENV)
    kill_point("checkpoint", 4, rank=0)
    assert len(kills) == 1


def test_the_command_is_the_parent_of_the_supervisor_above_the_rank():
    """cli@ kills the command: from a process started under `python -m launcher.job.supervise` (as DeepSpeed's
    runner and its ranks are), the supervisor's parent; from the command itself, itself."""
    script = "from launcher.drills import command_pid; print(command_pid())"
    ranks = [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {script!r}])"]
    proc = subprocess.run(
        [sys.executable, "-m", drills.SUPERVISOR_MODULE, str(drills.os.getpid()), "1", "", "--", *ranks],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert int(proc.stdout) == drills.os.getpid()  # this test process started the supervisor: the "command"
    assert drills.command_pid() == drills.os.getpid()
