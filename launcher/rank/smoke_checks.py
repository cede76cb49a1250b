"""The smoke checks made inside training (`offload-launch --smoke`): engine, loss, memory, checkpoint, nvme_cleanup.

launcher/job/smoke.py describes every check, runs the others (config, data, timeout, run) and reads what rank 0
writes here to OUT/smoke.json. Each check runs on every rank (most are collective); `*_verdict` functions
turn measurements into a Check without touching DeepSpeed.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.files import folder_bytes
from launcher.job.rundir import SMOKE_CHECKPOINT
from launcher.job.smoke import Check
from launcher.units import fmt_bytes

if TYPE_CHECKING:
    from launcher.rank.trainer import Trainer

CHECKPOINT_FOLDER = SMOKE_CHECKPOINT  # under OUT; the check removes what it saved there


def run_checks(trainer: Trainer) -> list[dict]:
    """The in-training checks, in order, as dicts for OUT/smoke.json. Every step trains on the same first
    batch: a model that cannot lower the loss on a batch it sees again is broken, whatever the learning-rate
    schedule."""
    checks = [engine_check(trainer)]
    batch = trainer.first_batch()
    loss = loss_check(trainer, batch)
    checks += [loss, memory_check(trainer)]
    if "stopped" in loss.details:  # DeepSpeed's fp16 loss scaler gave up: the next step would raise again
        checks.append(Check("checkpoint", None, "not run: training stopped at the minimum fp16 loss scale"))
    elif all(math.isfinite(x) for x in loss.details["losses"]):
        checks.append(checkpoint_check(trainer, batch))
    else:
        checks.append(Check("checkpoint", None, "not run: the weights are no longer finite"))
    checks.append(nvme_cleanup_check(trainer))
    return [asdict(c) for c in checks]


# ------------------------------------------------------------------------------------------- engine


def built_placement(stage: int, optimizer) -> tuple[int, str, str]:
    """(ZeRO stage, optimizer state device, parameter device) as DeepSpeed built them, read from its
    ZeRO optimizer object's attributes."""
    if stage == 3:
        optimizer_at = ("nvme" if optimizer.swap_optimizer else "cpu") if optimizer.offload_optimizer else "none"
        param_at = ("nvme" if optimizer.params_in_nvme_and_cpu else "cpu") if optimizer.offload_param else "none"
    else:
        optimizer_at = "cpu" if getattr(optimizer, "cpu_offload", False) else "none"
        param_at = "none"
    return stage, optimizer_at, param_at


def engine_verdict(built: tuple[int, str, str], planned: tuple[int, str, str], optimizer_class: str) -> Check:
    stage, optimizer_at, param_at = built
    problems = []
    if built != planned:
        problems.append(
            f"built ZeRO-{stage} with optimizer on {optimizer_at}, parameters on {param_at}; the plan "
            f"asked for ZeRO-{planned[0]} with optimizer on {planned[1]}, parameters on {planned[2]}"
        )
    if optimizer_at != "none" and optimizer_class != "DeepSpeedCPUAdam":
        problems.append(
            f"the offloaded optimizer is {optimizer_class}, not DeepSpeedCPUAdam (the Adam step on the "
            "CPU would be several times slower); remove torch_adam / zero_force_ds_cpu_optimizer: false"
        )
    message = "; ".join(problems) or (
        f"ZeRO-{stage}, optimizer on {optimizer_at}, parameters on {param_at}, {optimizer_class}"
    )
    details = {"built": list(built), "planned": list(planned), "optimizer": optimizer_class}
    return Check("engine", not problems, message, 0.0, details)


def engine_check(trainer: Trainer) -> Check:
    """What DeepSpeed actually built, read from its optimizer objects, against the ds_config."""
    built = built_placement(trainer.engine.zero_optimization_stage(), trainer.engine.optimizer)
    return engine_verdict(built, trainer.planned_placement(), trainer.optimizer_class)


# ------------------------------------------------------------------------------------------- loss

