"""scripts/gpu_check.py's CPU path: the probe and one smoke run on DeepSpeed's CPU accelerator, one JSON of
predicted vs measured (the same shape `make gpu-check` writes on a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_gpu_check_cpu_path_writes_predicted_vs_measured(tmp_path):
    out = tmp_path / "gpu-check.json"
    env = dict(os.environ, DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--cpu", "--own-cache", "--work", str(tmp_path / "work")]
        + ["--out", str(out), "--strategies", "2:cpu:none", "--no-nvme"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["passed"] and result["device"]["accelerator"] == "cpu"
    assert result["probe"]["ok"] and result["probe"]["figures"]["cpu_adam_params_per_s"] > 0
    assert result["workload"]["steps"] == 2
    (run,) = result["runs"]
    assert run["passed"] and (run["zero_stage"], run["offload_optimizer"], run["offload_param"]) == (2, "cpu", "none")
    for figure in ("cpu_bytes_per_node", "step_seconds"):
        band = run[figure]
        assert band["predicted"] > 0 and band["measured"] > 0
        assert band["measured_over_predicted"] == pytest.approx(band["measured"] / band["predicted"])
    assert run["gpu_bytes_per_device"]["measured"] is None  # no GPU: nothing measured, nothing invented
    assert len(run["losses"]) == 2


def _gpu_check():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return gpu_check


def test_the_gpu_runs_never_inherit_the_cpu_accelerator():
    """tests/conftest.py pins DS_ACCELERATOR=cpu for the whole test run: a GPU check started under pytest (the gpu
    marker's tests) or from a shell that set it would otherwise train every 'GPU' run on the CPU, and pass."""
    gpu_check = _gpu_check()
    assert os.environ["DS_ACCELERATOR"] == "cpu"  # what this test run's children inherit
    assert "DS_ACCELERATOR" not in gpu_check.child_environ(os.environ, gpu=True)
    assert gpu_check.child_environ({}, gpu=False)["DS_ACCELERATOR"] == "cpu"
    assert gpu_check.child_environ({"DS_ACCELERATOR": "cuda"}, gpu=True)["HF_HUB_OFFLINE"] == "1"


def test_strategies_are_parsed_and_checked():
    gpu_check = _gpu_check()
    assert gpu_check.parse_strategies("2:none:none, 3:cpu:cpu") == [("2", "none", "none"), ("3", "cpu", "cpu")]
    with pytest.raises(SystemExit):
        gpu_check.parse_strategies("3:gpu:cpu")
    warm, how = gpu_check.warm_step_seconds([9.0, 1.0, 3.0, 2.0])  # the first step compiles: left out
    assert warm == 2.0 and how == "median of the smoke run's 3 steps after the first"
    assert gpu_check.warm_step_seconds([4.0])[0] == 4.0 and gpu_check.warm_step_seconds([])[0] is None
    held = gpu_check.band(2.0, 2.4, gpu_check.STEP_BAND)
    assert held == {
        "predicted": 2.0,
        "measured": 2.4,
        "measured_over_predicted": 1.2,
        "band": [0.8, 1.25],
        "within": True,
    }
    assert gpu_check.band(2.0, 2.4, gpu_check.MEMORY_BAND)["within"] is False  # memory: [0.9, 1.1]
    assert gpu_check.band(None, 3.0, gpu_check.STEP_BAND)["within"] is None  # not measured: no verdict


def test_a_gpu_run_outside_its_bands_fails_and_the_table_says_which():
    gpu_check = _gpu_check()
    record = {
        "strategy": "ZeRO-2 optimizer=cpu param=none",
        "passed": True,
        "gpu_bytes_per_device": gpu_check.band(10.0, 10.5, gpu_check.MEMORY_BAND),
        "cpu_bytes_per_node": gpu_check.band(10.0, 12.0, gpu_check.MEMORY_BAND),  # 1.2: outside
        "step_seconds": gpu_check.band(1.0, None, gpu_check.STEP_BAND),
    }
    assert not gpu_check.bands_hold(record)
    lines = gpu_check.table([record, {"strategy": "ZeRO-3 nvme", "skipped": "no libaio"}]).splitlines()
    assert lines[1].split() == ["ZeRO-2", "optimizer=cpu", "param=none", "1.05", "1.20", "!", "-", "pass"]
    assert lines[2] == "ZeRO-3 nvme          skipped: no libaio"
