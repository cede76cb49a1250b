"""A killed run's /dev/shm: DeepSpeed's CPU communication maps one 66 MiB allreduce buffer per rank in /dev/shm
and never unlinks it. A launcher that returns removes its run's; a run killed outright leaves them, and the next
real run frees them before its /dev/shm check (owners gone: no live process maps them)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from launcher.job.launch import free_port
from tests.e2e.conftest import REPO, launch_args, run_launch

pytestmark = pytest.mark.e2e

SHM = Path("/dev/shm")
OPTIONS = ("--num-gpus", "2", "--steps", "3", "--zero-stage", "2")
BUFFERS_WITHIN_SECONDS = 600  # a fresh machine JIT-compiles DeepSpeed's shm_comm op first
WORKSPACE_BYTES = 2 * 4 + 2 * 2**20 + 2 * 32 * 2**20  # shm.cpp's struct allreduce_workspace: 66 MiB and 8 bytes


def written(pattern: str) -> list[Path]:
    """The buffers both ranks have written in full (shm_open creates the file, a write() then fills it)."""
    sizes = []
    for path in SHM.glob(pattern):
        with contextlib.suppress(OSError):
            sizes.append((path, path.stat().st_size))
    return sorted(path for path, size in sizes if size == WORKSPACE_BYTES)


def kill_everything(process: subprocess.Popen) -> None:
    """SIGKILL offload-launch's process group, and the session it starts DeepSpeed's launcher in (its ranks):
    a run killed as the OOM killer, `docker kill` or a scheduler kill it. Killing offload-launch alone leaves
    DeepSpeed's launcher and the ranks running on their own (they are in their own session)."""
    tree = psutil.Process(process.pid).children(recursive=True)
    groups = {process.pid}
    for child in tree:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(child.pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    process.wait(timeout=60)
    psutil.wait_procs(tree, timeout=60)


def test_buffers_a_killed_run_left_are_freed_by_the_next_run(tiny_model, tiny_data, tmp_path):
    port = free_port()
    ours = f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"
    out = tmp_path / "run"
    args = launch_args(tiny_model, tiny_data, out, *OPTIONS, "--master-port", str(port))
    process = subprocess.Popen(
        args,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + BUFFERS_WITHIN_SECONDS
        while len(written(ours)) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, f"the run ended (exit {process.returncode}) before both ranks mapped a buffer"
    finally:
        kill_everything(process)

    left = sorted(SHM.glob(ours))
    assert [path.name[-2:] for path in left] == ["_0", "_1"], left  # one per rank, left for good
    assert written(ours) == left

    done = run_launch(tiny_model, tiny_data, out, *OPTIONS)  # the same command again, on another free port
    assert not any(path.exists() for path in left)
    freed = re.search(
        r"freed ([\d.]+) MiB of /dev/shm: (\d+) DeepSpeed allreduce buffers left by killed runs", done.stderr
    )
    assert freed, done.stderr[-3000:]
    # at least this run's two 66 MiB buffers (other killed runs' on this machine are freed too)
    assert float(freed[1]) >= 132.0 and int(freed[2]) >= 2
