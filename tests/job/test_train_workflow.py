"""The training workflow's steps: prepare_run (checks, nothing written but the data cache), write_run (the run
folder, started over unless resuming) and launch_run (DeepSpeed's launcher, stood in for here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import settings
from launcher.errors import Stopped, UserInputError
from launcher.job import launch, train
from launcher.plan.build import build_plan
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
    return prepare_run(demo_settings())


def test_a_plan_that_does_not_fit_has_no_job(write_host, tmp_path):
    run = prepare_run(demo_settings(host_spec=write_host(TOO_SMALL_HOST)))
    assert run.job is None and run.plan.chosen is None and run.plan.candidates
    assert not (tmp_path / "out").exists()


def test_dry_run_writes_nothing(tmp_path):
    run = prepare_run(demo_settings(dry_run=True))
    assert list(tmp_path.iterdir()) == []
    assert run.out == Path("out")  # as the user named it: the CLI prints "would write out/plan.json ..."
    assert str(tmp_path / "out" / "run_spec.json") in run.command  # the ranks get the absolute path


def test_a_real_run_only_tokenizes_into_the_cache(prepared, tmp_path):
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in prepared.out.iterdir()] == ["cache"]


def test_prepare_run_refuses_another_runs_folder(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run_spec.json").write_text(json.dumps({"model": "/elsewhere/model", "data": "/d"}))
    with pytest.raises(UserInputError, match="holds a run of model '/elsewhere/model'"):
        prepare_run(demo_settings())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["run_spec.json"]  # nothing tokenized


def leave_a_previous_run(out):
    (out / "checkpoints" / "step4").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "notes.txt").write_text("mine\n")


def test_write_run_without_resume_starts_the_folder_over(prepared):
    leave_a_previous_run(prepared.out)
    train.write_run(prepared, resume=False)
    names = sorted(p.name for p in prepared.out.iterdir())
    assert names == ["cache", "ds_config.json", "notes.txt", "plan.json", "run_spec.json"]


def test_write_run_with_resume_keeps_the_checkpoints(prepared):
    leave_a_previous_run(prepared.out)
    train.write_run(prepared, resume=True)
    assert (prepared.out / "checkpoints" / "step4").is_dir() and (prepared.out / "metrics.jsonl").exists()
    assert (prepared.out / "run_spec.json").exists()


def stand_in_launch(monkeypatch, code: int) -> list:
    calls = []
    monkeypatch.setattr(launch, "run", lambda argv, env, base, **kw: calls.append((argv, env)) or code)
    return calls


def test_a_failed_launch_stops_with_its_exit_code(prepared, monkeypatch):
    calls = stand_in_launch(monkeypatch, 7)
    train.write_run(prepared, resume=False)
    with pytest.raises(Stopped) as err:
        train.launch_run(prepared, stdout_to_stderr=False)
    assert err.value.exit_code == 7 and "exit 7" in str(err.value)
    assert str(prepared.out / "checkpoints") in str(err.value) and "resume" in str(err.value)
    assert calls == [(prepared.job.argv, prepared.job.env)]


def test_a_clean_launch_returns_the_runs_summary(prepared, monkeypatch):
    stand_in_launch(monkeypatch, 0)
    train.write_run(prepared, resume=False)
    (prepared.out / "run.json").write_text(json.dumps({"steps": 100, "final_loss": 1.5}))
    assert train.launch_run(prepared, stdout_to_stderr=True) == {"steps": 100, "final_loss": 1.5}
