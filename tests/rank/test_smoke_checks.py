"""The in-training smoke checks' verdicts: from measurements to pass/fail and the message a user reads."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from launcher.rank import smoke_checks
from launcher.rank.smoke_checks import (
    CALIBRATION_STEPS,
    built_placement,
    checkpoint_verdict,
    engine_verdict,
    loss_check,
    loss_scale,
    loss_verdict,
    memory_verdict,
    tensor_digest,
    weight_digests,
)

GIB = 1024**3


NONE_SKIPPED = [False, False, False]


def test_loss_that_falls_passes():
    passed, message = loss_verdict([5.0, 4.0, 3.0], NONE_SKIPPED)
    assert passed and message == "5.0000 -> 3.0000 over 3 steps on one batch, all finite"


def test_loss_that_does_not_fall_fails():
    passed, message = loss_verdict([5.0, 6.0, 5.0], NONE_SKIPPED)
    assert not passed and message == "loss did not fall on a batch seen 3 times (5.0000 -> 5.0000)"
    assert not loss_verdict([5.0], [False])[0]  # one step shows nothing


def test_a_loss_that_is_not_finite_fails():
    passed, message = loss_verdict([5.0, math.nan], [False, False])
    assert not passed and message.startswith("loss is not finite (nan) at step 2")
    passed, message = loss_verdict([5.0, math.inf], [True, True], [65536.0, 65536.0], 1.0)  # fp16 too
    assert not passed and message.startswith("loss is not finite (inf) at step 2")


def test_skipped_optimizer_steps_fail_even_when_the_loss_falls():
    """bf16 and fp32 have no loss scale to calibrate: a skipped step is gradients that are not finite."""
    passed, message = loss_verdict([5.0, 4.0, 3.0], [False, True, True])
    assert not passed and message.startswith("DeepSpeed skipped 2 of 3 optimizer steps")
    passed, message = loss_verdict([5.0, 5.0, 4.0, 3.0], [True, False, False, False])  # even the first ones
    assert not passed and message.startswith("DeepSpeed skipped 1 of 4 optimizer steps")


# fp16: DeepSpeed's DynamicLossScaler as ZeRO builds it with the ds_config defaults (initial_scale_power 16,
# hysteresis 2, loss_scale_window 1000, min_loss_scale 1): the scale falls only after `hysteresis` overflows.
CALIBRATION = {
    "losses": [6.0, 6.0, 6.0, 6.0, 5.0, 4.0],  # the weights do not move while steps are skipped
    "skipped": [True, True, True, False, False, False],
    "scales": [65536.0, 65536.0, 32768.0, 16384.0, 16384.0, 16384.0],
}


def test_fp16_calibration_skips_in_the_first_steps_pass():
    c = CALIBRATION
    passed, message = loss_verdict(c["losses"], c["skipped"], c["scales"], 1.0)
    assert passed, message
    assert message == (
        "6.0000 -> 4.0000 over 3 steps on one batch, all finite; "
        "3 fp16 loss-scale calibration steps skipped first (65536 -> 16384)"
    )


def test_fp16_skips_after_the_scale_settled_are_divergence():
    c = CALIBRATION
    skipped = [*c["skipped"][:5], True]
    passed, message = loss_verdict(c["losses"], skipped, [*c["scales"][:5], 16384.0], 1.0)
    assert not passed
    assert message.startswith("DeepSpeed skipped step 6 (fp16 overflow at loss scale 16384) after step 4 had trained")


def test_fp16_skips_at_the_minimum_scale_or_a_scale_that_never_settles_are_divergence():
    passed, message = loss_verdict([6.0] * 3, [True] * 3, [4.0, 2.0, 1.0], 1.0)
    assert not passed and message.startswith("fp16 gradients overflowed at the minimum loss scale 1 (step 3)")
    passed, message = loss_verdict([6.0] * 4, [True] * 4, [65536.0, 65536.0, 32768.0, 16384.0], 1.0)
    assert not passed and message.startswith("the fp16 loss scale fell from 65536 to 16384 over 4 skipped steps")


class Fp16Engine:
    """A ZeRO engine in fp16 as the loss check sees it: DeepSpeed's real DynamicLossScaler decides, from whether
    grad * scale overflows fp16 (65504), to skip the step; `grads(step_trained)` is the gradient's size."""

    def __init__(self, grads, init_scale=2.0**16, min_scale=1.0):
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

        self.optimizer = SimpleNamespace(
            loss_scaler=DynamicLossScaler(init_scale, 1000, min_scale, delayed_shift=2, consecutive_hysteresis=False)
        )
        self.grads, self.skipped_steps, self.trained, self.loss = grads, 0, 0, 6.0

    def train(self):
        pass

    def step(self) -> float:
        scaler = self.optimizer.loss_scaler
        loss = self.loss
        overflow = self.grads(self.trained) * scaler.cur_scale > 65504.0
        scaler.update_scale(overflow)  # raises at the minimum scale, as in DeepSpeed
        if overflow:
            self.skipped_steps += 1
        else:
            self.trained += 1
            self.loss -= 1.0
        return loss


def fp16_trainer(monkeypatch, engine, steps=3):
    import deepspeed.runtime.fp16.loss_scaler as loss_scaler

    monkeypatch.setattr(loss_scaler.dist, "get_rank", lambda *_a, **_k: 0)  # its log line asks for the rank
    return SimpleNamespace(
        spec=SimpleNamespace(steps=steps), engine=engine, log=lambda _m: None, train_step=lambda _b, _s: engine.step()
    )