# fp16's dynamic loss scaler starts high (2**initial_scale_power, 65536 by default) and skips the steps whose
# scaled gradients overflow while it halves the scale (after `hysteresis` overflows, 2 by default): those first
# skipped steps are calibration, by design. The loss check trains up to this many extra steps for them.
CALIBRATION_STEPS = 12
AT_MINIMUM = "loss scale already at minimum"  # DeepSpeed's DynamicLossScaler raises this on overflow at the floor


def loss_scale(optimizer) -> tuple[float, float] | None:
    """(current, minimum) scale of DeepSpeed's dynamic fp16 loss scaler; None without one (bf16, fp32, a static
    scale): then a skipped step always means gradients that are not finite."""
    scaler = getattr(optimizer, "loss_scaler", None)  # ZeRO 1-3: deepspeed/runtime/fp16/loss_scaler.py
    if scaler is not None and getattr(scaler, "dynamic", False):
        return float(scaler.cur_scale), float(scaler.min_scale)
    config = getattr(optimizer, "loss_scale_config", None)  # FP16_Optimizer without ZeRO
    if config is not None and getattr(config, "dynamic_loss_scale", False):
        return float(config.cur_scale), float(config.min_loss_scale)
    return None


def leading_skips(skipped: list[bool]) -> int:
    """How many steps were skipped before the first one that trained."""
    return next((i for i, s in enumerate(skipped) if not s), len(skipped))


def loss_verdict(
    losses: list[float], skipped: list[bool], scales: list[float] | None = None, min_scale: float | None = None
) -> tuple[bool, str]:
    """(passed, message): every loss finite, no optimizer step skipped past fp16's loss-scale calibration, and
    the last loss below the first trained one. `skipped[i]`: DeepSpeed skipped step i+1's update (its gradients
    were not finite; DeepSpeed says so only in its log, and the loss then looks finite while the model stopped
    learning). `scales[i]`: the dynamic fp16 loss scale step i+1 ran with (None: no dynamic scaler).

    With a dynamic scaler the steps skipped before the first trained one are calibration - the scale falling from
    its initial value - provided it stayed above `min_scale`. Divergence is a loss that is not finite, a skip at the
    minimum scale, a skip after a step trained (the scale had settled), or a scale still falling when the steps
    ran out."""
    n, skips = len(losses), sum(skipped)
    lead = leading_skips(skipped) if scales is not None else 0
    late = [i for i in range(lead, n) if skipped[i]]
    if not all(math.isfinite(x) for x in losses):
        return False, f"loss is not finite ({losses[-1]}) at step {n}; lower --lr, or check the data and precision"
    if scales is None and skips:
        return False, (
            f"DeepSpeed skipped {skips} of {n} optimizer steps: the gradients were not finite "
            "(overflow); lower --lr, or check the data and precision"
        )
    floor = [i for i in range(lead) if min_scale is not None and scales[i] <= min_scale]
    if floor:
        return False, (
            f"fp16 gradients overflowed at the minimum loss scale {scales[floor[0]]:g} (step {floor[0] + 1}): "
            "not calibration but divergence; lower --lr, check the data, or use bf16 where the GPU has it"
        )
    if late:
        i = late[0]
        return False, (
            f"DeepSpeed skipped step {i + 1} (fp16 overflow at loss scale {scales[i]:g}) after step {lead + 1} had "
            f"trained at {scales[lead]:g}: the scale had settled and the gradients grew; lower --lr, or check the "
            "data and precision"
        )
    if lead == n and n:
        return False, (
            f"the fp16 loss scale fell from {scales[0]:g} to {scales[-1]:g} over {n} skipped steps and never "
            "settled: every step overflowed; lower --lr, or check the data and precision"
        )
    trained = losses[lead:]
    first, last = f"{trained[0]:.4f}", f"{trained[-1]:.4f}"
    note = (
        f"; {lead} fp16 loss-scale calibration steps skipped first ({scales[0]:g} -> {scales[lead]:g})" if lead else ""
    )
    if len(trained) < 2 or trained[-1] >= trained[0]:
        return False, f"loss did not fall on a batch seen {len(trained)} times ({first} -> {last}){note}"
    return True, f"{first} -> {last} over {len(trained)} steps on one batch, all finite{note}"


