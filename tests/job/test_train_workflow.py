"""The training workflow's steps: prepare_run (checks, nothing written but the data cache), write_run (the run
folder, started over unless resuming) and launch_run (DeepSpeed's launcher, stood in for here)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from launcher import settings
from launcher.errors import Stopped, UserInputError
from launcher.job import binding, launch, rundir, train
from launcher.job.planning import build_plan
from tests.helpers import REPO, host_path

DEMO = REPO / "launcher" / "demo"
TOO_SMALL_HOST = "gpus: {count: 0}\ncpu_memory: 64MiB\ncpu_cores: 2\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # OUT is the relative "out"


def demo_settings(**typed):
    base = {"model": str(DEMO / "tiny-llama"), "data": str(DEMO / "data" / "train.jsonl"), "output_dir": "out"}
    return settings.layer({**base, "host_spec": host_path("cpu-only"), **typed})


def prepare_run(s):
    return train.prepare_run(build_plan(s), s, user=None, launcher_args=(), warn=[].append)


@pytest.fixture
def prepared():
    """A real run, prepared: it holds the folder's lock until the test releases it."""
    run = prepare_run(demo_settings())
    yield run
    run.lock.release()


def test_a_plan_that_does_not_fit_has_no_job(write_host, tmp_path):
    run = prepare_run(demo_settings(host_spec=write_host(TOO_SMALL_HOST)))
    assert run.job is None and run.plan.chosen is None and run.plan.candidates
    assert not (tmp_path / "out").exists()


def test_dry_run_writes_nothing(tmp_path):
    run = prepare_run(demo_settings(dry_run=True))
    assert list(tmp_path.iterdir()) == []
    assert run.out == Path("out")  # as the user named it: the CLI prints "would write out/plan.json ..."
    assert str(tmp_path / "out" / "run_spec.json") in run.command  # the ranks get the absolute path


def test_a_real_run_only_tokenizes_into_the_cache_and_marks_the_folder(prepared, tmp_path):
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert sorted(p.name for p in prepared.out.iterdir()) == [".offload-launch.lock", "cache", "offload-launch.json"]
    marker = rundir.read_marker(prepared.out)
    assert marker["made"] == ["cache", "offload-launch.json"] and marker["run"] is None


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_prepare_run_refuses_a_folder_it_did_not_make_and_writes_nothing(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run_spec.json").write_text(json.dumps({"model": "/elsewhere/model", "data": "/d"}))
    with pytest.raises(
        UserInputError, match=r"out is not empty and offload-launch did not make it \(it holds run_spec"
    ):
        prepare_run(demo_settings())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["run_spec.json"]  # nothing tokenized, no lock


def finished_run(tmp_path, **typed):
    """A folder as a finished run of `typed` leaves it: marker with the run's identity, a complete checkpoint."""
    with prepare_run(demo_settings(**typed)) as run:
        train.write_run(run, resume=True)
    tag = tmp_path / "out" / "checkpoints" / f"step{run.job.spec.steps}"
    tag.mkdir(parents=True)
    (tag / rundir.COMPLETE_MARKER).write_text(json.dumps({"step": run.job.spec.steps}))
    return run


def test_a_resume_with_another_seq_len_is_refused_before_anything_is_written(tmp_path):
    finished_run(tmp_path, seq_len=64, steps=4)
    before = snapshot(tmp_path)
    with pytest.raises(UserInputError, match=r"cannot resume out from its checkpoint at step 4: --seq-len is 128 "):
        prepare_run(demo_settings(seq_len=128, steps=4))
    assert snapshot(tmp_path) == before
    with prepare_run(demo_settings(seq_len=128, steps=4, resume=False)) as fresh:  # --no-resume: the way forward
        assert fresh.resume_from == 0


def test_more_steps_resume_with_a_note_and_a_finished_run_has_nothing_to_do(tmp_path):
    finished_run(tmp_path, seq_len=64, steps=4)
    (tmp_path / "out" / "run.json").write_text("{}")
    notes: list = []
    s = demo_settings(seq_len=64, steps=6)
    with train.prepare_run(build_plan(s), s, user=None, launcher_args=(), warn=notes.append) as run:
        assert run.resume_from == 4 and not run.finished
    assert any("--steps is 6 (the run was planned for 4): resuming after step 4" in note for note in notes)
    with prepare_run(demo_settings(seq_len=64, steps=4)) as again:
        assert again.finished


def test_a_second_run_into_a_folder_in_use_is_refused(prepared):
    with pytest.raises(UserInputError, match=rf"out is in use by another offload-launch run \(pid {os.getpid()} on "):
        prepare_run(demo_settings())
    prepared.lock.release()
    prepare_run(demo_settings()).lock.release()  # free again once the holder is done


def leave_a_previous_run(out):
    (out / "checkpoints" / "step4").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "notes.txt").write_text("mine\n")


def test_write_run_without_resume_starts_over_deleting_only_what_the_tool_made(prepared):
    train.write_run(prepared, resume=False)
    leave_a_previous_run(prepared.out)
    (prepared.out / "final").mkdir()
    train.write_run(prepared, resume=False)
    names = sorted(p.name for p in prepared.out.iterdir())
    made = ["ds_config.json", "offload-launch.json", "plan.json", "run_spec.json"]
    assert names == sorted([".offload-launch.lock", "cache", "notes.txt", *made])


