"""The smoke checks made inside training (`offload-launch --smoke`): engine, loss, memory, checkpoint, nvme_cleanup.

launcher/job/smoke.py describes every check, runs the others (config, data, timeout, run) and reads what rank 0
writes here to OUT/smoke.json. Each check runs on every rank (most are collective); `*_verdict` functions
turn measurements into a Check without touching DeepSpeed.
"""

from __future__ import annotations

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
    ids = trainer.first_batch()
    loss = loss_check(trainer, ids)
    checks += [loss, memory_check(trainer)]
    if all(math.isfinite(x) for x in loss.details["losses"]):
        checks.append(checkpoint_check(trainer, ids))
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


def loss_verdict(losses: list[float], skipped: int) -> tuple[bool, str]:
    """(passed, message): every loss finite, no optimizer step skipped, and the last loss below the first.
    DeepSpeed skips an optimizer step whose gradients are not finite and says so only in its log: the
    loss then looks finite while the model stopped learning."""
    finite = all(math.isfinite(x) for x in losses)
    learned = finite and not skipped and len(losses) > 1 and losses[-1] < losses[0]
    if not finite:
        message = f"loss is {losses[-1]} at step {len(losses)}; lower --lr, or check the data and precision"
    elif skipped:
        message = (
            f"DeepSpeed skipped {skipped} of {len(losses)} optimizer steps: the gradients were not finite "
            "(overflow); lower --lr, or check the data and precision"
        )
    elif not learned:
        message = f"loss did not fall on a batch seen {len(losses)} times ({losses[0]:.4f} -> {losses[-1]:.4f})"
    else:
        message = f"{losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps on one batch, all finite"
    return learned, message


def loss_check(trainer: Trainer, ids) -> Check:
    """--steps optimizer steps on the batch `ids`, stopping at the first loss that is not finite."""
    steps = trainer.spec.steps
    t0 = time.perf_counter()
    losses: list[float] = []
    skipped_before = int(trainer.engine.skipped_steps)
    trainer.engine.train()
    for step in range(1, steps + 1):
        losses.append(trainer.train_step(lambda _micro: ids, step))
        trainer.log(f"smoke step {len(losses)}/{steps} loss {losses[-1]:.4f}")
        if not math.isfinite(losses[-1]):
            break
    seconds = time.perf_counter() - t0
    skipped = int(trainer.engine.skipped_steps) - skipped_before
    learned, message = loss_verdict(losses, skipped)
    return Check("loss", learned, message, seconds, {"losses": losses, "skipped_steps": skipped})


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


def full_weights(engine, zero3: bool) -> dict:
    """The full 16-bit weights, on every rank (ZeRO-3 gathers its partitions)."""
    import deepspeed

    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), enabled=zero3):
        return {name: p.detach().clone().cpu() for name, p in params.items()}


def checkpoint_verdict(saved: dict, moved: dict, restored: dict, loaded: bool, size: int, seconds: float) -> Check:
    """The weights saved, after one more step, and loaded back: loading must restore the saved ones exactly."""
    import torch

    changed = sum(not torch.equal(saved[k], moved[k]) for k in saved)
    differ = [k for k in saved if not torch.equal(saved[k], restored[k])]
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


def checkpoint_check(trainer: Trainer, ids) -> Check:
    """Save, train one more step (the weights move), load: the weights must be the saved ones exactly."""
    t0 = time.perf_counter()
    folder = trainer.spec.out / CHECKPOINT_FOLDER
    zero3 = trainer.planned_placement()[0] == 3
    try:
        try:
            trainer.checkpoints.write(folder, "smoke", trainer.spec.steps)
            trainer.dist.barrier()
            saved = full_weights(trainer.engine, zero3)
            trainer.train_step(lambda _micro: ids)  # no step number: outside the kill-point drill's count
            moved = full_weights(trainer.engine, zero3)
            load_path, _ = trainer.checkpoints.load(folder, "smoke")
            restored = full_weights(trainer.engine, zero3)
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
