"""Learning from finished runs: what a run records, what a later plan on the same host makes of it, and that
the plan shows both predictions and says which candidates were calibrated."""

from __future__ import annotations

import json

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import calibration
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from launcher.views import plan_view
from tests.helpers import host_path

PREDICTED = {"passes_seconds": 1.0, "update_seconds": 2.0, "step_seconds": 3.0}


def measured(passes: float, update: float) -> dict:
    return {"passes_seconds": passes, "update_seconds": update, "step_seconds": passes + update}


def test_runs_are_recorded_and_read_back_per_host_and_strategy(tmp_path):
    assert calibration.record(tmp_path, "host-a", "ZeRO-2 + opt->cpu", "m", 1, PREDICTED, measured(1.5, 1.0))
    assert calibration.record(tmp_path, "host-a", "ZeRO-2 + opt->cpu", "m", 1, PREDICTED, measured(2.5, 3.0))
    assert calibration.record(tmp_path, "host-a", "ZeRO-2 + opt->cpu", "m", 1, PREDICTED, measured(2.0, 2.0))
    assert calibration.record(tmp_path, "host-b", "ZeRO-3", "m", 1, PREDICTED, measured(9.0, 9.0))
    factors = calibration.load(tmp_path, "host-a", "m", 1)
    assert set(factors) == {"ZeRO-2 + opt->cpu"}  # another host's runs say nothing about this one
    assert factors["ZeRO-2 + opt->cpu"] == calibration.Factors(passes=2.0, update=1.0, runs=3)  # medians
    calibration.record(tmp_path, "host-a", "ZeRO-2 + opt->cpu", "m", 2, PREDICTED, measured(9.0, 9.0))
    calibration.record(tmp_path, "host-a", "ZeRO-2 + opt->cpu", "other", 1, PREDICTED, measured(9.0, 9.0))
    assert calibration.load(tmp_path, "host-a", "m", 1) == factors  # another world size, another model: not these
    assert calibration.load(tmp_path, "host-a", "m", 2)["ZeRO-2 + opt->cpu"].runs == 1


def test_a_run_without_measured_phases_is_not_recorded_and_a_damaged_line_is_skipped(tmp_path):
    assert not calibration.record(tmp_path, "h", "ZeRO-3", "m", 1, PREDICTED, {"step_seconds": 3.0})
    assert not (tmp_path / calibration.FILE_NAME).exists()
    calibration.record(tmp_path, "h", "ZeRO-3", "m", 1, PREDICTED, measured(1.0, 2.0))
    with open(tmp_path / calibration.FILE_NAME, "a") as handle:
        handle.write('{"host_id": "h", "strategy": \n')  # a run killed mid-write
    assert calibration.load(tmp_path, "h", "m", 1)["ZeRO-3"].runs == 1


def test_runs_predicted_by_another_version_of_the_step_time_model_are_not_used(tmp_path, monkeypatch):
    calibration.record(tmp_path, "h", "ZeRO-3", "m", 1, PREDICTED, measured(5.0, 10.0))
    monkeypatch.setattr(calibration, "MODEL_VERSION", "a later one")
    assert calibration.load(tmp_path, "h", "m", 1) == {}  # its ratios corrected errors this model may not make
    calibration.record(tmp_path, "h", "ZeRO-3", "m", 1, PREDICTED, measured(1.0, 2.0))
    assert calibration.load(tmp_path, "h", "m", 1)["ZeRO-3"] == calibration.Factors(1.0, 1.0, 1)


def test_only_the_most_recent_runs_count(tmp_path):
    for _ in range(calibration.RECENT_RUNS):
        calibration.record(tmp_path, "h", "ZeRO-3", "m", 1, PREDICTED, measured(5.0, 10.0))
    for _ in range(calibration.RECENT_RUNS):
        calibration.record(tmp_path, "h", "ZeRO-3", "m", 1, PREDICTED, measured(1.0, 2.0))
    assert calibration.load(tmp_path, "h", "m", 1)["ZeRO-3"] == calibration.Factors(1.0, 1.0, calibration.RECENT_RUNS)


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def test_the_plan_ranks_by_the_calibrated_step_and_shows_both(llama7b):
    host = load_host_spec(host_path("1x-rtx4090-24g-192g"))
    first = make_plan(llama7b, host, Workload(), resolve_rates(host))
    assert first.chosen.strategy.label == "ZeRO-2 + opt->cpu"
    # finished runs of the chosen strategy took three times the predicted update: the runner-up overtakes it
    slow = {"ZeRO-2 + opt->cpu": calibration.Factors(passes=1.0, update=3.0, runs=4)}
    plan = make_plan(llama7b, host, Workload(), resolve_rates(host), calibration=slow)
    zero2 = next(c for c in plan.candidates if c.strategy.label == "ZeRO-2 + opt->cpu")
    t = zero2.timing
    assert t.calibrated_step_seconds == pytest.approx(t.passes_seconds + 3 * t.update_seconds)
    assert t.step_seconds == next(c for c in first.candidates if c.strategy == zero2.strategy).timing.step_seconds
    # uncalibrated ZeRO-3 with the optimizer offloaded (all of it, or all but the share the GPU has room for) is now
    # predicted faster
    assert plan.chosen.strategy.label.startswith("ZeRO-3 + opt->cpu")
    assert any(r.startswith("calibrated by finished runs") and "ZeRO-2 + opt->cpu" in r for r in plan.reasons)
    estimates = json.loads(json.dumps(zero2.to_json()))["estimates"]
    assert estimates["step_seconds"] == t.step_seconds  # first principles, beside
    assert estimates["calibrated_step_seconds"] == t.calibrated_step_seconds
    assert estimates["calibration"] == {"passes": 1.0, "update": 3.0, "runs": 4}
    text = plan_view.plan_text(plan, None)
    assert f"{t.calibrated_step_seconds:.3g}c" in text and "c: calibrated by finished runs" in text


def test_the_chosen_calibrated_step_says_by_how_many_runs(llama7b):
    host = load_host_spec(host_path("1x-rtx4090-24g-192g"))
    factors = {"ZeRO-2 + opt->cpu": calibration.Factors(passes=1.1, update=0.9, runs=2)}
    plan = make_plan(llama7b, host, Workload(), resolve_rates(host), calibration=factors)
    text = plan_view.plan_text(plan, None)
    assert "calibrated by 2 finished runs of this strategy on this host (measured / predicted: passes x1.10" in text