def test_loss_check_trains_through_fp16_calibration(monkeypatch):
    engine = Fp16Engine(grads=lambda _trained: 3.0)  # overflows at 65536 (twice: hysteresis) and 32768
    check = loss_check(fp16_trainer(monkeypatch, engine), batch=None)
    assert check.passed, check.message
    assert check.details["skipped"] == [True, True, True, False, False, False]
    assert check.details["loss_scales"] == [65536.0, 65536.0, 32768.0, 16384.0, 16384.0, 16384.0]
    assert check.details["skipped_steps"] == 3 and engine.trained == 3  # --steps 3 trained steps
    assert "3 fp16 loss-scale calibration steps skipped first (65536 -> 16384)" in check.message


def test_loss_check_fails_fp16_divergence(monkeypatch):
    growing = Fp16Engine(grads=lambda trained: 3.0 * 4**trained)  # the gradients grow as it trains
    check = loss_check(fp16_trainer(monkeypatch, growing), batch=None)
    assert not check.passed and "after step 4 had trained at 16384" in check.message

    never = Fp16Engine(grads=lambda _trained: math.inf)
    check = loss_check(fp16_trainer(monkeypatch, never), batch=None)
    assert not check.passed and check.message.startswith("the fp16 loss scale fell from 65536 to ")
    assert len(check.details["losses"]) == 3 + CALIBRATION_STEPS  # a bounded number of extra steps

    floor = Fp16Engine(grads=lambda _trained: math.inf, init_scale=8.0)  # reaches min_loss_scale 1: DeepSpeed raises
    check = loss_check(fp16_trainer(monkeypatch, floor), batch=None)
    assert not check.passed and check.message.startswith("fp16 gradients overflow at the minimum loss scale")
    assert "stopped" in check.details


def test_loss_scale_reads_only_a_dynamic_fp16_scaler():
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

    dynamic = {"init_scale": 2.0**16, "scale_window": 1000, "min_scale": 1, "delayed_shift": 2}
    fp16 = CreateLossScaler(torch.float16, 1.0, True, dynamic | {"consecutive_hysteresis": False})
    assert loss_scale(SimpleNamespace(loss_scaler=fp16)) == (65536.0, 1.0)
    assert loss_scale(SimpleNamespace(loss_scaler=CreateLossScaler(torch.bfloat16, 1.0, False, None))) is None
    assert loss_scale(SimpleNamespace(loss_scaler=CreateLossScaler(torch.float16, 128.0, False, None))) is None
    assert loss_scale(SimpleNamespace()) is None


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
    return {f"w{i}": tensor_digest(torch.tensor([v])) for i, v in enumerate(values)}


def test_checkpoint_restoring_the_saved_weights_passes():
    check = checkpoint_verdict(weights(1.0, 2.0), weights(1.5, 2.0), weights(1.0, 2.0), True, 2048, 1.0)
    assert check.passed and "(1/2 tensors moved)" in check.message and "all 2 tensors identical" in check.message
    assert check.message.startswith("saved 2.0 KiB")


def test_checkpoint_that_restores_other_weights_or_none_fails():
    check = checkpoint_verdict(weights(1.0, 2.0), weights(1.5, 2.5), weights(1.0, 2.5), True, 2048, 1.0)
    assert not check.passed and check.message.endswith("but 1 tensors differ, e.g. w1")
    check = checkpoint_verdict(weights(1.0), weights(1.5), weights(1.5), False, 2048, 1.0)
    assert not check.passed and check.message.endswith("but could not be loaded")


def test_tensor_digest_is_exact():
    w = torch.randn(64, 64).to(torch.bfloat16)
    assert tensor_digest(w) == tensor_digest(w.clone()) and len(tensor_digest(w)) == 32
    nudged = w.clone()
    nudged.view(torch.int16)[17, 3] += 1  # one bf16 ulp in one element
    assert tensor_digest(nudged) != tensor_digest(w)
    assert tensor_digest(torch.tensor(1.5)) == tensor_digest(torch.tensor([1.5]))  # 0-d tensors too


class RecordingGather:
    """deepspeed.zero.GatheredParameters stand-in: records how many elements are gathered at once."""

    live = peak = 0

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self.numel = sum(p.numel() for p in params) if enabled else 0

    def __enter__(self):
        RecordingGather.live += self.numel
        RecordingGather.peak = max(RecordingGather.peak, RecordingGather.live)

    def __exit__(self, *exc):
        RecordingGather.live -= self.numel


def test_weight_digests_gather_one_tensor_at_a_time(monkeypatch):
    import deepspeed

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", RecordingGather)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 16), torch.nn.Linear(16, 64), torch.nn.Linear(64, 300))
    engine = SimpleNamespace(module=model)
    digests = weight_digests(engine, zero3=True)
    largest = max(p.numel() for p in model.parameters())
    assert RecordingGather.peak == largest < sum(p.numel() for p in model.parameters())  # never the whole model
    assert set(digests) == {name for name, _ in model.named_parameters()}
    shares = [weight_digests(engine, zero3=True, rank=r, world=2) for r in (0, 1)]
    assert not set(shares[0]) & set(shares[1]) and shares[0] | shares[1] == digests  # each rank hashes its share
    assert weight_digests(engine, zero3=False, rank=1, world=2) == digests  # replicas: each rank checks its own


def test_weight_digests_see_a_wrong_restore(monkeypatch):
    import deepspeed

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", RecordingGather)
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    engine = SimpleNamespace(module=model)
    saved = weight_digests(engine, zero3=True)
    with torch.no_grad():
        model.weight.view(torch.int16)[0, 0] += 1
    moved = weight_digests(engine, zero3=True)
    check = checkpoint_verdict(saved, moved, moved, True, 2048, 1.0)
    assert not check.passed and check.message.endswith("but 1 tensors differ, e.g. weight")
    assert smoke_checks.checkpoint_verdict(saved, moved, saved, True, 2048, 1.0).passed
