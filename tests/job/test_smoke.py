"""Smoke mode: the report and its exit codes, the checks the training processes leave, the truncated model,
and the smoke workflow's steps up to the launch (which is never reached or is stood in for here)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from transformers import Qwen2Config

from launcher import settings
from launcher.errors import UserInputError
from launcher.job import launch, rundir, smoke, smoke_run
from launcher.job.smoke import CHECKS, EXIT_CODES, Check, SmokeReport
from tests.helpers import REPO, host_path, save_config

DEMO_MODEL = REPO / "launcher" / "demo" / "tiny-llama"


def report(*checks: Check) -> SmokeReport:
    return SmokeReport(model="m", strategy="ZeRO-1", layers=None, full_model=None, checks=list(checks))


def ok(name: str) -> Check:
    return Check(name, True, "fine")


def write_recorded(out, *checks: Check) -> None:
    (out / smoke.RESULT_FILE).write_text(json.dumps({"checks": [asdict(c) for c in checks]}))


@pytest.fixture
def launched(monkeypatch):
    """Stands in for launch.run: records every call (none is expected to reach a process)."""
    calls = []
    monkeypatch.setattr(launch, "run", lambda argv, *a, **kw: calls.append(argv) or 0)
    return calls


@pytest.fixture
def smoke_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def make(**typed):
        base = {"model": str(DEMO_MODEL), "host_spec": host_path("cpu-only"), "output_dir": "out", "smoke": True}
        return settings.layer({**base, **typed}, mode=smoke_run.MODE_DEFAULTS)

    return make


# ------------------------------------------------------------------------------------------ the report


def test_exit_codes_follow_the_check_order():
    assert EXIT_CODES["config"] == 10 and EXIT_CODES["timeout"] == 17 and EXIT_CODES["run"] == 18
    assert [EXIT_CODES[name] for name in CHECKS] == list(range(10, 19))


def test_the_earliest_failed_check_decides_the_exit_code():
    r = report(ok("config"), Check("run", False, "exit 1"), Check("memory", False, "2x"), Check("loss", None, "-"))
    assert r.failed.name == "memory" and r.exit_code == 14
    assert report(ok("config"), ok("data")).failed is None and report().exit_code == 0


def test_to_json_has_the_documented_keys():
    r = report(ok("config"), Check("data", False, "too small"), Check("engine", None, "not run"))
    j = r.to_json()
    assert set(j) == {"passed", "exit_code", "failed_check", "model", "strategy", "layers", "full_model", "checks"}
    assert (j["passed"], j["exit_code"], j["failed_check"]) == (False, 11, "data")
    assert set(j["checks"][0]) == {"name", "passed", "status", "message", "seconds", "details"}
    assert [c["status"] for c in j["checks"]] == ["pass", "FAIL", "skip"]


def test_read_checks_tolerates_a_missing_or_corrupt_file(tmp_path):
    assert smoke.read_checks(tmp_path) == []
    for text in ('{"checks": [{"name": "loss"', '{"other": 1}', '{"checks": [{"nom": "loss"}]}', "[]"):
        (tmp_path / smoke.RESULT_FILE).write_text(text)
        assert smoke.read_checks(tmp_path) == []
    write_recorded(tmp_path, ok("engine"), Check("loss", False, "nan", 1.5, {"losses": [1.0]}))
    assert smoke.read_checks(tmp_path) == [ok("engine"), Check("loss", False, "nan", 1.5, {"losses": [1.0]})]


def test_finish_lists_every_check_and_what_stopped_the_rest():
    r = smoke_run.finish(report(ok("config"), Check("data", False, "too small")))
    assert [c.name for c in r.checks] == list(CHECKS)
    assert all(c.passed is None and c.message == "not run: data failed first" for c in r.checks[2:])


# ------------------------------------------------------------------------------------------ after the launch


def test_exit_124_is_a_failed_timeout_check(tmp_path):
    write_recorded(tmp_path, ok("engine"))
    r = report(ok("config"), ok("data"))
    smoke_run._run_checks(r, tmp_path, 124, 61.0, 1.0)  # launch.run after --smoke-timeout
    timeout = next(c for c in r.checks if c.name == "timeout")
    assert timeout.passed is False and "stopped after 1 min (--smoke-timeout)" in timeout.message
    assert next(c for c in r.checks if c.name == "loss").passed is None  # not reached, not failed
    assert smoke_run.finish(r).exit_code == 17


def test_a_nonzero_exit_is_a_failed_run_check(tmp_path):
    write_recorded(tmp_path, *(ok(name) for name in smoke_run.RUN_CHECKS))
    r = report(ok("config"), ok("data"))
    smoke_run._run_checks(r, tmp_path, 1, 5.0, 15.0)
    assert [c.name for c in r.checks] == list(CHECKS)
    assert r.checks[-2].passed is True and r.checks[-1].passed is False and "exited 1" in r.checks[-1].message
    assert r.exit_code == 18


def test_a_recorded_failure_outranks_the_exit_code(tmp_path):
    write_recorded(tmp_path, ok("engine"), Check("loss", False, "loss rose"))
    r = report(ok("config"), ok("data"))
    smoke_run._run_checks(r, tmp_path, 1, 5.0, 15.0)
    assert r.failed.name == "loss" and r.exit_code == 13


def test_a_clean_exit_passes_the_timeout_and_run_checks(tmp_path):
    write_recorded(tmp_path, *(ok(name) for name in smoke_run.RUN_CHECKS))
    r = report(ok("config"), ok("data"))
    smoke_run._run_checks(r, tmp_path, 0, 5.0, 15.0)
    assert all(c.passed for c in r.checks) and r.exit_code == 0 and len(r.checks) == len(CHECKS)


# ------------------------------------------------------------------------------------------ the model


def test_default_lr_shrinks_with_the_width_above_256():
    assert smoke.default_lr(64) == smoke.default_lr(256) == pytest.approx(1e-3)
    assert smoke.default_lr(512) == pytest.approx(5e-4)
    assert smoke.default_lr(4096) == pytest.approx(6.25e-5)


@pytest.fixture
def qwen_dir(tmp_path):
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        max_window_layers=3,
    )
    return save_config(config, tmp_path / "qwen")


def test_truncate_model_keeps_the_shapes_and_cuts_per_layer_lists(qwen_dir, tmp_path):
    dest, full = smoke.truncate_model(str(qwen_dir), 2, tmp_path / "cut")
    before, after = (json.loads((d / "config.json").read_text()) for d in (qwen_dir, dest))
    assert full == 4 and after["num_hidden_layers"] == 2
    shapes = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_key_value_heads")
    assert {k: after[k] for k in shapes} == {k: before[k] for k in shapes}
    assert after["layer_types"] == before["layer_types"][:2] and len(before["layer_types"]) == 4
    assert after["max_window_layers"] == 2


@pytest.mark.parametrize("layers", [4, 9, 0])
def test_truncate_model_refuses_a_layer_count_it_cannot_cut_to(qwen_dir, tmp_path, layers):
    with pytest.raises(UserInputError, match=f"--smoke-layers {layers}: pass 1 to 3") as err:
        smoke.truncate_model(str(qwen_dir), layers, tmp_path / "cut")
    assert "\n" not in str(err.value) and not (tmp_path / "cut").exists()


def test_tokenizer_source():
    assert smoke.tokenizer_source("./model", "./tok") == "./tok"
    assert smoke.tokenizer_source("./model", None) == "./model"
    assert smoke.tokenizer_source("meta-llama/Llama-2-7b", None) == "meta-llama/Llama-2-7b-hf"  # bundled alias


# ------------------------------------------------------------------------------------------ run_smoke


def test_data_too_small_for_one_batch_fails_the_data_check_before_launch(smoke_settings, tmp_path, launched):
    (tmp_path / "small.jsonl").write_text(json.dumps({"text": "ZeRO-3 partitions the parameters across ranks."}))
    s = smoke_settings(data="small.jsonl", micro_batch=4, seq_len=8)
    r = smoke_run.run_smoke(s, user=None, launcher_args=(), warn=[].append)
    assert r.exit_code == 11 and launched == []
    assert "one batch needs 4: add data" in r.failed.message and r.strategy == "ZeRO-1"
    assert [c.status for c in r.checks] == ["pass", "FAIL"] + ["skip"] * 7
    assert not (tmp_path / "out" / "run_spec.json").exists()


def test_run_smoke_refuses_a_single_step(smoke_settings, launched):
    s = smoke_settings(data=str(REPO / "launcher" / "demo" / "data" / "train.jsonl"), steps=1)
    with pytest.raises(UserInputError, match="--steps of at least 2"):
        smoke_run.run_smoke(s, user=None, launcher_args=(), warn=[].append)
    assert launched == []


def test_run_smoke_refuses_a_training_runs_folder(smoke_settings, tmp_path, launched):
    rundir.claim(tmp_path / "out", "train", ("cache",))
    s = smoke_settings(data=str(REPO / "launcher" / "demo" / "data" / "train.jsonl"))
    with pytest.raises(UserInputError, match="holds a training run"):
        smoke_run.run_smoke(s, user=None, launcher_args=(), warn=[].append)
    assert launched == [] and [p.name for p in (tmp_path / "out").iterdir()] == [rundir.MARKER_FILE]


def test_run_smoke_refuses_a_folder_it_did_not_make(smoke_settings, tmp_path, launched):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run_spec.json").write_text(json.dumps({"model": str(DEMO_MODEL), "smoke": False}))
    s = smoke_settings(data=str(REPO / "launcher" / "demo" / "data" / "train.jsonl"))
    with pytest.raises(UserInputError, match="not empty and offload-launch did not make it"):
        smoke_run.run_smoke(s, user=None, launcher_args=(), warn=[].append)
    assert launched == [] and [p.name for p in (tmp_path / "out").iterdir()] == ["run_spec.json"]
