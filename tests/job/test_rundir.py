"""The run folder: its default name, the run's own NVMe swap folder, who owns it, and starting it over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import settings
from launcher.errors import UserInputError
from launcher.job import resume, rundir
from launcher.job.planning import build_plan
from launcher.job.spec import RunSpec
from tests.helpers import REPO, host_path

MODEL = REPO / "launcher" / "demo" / "tiny-llama"
NVME_HOST = "gpus: {count: 0}\ncpu_memory: 24GiB\ncpu_cores: 2\nnvme: {path: /mnt/described, free: 1TB}\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def plan_for(host: str, **typed):
    return build_plan(settings.layer({"model": str(MODEL), "host_spec": host, **typed}))


def write_spec(folder, **fields):
    folder.mkdir(exist_ok=True)
    RunSpec(output_dir=str(folder), model="/m/a", data="/d/x", seq_len=64, steps=3, **fields).dump(
        folder / "run_spec.json"
    )


def test_default_output_dir_is_the_models_last_name():
    assert rundir.default_output_dir("meta-llama/Llama-2-7b") == "runs/Llama-2-7b"
    assert rundir.default_output_dir("./models/tiny/") == "runs/tiny"


def test_swap_dir_is_stable_per_output_dir_however_spelled(tmp_path):
    mine = rundir.swap_dir("/nvme", "out")
    assert mine == rundir.swap_dir("/nvme", str(tmp_path / "out")) == rundir.swap_dir("/nvme", "./out/")
    assert mine != rundir.swap_dir("/nvme", "other")
    assert mine.startswith("/nvme/" + rundir.SWAP_PREFIX)


def test_run_swap_dir_only_with_nvme_offload(write_host, tmp_path):
    assert rundir.run_swap_dir(plan_for(host_path("cpu-only")), "out") is None
    nvme = dict(zero_stage="3", offload_optimizer="nvme", seq_len=64)
    described = plan_for(write_host(NVME_HOST), **nvme)
    assert rundir.run_swap_dir(described, "out") == rundir.swap_dir("/mnt/described", "out")
    typed = plan_for(write_host(NVME_HOST), nvme_path=str(tmp_path / "drive"), **nvme)
    assert rundir.run_swap_dir(typed, "out") == rundir.swap_dir(str(tmp_path / "drive"), "out")


# ------------------------------------------------------------------------------------------- ownership


def test_a_new_or_empty_folder_is_taken_and_marked(tmp_path):
    for out in (tmp_path / "new", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        assert rundir.check_folder(out, "train", force=False).marker is None
        marker = rundir.claim(out, "train", ("cache",))
        assert marker["made"] == ["cache", rundir.MARKER_FILE] and marker["run"] is None
        assert rundir.read_marker(out) == marker


def test_a_folder_the_tool_did_not_make_is_refused_naming_what_it_holds(tmp_path):
    out = tmp_path / "thesis"
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt"):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("mine")
    refused = r"thesis is not empty and offload-launch did not make it \(it holds a.txt, b.txt, c.txt, d.txt and 1 more"
    with pytest.raises(UserInputError, match=refused):
        rundir.check_folder(out, "train", force=False)
    forced = rundir.check_folder(out, "train", force=True)
    assert forced.marker is None and "beside a.txt" in forced.messages[0]


def test_force_still_refuses_when_a_name_the_tool_writes_holds_somebody_elses_files(tmp_path):
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "thesis.txt").write_text("mine")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "mine.txt").write_text("mine")
    with pytest.raises(UserInputError, match="--force cannot use .*out: checkpoints, final are names offload-launch"):
        rundir.check_folder(out, "train", force=True)


def test_a_run_folder_of_an_earlier_version_is_recognised_but_its_checkpoints_are_not_resumed(tmp_path):
    out = tmp_path / "old"
    write_spec(out)
    (out / "metrics.jsonl").write_text("")
    marker = rundir.check_folder(out, "train", force=False).marker
    assert marker["legacy"] and marker["made"] == ["metrics.jsonl", "run_spec.json"]
    check = resume.resume_changes(None, {"steps": 3}, 2, legacy=True)
    assert "an earlier offload-launch wrote it without recording its settings" in check.problems[0]


def test_a_smoke_test_refuses_a_training_runs_folder_unless_forced(tmp_path):
    out = tmp_path / "train"
    rundir.claim(out, "train", ("cache",))
    with pytest.raises(UserInputError, match="holds a training run.*--force"):
        rundir.check_folder(out, "smoke", force=False)
    rundir.check_folder(out, "smoke", force=True)
    rundir.claim(tmp_path / "smoke", "smoke", ("cache",))
    rundir.check_folder(tmp_path / "smoke", "smoke", force=False)
    rundir.check_folder(tmp_path / "smoke", "train", force=False)  # a smoke folder may become a training run's


def test_start_over_deletes_only_the_results_the_tool_made(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rundir.claim(out, "train", ("cache", *rundir.CONFIG_NAMES, *rundir.RESULT_NAMES))
    for folder in ("checkpoints/step2", "final", "cache"):
        (out / folder).mkdir(parents=True)
    (out / "cache" / "blocks.npy").write_bytes(b"x")
    for name in ("metrics.jsonl", "run.json"):
        (out / name).write_text("{}\n")
    write_spec(out)
    assert rundir.start_over(out) == list(rundir.RESULT_NAMES)
    assert sorted(p.name for p in out.iterdir()) == ["cache", "notes.txt", rundir.MARKER_FILE, "run_spec.json"]


def test_a_name_that_was_there_before_the_tool_is_never_claimed_nor_deleted(tmp_path):
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "thesis.txt").write_text("mine")
    rundir.claim(out, "train", rundir.RESULT_NAMES)
    assert "final" not in rundir.read_marker(out)["made"]
    rundir.start_over(out)
    assert (out / "final" / "thesis.txt").read_text() == "mine"


def test_discard_incomplete_removes_only_the_tools_checkpoint_folders(tmp_path):
    for name in ("step2", "step3", "mine"):
        (tmp_path / name).mkdir()
    (tmp_path / "step2" / rundir.COMPLETE_MARKER).write_text('{"step": 2}')
    assert rundir.discard_incomplete(tmp_path) == ["step3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "step2"]


# ------------------------------------------------------------------------------------------- the lock


def test_the_lock_refuses_a_second_holder_naming_the_first_and_frees_on_release(tmp_path):
    out = tmp_path / "out"
    with (
        rundir.FolderLock(out),
        pytest.raises(UserInputError, match=rf"out is in use by another offload-launch run \(pid {os.getpid()} on"),
    ):
        rundir.FolderLock(out).acquire()
    rundir.FolderLock(out).acquire().release()


def test_a_dead_holders_lock_is_no_obstacle(tmp_path):
    """A process that held the lock and was SIGKILLed: the kernel dropped its flock with it."""
    out = tmp_path / "out"
    acquire = f"from launcher.job.rundir import FolderLock; FolderLock({str(out)!r}).acquire()"
    code = f"import os; {acquire}; os.kill(os.getpid(), 9)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO)
    assert proc.returncode == -9 and json.loads((out / rundir.LOCK_FILE).read_text())["pid"] != os.getpid()
    rundir.FolderLock(out).acquire().release()


def test_leave_no_trace_takes_back_a_new_folder_whose_run_never_started(tmp_path):
    out = tmp_path / "out"
    lock = rundir.FolderLock(out).acquire()
    rundir.claim(out, "train", ("cache",))
    (out / "cache").mkdir()
    rundir.leave_no_trace(out, created=lock.created)
    lock.release()
    assert not out.exists()


def test_node_local_checkpoints_resume_from_the_newest_step_every_node_folder_has(tmp_path):
    root = Path(rundir.node_local_root(str(tmp_path / "local"), tmp_path / "out"))
    assert root.parent == tmp_path / "local" and root.name.startswith(rundir.SWAP_PREFIX)
    assert rundir.node_local_root(None, tmp_path / "out") is None
    assert rundir.newest_checkpoint_step(tmp_path / "out", str(root)) == 0  # nothing written yet

    def complete(node: int, step: int) -> None:
        (root / f"node{node}" / f"step{step}").mkdir(parents=True)
        (root / f"node{node}" / f"step{step}" / rundir.COMPLETE_MARKER).write_text(json.dumps({"step": step}))

    complete(0, 2), complete(1, 2), complete(0, 4)  # node 1 died before marking step 4
    assert rundir.newest_checkpoint_step(tmp_path / "out", str(root)) == 2
    complete(1, 4)
    assert rundir.newest_checkpoint_step(tmp_path / "out", str(root)) == 4
    assert rundir.newest_checkpoint_step(tmp_path / "out") == 0  # OUT/checkpoints is another place


def test_report_claims_its_image_and_never_replaces_somebody_elses(tmp_path):
    out = tmp_path / "out"
    rundir.claim(out, "train", ("cache",))
    rundir.claim_name(out, rundir.REPORT_FILE)
    assert rundir.REPORT_FILE in rundir.read_marker(out)["made"]
    theirs = tmp_path / "theirs"
    rundir.claim(theirs, "train", ("cache",))
    (theirs / rundir.REPORT_FILE).write_bytes(b"mine")
    with pytest.raises(UserInputError, match="report.png was not written by offload-launch; pass --out"):
        rundir.claim_name(theirs, rundir.REPORT_FILE)


def test_the_launcher_keeps_the_lock_when_offload_launch_itself_is_killed(tmp_path):
    """DeepSpeed's runner runs in its own session and outlives a SIGKILLed offload-launch: it inherits the lock,
    so a second run cannot start beside the ranks that are still training."""
    out = tmp_path / "out"
    script = (
        "import os, sys\n"
        "from launcher.job import launch\n"
        "from launcher.job.rundir import FolderLock\n"
        f"lock = FolderLock({str(out)!r}).acquire()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"  # the child stands in for the CLI's wait; the parent is then killed below
        "    runner = [sys.executable, '-c', 'import time; time.sleep(4)']\n"
        "    launch.run(runner, {}, dict(os.environ), inherit_fds=(lock.fd,))\n"
        "    os._exit(0)\n"
        "import time; time.sleep(1); os.kill(pid, 9); os.kill(os.getpid(), 9)\n"
    )  # fmt: skip
    subprocess.run([sys.executable, "-c", script], cwd=REPO)
    with pytest.raises(UserInputError, match="is in use by another offload-launch run"):
        rundir.FolderLock(out).acquire()  # the "runner" (sleep 4) still holds it
    time.sleep(4)
    rundir.FolderLock(out).acquire().release()


def test_an_empty_folder_at_a_tool_name_is_ready_for_the_run_not_somebody_elses(tmp_path):
    """e.g. OUT/checkpoints made beforehand as the mount point of another disk."""
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    assert rundir.check_folder(out, "train", force=False).marker is None
    assert "checkpoints" in rundir.claim(out, "train", rundir.RESULT_NAMES)["made"]
