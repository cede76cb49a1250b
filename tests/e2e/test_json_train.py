"""A real training run with --json: stdout is exactly the run's summary, the ranks' logs went to stderr."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import run_launch

pytestmark = pytest.mark.e2e


def test_training_json_is_the_summary_alone(tiny_model, tiny_data, tmp_path):
    proc = run_launch(
        tiny_model,
        tiny_data,
        tmp_path / "out",
        "--steps",
        "2",
        "--zero-stage",
        "2",
        "--offload-optimizer",
        "cpu",
        "--json",
    )
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 2 and summary["final_loss"] > 0 and summary["optimizer"] == "DeepSpeedCPUAdam"
    assert "launching:" in proc.stderr
