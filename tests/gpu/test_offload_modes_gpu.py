"""On a CUDA GPU: the offload modes the CPU accelerator cannot show (tests/e2e/test_offload_modes.py trains the
others there). SuperOffload asserts a CUDA device (superoffload_stage3.py `_validate_superoffload_accelerator`);
a partial offload keeps its GPU share on the device only here. Run with `make gpu-smoke` (or `pytest -m gpu`)."""

from __future__ import annotations

import json

import pytest

from tests.e2e import conftest as e2e
from tests.e2e.conftest import check_run, run_launch

tiny_model, tiny_data = e2e.tiny_model, e2e.tiny_data

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_super_offload_trains_on_a_cuda_gpu(tiny_model, tiny_data, tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {
                "zero_optimization": {
                    "stage": 3,
                    "offload_optimizer": {"device": "cpu", "super_offload": True, "cpuadam_cores_perc": 0.8},
                },
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
            }
        )
    )
    run_launch(tiny_model, tiny_data, out, "--ds-config", str(config), "--steps", "6", gpu=True)
    check_run(out, 6, stage=3, offload_optimizer="cpu", offload_param="none", optimizer="DeepSpeedCPUAdam")
    plan = json.loads((out / "plan.json").read_text())
    assert plan["strategy"]["super_offload"] is True


def test_partial_offload_keeps_its_share_on_the_gpu(tiny_model, tiny_data, tmp_path):
    out = tmp_path / "run"
    args = ("--zero-stage", "3", "--offload-optimizer", "cpu", "--offload-ratio", "0.5", "--steps", "6")
    run_launch(tiny_model, tiny_data, out, *args, gpu=True)
    run = check_run(out, 6, stage=3, offload_optimizer="cpu", offload_param="none")
    assert run["optimizer_subgroups"]["device"] >= 1
    assert run["measured"]["gpu_bytes_per_device"] > 0