def test_write_run_with_resume_keeps_the_checkpoints(prepared):
    train.write_run(prepared, resume=True)
    leave_a_previous_run(prepared.out)
    (prepared.out / "checkpoints" / "step4" / rundir.COMPLETE_MARKER).write_text('{"step": 4}')
    resumed = replace(prepared, resume_from=4)
    train.write_run(resumed, resume=True)
    assert (prepared.out / "checkpoints" / "step4").is_dir() and (prepared.out / "metrics.jsonl").exists()
    assert (prepared.out / "run_spec.json").exists()


def stand_in_launch(monkeypatch, code: int) -> list:
    calls = []
    monkeypatch.setattr(launch, "run", lambda argv, env, base, **kw: calls.append((argv, env)) or code)
    return calls


def test_a_failed_launch_stops_with_its_exit_code_and_says_what_a_rerun_does(prepared, monkeypatch):
    calls = stand_in_launch(monkeypatch, 7)
    train.write_run(prepared, resume=False)
    with pytest.raises(Stopped) as err:
        train.launch_run(prepared, stdout_to_stderr=False)
    assert err.value.exit_code == 7 and "exit 7" in str(err.value) and "the log above says why" in str(err.value)
    assert "starts over (no complete checkpoint yet)" in str(err.value)
    assert calls == [(prepared.job.argv, prepared.job.env)]
    stand_in_launch(monkeypatch, 130)
    step2 = prepared.out / "checkpoints" / "step2"
    step2.mkdir(parents=True)
    (step2 / rundir.COMPLETE_MARKER).write_text('{"step": 2}')
    with pytest.raises(Stopped, match=r"stopped by SIGINT \(exit 130\); the same command resumes after step 2"):
        train.launch_run(prepared, stdout_to_stderr=False)
    stand_in_launch(monkeypatch, 247)  # rank 0 SIGKILLed: DeepSpeed's launch.py exits with its -9
    with pytest.raises(Stopped, match=r"a rank was killed \(SIGKILL, exit 247; the OOM killer"):
        train.launch_run(prepared, stdout_to_stderr=False)


def test_a_clean_launch_returns_the_runs_summary(prepared, monkeypatch):
    stand_in_launch(monkeypatch, 0)
    train.write_run(prepared, resume=False)
    (prepared.out / "run.json").write_text(json.dumps({"steps": 100, "final_loss": 1.5}))
    assert train.launch_run(prepared, stdout_to_stderr=True) == {"steps": 100, "final_loss": 1.5}


def numactl_installed(monkeypatch, installed: bool) -> None:

    real = binding.shutil.which
    path = "/usr/bin/numactl" if installed else None
    monkeypatch.setattr(binding.shutil, "which", lambda name, *a, **k: path if name == "numactl" else real(name))


def test_bind_cores_without_numactl_is_refused_before_anything_is_read_or_written(tmp_path, monkeypatch):
    numactl_installed(monkeypatch, False)
    with pytest.raises(UserInputError, match=r"^--bind-cores needs numactl"):
        prepare_run(demo_settings(bind_cores=True, data=str(tmp_path / "not-there.jsonl")))  # before the data
    assert list(tmp_path.iterdir()) == []


def test_prepare_run_says_once_how_the_ranks_are_bound(monkeypatch):
    s = demo_settings(dry_run=True, zero_stage="2", offload_optimizer="cpu")
    for installed, said in ((True, "binding each rank to its share of the cores"), (False, "installing numactl")):
        numactl_installed(monkeypatch, installed)
        notes: list = []
        run = train.prepare_run(build_plan(s), s, user=None, launcher_args=(), warn=notes.append)
        assert [note for note in notes if "numactl" in note] == [next(n for n in notes if said in n)]
        assert ("--bind_cores_to_rank" in run.command) is installed


def test_a_resume_keeps_the_checkpoints_strategy_where_the_plan_chooses(tmp_path):
    """The plan may choose another strategy today (a finished run calibrated it, CI found that): the same command
    must still resume, so what the user left at "auto" follows the checkpoint; what they typed does not."""
    finished_run(tmp_path, steps=4, zero_stage="3", offload_optimizer="cpu", offload_param="cpu")
    assert build_plan(demo_settings(steps=6)).chosen.strategy.zero_stage != 3  # today's plan differs
    kept, said = train.keep_checkpoint_strategy(demo_settings(steps=6))
    assert (kept.zero_stage, kept.offload_optimizer, kept.offload_param) == ("3", "cpu", "cpu")
    assert said == (
        "resuming out after step 4: keeping its checkpoint's --zero-stage 3, --offload-optimizer cpu, "
        "--offload-param cpu, --precision bf16 (--no-resume plans afresh)"
    )
    with prepare_run(kept) as run:
        assert run.resume_from == 4 and run.plan.chosen.strategy.zero_stage == 3
    typed, _ = train.keep_checkpoint_strategy(demo_settings(steps=6, zero_stage="1"))
    assert typed.zero_stage == "1" and typed.offload_optimizer == "auto"  # stage 1 with param->cpu contradicts
    with pytest.raises(UserInputError, match=r"--zero-stage is 1 \(the checkpoint's run used 3\)"):
        prepare_run(typed)
    fresh = demo_settings(steps=6, resume=False)
    assert train.keep_checkpoint_strategy(fresh) == (fresh, None)