def loss_check(trainer: Trainer, batch: dict) -> Check:
    """--steps optimizer steps on `batch` (the model's inputs), stopping at the first loss that is not finite.
    With fp16's dynamic loss scaler, the steps skipped before the first one that trains (the scale calibrating)
    do not count towards --steps, up to CALIBRATION_STEPS of them."""
    steps, engine = trainer.spec.steps, trainer.engine
    t0 = time.perf_counter()
    scaler = loss_scale(engine.optimizer)
    losses: list[float] = []
    skipped: list[bool] = []
    scales: list[float] | None = [] if scaler else None
    step_seconds: list[float] = []  # each step's, the first (compilation, allocator warm-up) included
    stopped = None
    engine.train()
    while len(losses) < steps + (min(leading_skips(skipped), CALIBRATION_STEPS) if scaler else 0):
        before = int(engine.skipped_steps)
        if scales is not None:
            scales.append(loss_scale(engine.optimizer)[0])
        started = time.perf_counter()
        try:
            losses.append(trainer.train_step(lambda _micro: batch, len(losses) + 1))
            step_seconds.append(time.perf_counter() - started)
        except Exception as exc:
            if AT_MINIMUM not in str(exc):  # every rank's scaler saw the same (all-reduced) overflow: all raise
                raise
            stopped = f"DeepSpeed stopped at step {len(losses) + 1}: {exc}"
            break
        skipped.append(int(engine.skipped_steps) > before)
        trainer.log(f"smoke step {len(losses)} loss {losses[-1]:.4f}" + (" (skipped)" if skipped[-1] else ""))
        if not math.isfinite(losses[-1]):
            break
    seconds = time.perf_counter() - t0
    if stopped:
        learned, message = False, f"fp16 gradients overflow at the minimum loss scale: {stopped}; lower --lr"
    else:
        learned, message = loss_verdict(losses, skipped, scales, scaler[1] if scaler else None)
    details = {"losses": losses, "skipped_steps": sum(skipped), "skipped": skipped, "loss_scales": scales}
    details["step_seconds"] = step_seconds
    if stopped:
        details["stopped"] = stopped
    return Check("loss", learned, message, seconds, details)


# ------------------------------------------------------------------------------------------- memory


def memory_verdict(measured: dict, predicted: dict, limit: float) -> Check:
    """Each measured tier against the plan's prediction for it; fails when a ratio is above `limit`."""
    ratios = {k: v / predicted[k] for k, v in measured.items() if predicted.get(k)}
    over = {k: r for k, r in ratios.items() if r > limit}
    parts = [
        f"{k.split('_')[0].upper()} {fmt_bytes(measured[k])} / predicted {fmt_bytes(predicted[k])} = {r:.2f}"
        for k, r in ratios.items()
    ]
    message = ", ".join(parts) + (f"; above the {limit:g} tolerance" if over else f" (tolerance {limit:g})")
    return Check("memory", not over, message, 0.0, {"measured": measured, "predicted": predicted, "ratios": ratios})


def memory_check(trainer: Trainer) -> Check:
    """Peak memory per tier against the plan's prediction: CPU RAM always (peak RSS of this node's ranks,
    summed), GPU memory when there is a GPU (what the caching allocator reserved)."""
    measured = {"cpu_bytes_per_node": trainer.cpu_peaks()[1]}
    gpu = trainer.gpu_reserved_bytes()
    if gpu is not None:
        measured["gpu_bytes_per_device"] = gpu
    return memory_verdict(measured, trainer.spec.predicted, trainer.spec.smoke_memory_tolerance)


# ------------------------------------------------------------------------------------------- checkpoint


def tensor_digest(tensor) -> str:
    """An exact fingerprint of a tensor's bytes (BLAKE2b), copied to the CPU one tensor at a time."""
    import torch

    data = tensor.detach().reshape(-1).contiguous().cpu()
    return hashlib.blake2b(data.view(torch.uint8).numpy(), digest_size=16).hexdigest()


