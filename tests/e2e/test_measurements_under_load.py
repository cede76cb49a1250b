"""Measurements survive a busy machine (measure/contention.py): what is timed while other processes compete for the
cores is said so and kept only as "measured under load", the next real run measures it again, and that run's plan
predicts its step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.e2e.conftest import run_launch

STEP_BAND = (0.8, 1.25)  # measured / predicted step, a quiet run planned from quiet measurements
UNDER_LOAD = "measured while other processes competed for the cores"


def busy_processes(count: int) -> list[subprocess.Popen]:
    """`count` processes that keep one core each busy, in their own process group (killed with it)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]


def test_passes_timed_under_load_are_measured_again_by_the_next_run(tiny_model, tiny_data, tmp_path):
    from transformers import AutoConfig

    model = tmp_path / "model"  # a shape no other test measured: its passes are timed here
    shutil.copytree(tiny_model, model)
    config = AutoConfig.from_pretrained(model)
    config.intermediate_size = 352
    config.save_pretrained(model)
    options = ("--zero-stage", "2", "--offload-optimizer", "cpu")
    load = busy_processes(os.cpu_count() or 2)
    try:
        loaded = run_launch(model, tiny_data, tmp_path / "loaded", *options, "--steps", "3")
    finally:
        for process in load:
            process.kill()
            process.wait()
    assert f"the passes were {UNDER_LOAD}" in loaded.stderr, loaded.stderr[-3000:]
    plan = json.loads((tmp_path / "loaded" / "plan.json").read_text())
    assert plan["rates"]["sources"]["passes"] == "measured under load"
    assert any(UNDER_LOAD in warning for warning in plan["warnings"])

    quiet = run_launch(model, tiny_data, tmp_path / "quiet", *options, "--steps", "8")
    assert "measuring the passes" in quiet.stderr and UNDER_LOAD not in quiet.stderr, quiet.stderr[-3000:]
    run = json.loads((tmp_path / "quiet" / "run.json").read_text())
    assert json.loads((tmp_path / "quiet" / "plan.json").read_text())["rates"]["sources"]["passes"] == "measured"
    assert STEP_BAND[0] <= run["ratios"]["step_seconds"] <= STEP_BAND[1], (run["measured"], run["predicted"])
