"""The run folder: its default name, the run's own NVMe swap folder, who owns it, and starting it over."""

from __future__ import annotations

import json

import pytest

from launcher import settings
from launcher.errors import UserInputError
from launcher.job import rundir
from launcher.job.spec import RunSpec
from launcher.plan.build import build_plan
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


def test_check_owner_refuses_another_model_or_data(tmp_path):
    write_spec(tmp_path / "out")
    with pytest.raises(UserInputError, match=r"holds a run of model '/m/a', not '/m/b'.*--force"):
        rundir.check_owner(tmp_path / "out", "/m/b", "/d/x", force=False)
    with pytest.raises(UserInputError, match=r"holds a run of data '/d/x', not '/d/y'.*--force"):
        rundir.check_owner(tmp_path / "out", "/m/a", "/d/y", force=False)


def test_check_owner_accepts_the_same_run_a_new_folder_and_force(tmp_path):
    write_spec(tmp_path / "out")
    rundir.check_owner(tmp_path / "out", "/m/a", "/d/x", force=False)
    rundir.check_owner(tmp_path / "out", "/m/b", "/d/y", force=True)
    rundir.check_owner(tmp_path / "new", "/m/b", "/d/y", force=False)


def test_a_smoke_test_refuses_a_training_runs_folder(tmp_path):
    write_spec(tmp_path / "train")
    with pytest.raises(UserInputError, match="holds a training run.*--force"):
        rundir.check_not_a_training_run(tmp_path / "train", force=False)
    rundir.check_not_a_training_run(tmp_path / "train", force=True)


def test_a_smoke_test_accepts_a_smoke_runs_folder_and_an_empty_one(tmp_path):
    write_spec(tmp_path / "smoke", smoke=True)
    rundir.check_not_a_training_run(tmp_path / "smoke", force=False)
    (tmp_path / "empty").mkdir()
    rundir.check_not_a_training_run(tmp_path / "empty", force=False)


def test_start_over_removes_results_and_keeps_the_rest(tmp_path):
    out = tmp_path / "out"
    for folder in ("checkpoints/step2", "final", "cache"):
        (out / folder).mkdir(parents=True)
    (out / "cache" / "blocks.npy").write_bytes(b"x")
    for name in ("metrics.jsonl", "run.json", "notes.txt"):
        (out / name).write_text("{}\n")
    write_spec(out)
    rundir.start_over(out)
    assert sorted(p.name for p in out.iterdir()) == ["cache", "notes.txt", "run_spec.json"]
    assert (out / "cache" / "blocks.npy").exists() and json.loads((out / "run_spec.json").read_text())
