"""Measuring in a child process (launcher/job/measuring_process.py): its lines reach the caller's log, its domain
error is the caller's one-line error, and a crash is one line too. Real child processes."""

from __future__ import annotations

import pytest

from launcher.errors import OffloadLaunchError, UserInputError
from launcher.job import measuring_process


def test_a_domain_error_in_the_child_is_the_same_one_line_error_here(tmp_path):
    request = {
        "action": "fill",
        "model": str(tmp_path / "nope"),
        "nvme_path": None,
        "trust_remote_code": False,
        "workload": {"micro_batch": 1, "seq_len": 32, "activation_checkpointing": False},
        "ranks": 1,
    }
    said: list[str] = []
    with pytest.raises(UserInputError, match=r"model path .*nope does not exist"):
        measuring_process._run(request, said.append)
    assert not any("Traceback" in line for line in said)


def test_a_crash_in_the_child_is_one_line_naming_its_exit(tmp_path):
    said: list[str] = []
    with pytest.raises(OffloadLaunchError, match=r"measuring this host failed \(exit 1\): KeyError"):
        measuring_process._run({"action": "fill"}, said.append)
    assert said  # its traceback went to the log, line by line
