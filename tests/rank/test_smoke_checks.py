"""The in-training smoke checks' verdicts: from measurements to pass/fail and the message a user reads."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from launcher.rank.smoke_checks import (
    built_placement,
    checkpoint_verdict,
    engine_verdict,
    loss_verdict,
    memory_verdict,
)

GIB = 1024**3


def test_loss_that_falls_passes():
    passed, message = loss_verdict([5.0, 4.0, 3.0], skipped=0)
    assert passed and message == "5.0000 -> 3.0000 over 3 steps on one batch, all finite"


def test_loss_that_does_not_fall_fails():
    passed, message = loss_verdict([5.0, 6.0, 5.0], skipped=0)
    assert not passed and message == "loss did not fall on a batch seen 3 times (5.0000 -> 5.0000)"
    assert not loss_verdict([5.0], skipped=0)[0]  # one step shows nothing


def test_a_loss_that_is_not_finite_fails():
    passed, message = loss_verdict([5.0, math.nan], skipped=0)
    assert not passed and message.startswith("loss is nan at step 2")


def test_skipped_optimizer_steps_fail_even_when_the_loss_falls():
    passed, message = loss_verdict([5.0, 4.0, 3.0], skipped=2)
    assert not passed and message.startswith("DeepSpeed skipped 2 of 3 optimizer steps")


def test_memory_within_tolerance_passes():
    check = memory_verdict({"cpu_bytes_per_node": 11 * GIB}, {"cpu_bytes_per_node": 10 * GIB}, 1.25)
    assert check.passed and check.name == "memory"
    assert check.message == "CPU 11.0 GiB / predicted 10.0 GiB = 1.10 (tolerance 1.25)"
    assert check.details["ratios"] == {"cpu_bytes_per_node": 1.1}


def test_memory_over_tolerance_fails_on_any_tier():
    measured = {"cpu_bytes_per_node": 10 * GIB, "gpu_bytes_per_device": 30 * GIB}
    predicted = {"cpu_bytes_per_node": 10 * GIB, "gpu_bytes_per_device": 20 * GIB}
    check = memory_verdict(measured, predicted, 1.25)
    assert not check.passed and check.message.endswith("; above the 1.25 tolerance")
    assert "GPU 30.0 GiB / predicted 20.0 GiB = 1.50" in check.message


def test_memory_without_a_prediction_has_no_ratio():
    check = memory_verdict({"cpu_bytes_per_node": 10 * GIB}, {}, 1.25)
    assert check.passed and check.details["ratios"] == {}


def test_built_placement_reads_zero3_and_zero2_optimizers():
    zero3 = SimpleNamespace(
        offload_optimizer=True, swap_optimizer=True, offload_param=True, params_in_nvme_and_cpu=False
    )
    assert built_placement(3, zero3) == (3, "nvme", "cpu")
    zero3_gpu = SimpleNamespace(
        offload_optimizer=False, swap_optimizer=False, offload_param=False, params_in_nvme_and_cpu=False
    )
    assert built_placement(3, zero3_gpu) == (3, "none", "none")
    assert built_placement(2, SimpleNamespace(cpu_offload=True)) == (2, "cpu", "none")
    assert built_placement(1, SimpleNamespace()) == (1, "none", "none")


def test_engine_as_planned_passes():
    check = engine_verdict((2, "cpu", "none"), (2, "cpu", "none"), "DeepSpeedCPUAdam")
    assert check.passed and check.message == "ZeRO-2, optimizer on cpu, parameters on none, DeepSpeedCPUAdam"
    assert check.details == {
        "built": [2, "cpu", "none"],
        "planned": [2, "cpu", "none"],
        "optimizer": "DeepSpeedCPUAdam",
    }


def test_engine_not_as_planned_or_with_a_slow_offloaded_adam_fails():
    check = engine_verdict((3, "cpu", "none"), (3, "nvme", "nvme"), "DeepSpeedCPUAdam")
    assert not check.passed and "the plan asked for ZeRO-3 with optimizer on nvme, parameters on nvme" in check.message
    check = engine_verdict((2, "cpu", "none"), (2, "cpu", "none"), "FusedAdam")
    assert not check.passed and "the offloaded optimizer is FusedAdam, not DeepSpeedCPUAdam" in check.message
    assert engine_verdict((2, "none", "none"), (2, "none", "none"), "FusedAdam").passed  # no offload: any Adam


def weights(*values):
    return {f"w{i}": torch.tensor([v]) for i, v in enumerate(values)}


def test_checkpoint_restoring_the_saved_weights_passes():
    check = checkpoint_verdict(weights(1.0, 2.0), weights(1.5, 2.0), weights(1.0, 2.0), True, 2048, 1.0)
    assert check.passed and "(1/2 tensors moved)" in check.message and "all 2 tensors identical" in check.message
    assert check.message.startswith("saved 2.0 KiB")


def test_checkpoint_that_restores_other_weights_or_none_fails():
    check = checkpoint_verdict(weights(1.0, 2.0), weights(1.5, 2.5), weights(1.0, 2.5), True, 2048, 1.0)
    assert not check.passed and check.message.endswith("but 1 tensors differ, e.g. w1")
    check = checkpoint_verdict(weights(1.0), weights(1.5), weights(1.5), False, 2048, 1.0)
    assert not check.passed and check.message.endswith("but could not be loaded")