def weight_digests(engine, zero3: bool, rank: int = 0, world: int = 1) -> dict[str, str]:
    """A digest of each 16-bit weight, by parameter name. ZeRO-3 gathers one parameter at a time (collective:
    every rank gathers each, in the same order), so no GPU holds more than the largest tensor on top of what
    training holds, and rank r digests parameters r, r + world, ... (the gathered tensor is the same on every
    rank); without ZeRO-3 every rank digests its own full copy."""
    import deepspeed

    digests = {}
    for i, (name, param) in enumerate(engine.module.named_parameters()):
        with deepspeed.zero.GatheredParameters([param], enabled=zero3):
            if not zero3 or i % world == rank:
                digests[name] = tensor_digest(param.data)
    return digests


def checkpoint_verdict(saved: dict, moved: dict, restored: dict, loaded: bool, size: int, seconds: float) -> Check:
    """The weights' digests (weight_digests) saved, after one more step, and loaded back: loading must restore
    the saved ones exactly."""
    changed = sum(saved[k] != moved[k] for k in saved)
    differ = [k for k in saved if saved[k] != restored[k]]
    if not loaded or differ:
        what = "could not be loaded" if not loaded else f"{len(differ)} tensors differ, e.g. {differ[0]}"
        return Check("checkpoint", False, f"checkpoint saved ({fmt_bytes(size)}) but {what}", seconds)
    return Check(
        "checkpoint",
        True,
        f"saved {fmt_bytes(size)}, trained one more step ({changed}/{len(saved)} tensors moved), "
        f"loaded back: all {len(saved)} tensors identical",
        seconds,
    )


def all_digests(trainer: Trainer, zero3: bool) -> dict[str, str]:
    """weight_digests of the whole model on every rank: with ZeRO-3 each rank's share, gathered (small: 32 hex
    characters per tensor)."""
    mine = weight_digests(trainer.engine, zero3, trainer.rank, trainer.world)
    if not zero3 or trainer.world == 1:
        return mine
    shares: list = [None] * trainer.world
    trainer.dist.all_gather_object(shares, mine)
    return {name: digest for share in shares for name, digest in share.items()}


def checkpoint_check(trainer: Trainer, batch: dict) -> Check:
    """Save, train one more step (the weights move), load: the weights must be the saved ones exactly (compared
    by digest, one parameter gathered at a time)."""
    t0 = time.perf_counter()
    folder = trainer.spec.out / CHECKPOINT_FOLDER
    zero3 = trainer.planned_placement()[0] == 3
    try:
        try:
            trainer.checkpoints.write(folder, "smoke", trainer.spec.steps)
            trainer.dist.barrier()
            saved = all_digests(trainer, zero3)
            trainer.train_step(lambda _micro: batch)  # no step number: outside the kill-point drill's count
            moved = all_digests(trainer, zero3)
            load_path, _ = trainer.checkpoints.load(folder, "smoke")
            restored = all_digests(trainer, zero3)
        except Exception as exc:  # noqa: BLE001 - a failure to save or load is what this check reports
            if trainer.world > 1:  # the other ranks may wait in a collective: fail the run, not just the check
                raise
            message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            return Check("checkpoint", False, message, time.perf_counter() - t0)
        size = folder_bytes(str(folder / "smoke"))
        trainer.dist.barrier()  # every rank has read the folder before rank 0 removes it
    finally:
        if trainer.rank == 0:
            shutil.rmtree(folder / "smoke", ignore_errors=True)
    return checkpoint_verdict(saved, moved, restored, load_path is not None, size, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------- nvme


def nvme_cleanup_check(trainer: Trainer) -> Check:
    """The run's NVMe swap folder is removed at the end, as a finished training run removes it."""
    if not trainer.spec.nvme_swap_dir:
        return Check("nvme_cleanup", True, "no NVMe offload in this plan: nothing to clean")
    used = folder_bytes(trainer.spec.nvme_swap_dir)
    trainer.remove_swap_files()
    trainer.dist.barrier()
    left = Path(trainer.spec.nvme_swap_dir)
    if left.exists():
        return Check("nvme_cleanup", False, f"{left} is still there ({fmt_bytes(folder_bytes(str(left)))})")
    return Check("nvme_cleanup", True, f"swap files ({fmt_bytes(used)} at the end) removed with {left}")
