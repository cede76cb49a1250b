"""A hard kill of offload-launch takes the run with it (launcher/job/supervise.py): real processes, real signals.

The "runner" here is a Python process that starts a "rank" (a grandchild) and holds a folder's flock, as
DeepSpeed's runner holds the run folder's lock; the "CLI" calls launch.run on it and is SIGKILLed."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from launcher.job import launch

RUNNER = textwrap.dedent(
    """
    import subprocess, sys, time
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(sys.argv[1], "w").write(f"{rank.pid}\\n")
    time.sleep(120)
    """
)
CLI = textwrap.dedent(
    """
    import fcntl, os, sys
    from launcher.job import launch
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    sys.exit(launch.run([sys.executable, "-c", sys.argv[2], sys.argv[3]], {}, dict(os.environ), inherit_fds=(fd,)))
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(path: Path, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_killed_cli_takes_the_runner_and_its_ranks_with_it_and_frees_the_lock(tmp_path):
    lock, pids = tmp_path / "run.lock", tmp_path / "pids"
    cli = subprocess.Popen([sys.executable, "-c", CLI, str(lock), RUNNER, str(pids)])
    try:
        rank = int(_wait_for(pids))
        supervisor = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[3])  # the rank's group
        assert _alive(rank) and _alive(supervisor)
        os.kill(cli.pid, signal.SIGKILL)  # as the OOM killer or a CI timeout would
        cli.wait()
        killed = time.monotonic()
        while (_alive(rank) or _alive(supervisor)) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert not _alive(rank) and not _alive(supervisor), "the run outlived the command by 10 s"
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: the next run can take the folder
        finally:
            os.close(fd)
    finally:
        cli.kill()


def test_the_runners_status_comes_back_through_the_supervisor():
    assert launch.run([sys.executable, "-c", "import sys; sys.exit(3)"], {}, dict(os.environ)) == 3
    killed_by_term = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert launch.run([sys.executable, "-c", killed_by_term], {}, dict(os.environ)) == 128 + signal.SIGTERM


def test_the_runner_gets_the_signals_the_supervisor_ignores():
    """Ignored signals stay ignored across exec: the runner must still stop on Ctrl-C and SIGTERM."""
    check = "import signal, sys; sys.exit(0 if signal.getsignal(signal.SIGINT) is signal.default_int_handler else 5)"
    assert launch.run([sys.executable, "-c", check], {}, dict(os.environ)) == 0
