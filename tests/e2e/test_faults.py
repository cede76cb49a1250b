"""Faults lose nothing: a run killed during a step or during a checkpoint, or whose disk fills while it
checkpoints, resumes from its newest complete checkpoint onto the same loss curve as an uninterrupted run
of the same seed. Real DeepSpeed on the CPU accelerator; kills are real SIGKILLs (OFFLOAD_LAUNCH_KILL_AT
names the moment), full disks are real tmpfs mounts (skipped where this user cannot mount)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import launch, read_metrics, run_launch, swapping_model
from tests.e2e.test_smoke import probe_env, probe_events

pytestmark = pytest.mark.e2e

STEPS = 8
OPTIONS = ("--steps", str(STEPS), "--save-every", "2", "--zero-stage", "2", "--offload-optimizer", "cpu")
# Same seed, same data order, same restored optimizer state: the curves agree to float32 rounding.
LOSS_TOLERANCE = 1e-4


def losses(out: Path) -> list[float]:
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), "each step exactly once"
    return [m["loss"] for m in metrics]


def complete(out: Path) -> list[str]:
    return sorted(marker.parent.name for marker in (out / "checkpoints").glob("*/complete.json"))


@pytest.fixture(scope="module")
def reference(tiny_model, tiny_data, tmp_path_factory) -> list[float]:
    """The loss curve of the uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "run"
    run_launch(tiny_model, tiny_data, out, *OPTIONS)
    return losses(out)


def same_curve(out: Path, reference: list[float]) -> None:
    resumed = losses(out)
    assert max(abs(a - b) for a, b in zip(resumed, reference, strict=True)) < LOSS_TOLERANCE, (resumed, reference)


def test_killed_during_a_checkpoint_then_during_a_step_resumes_on_the_same_curve(
    tiny_model, tiny_data, tmp_path, reference
):
    out = tmp_path / "run"
    # 1. SIGKILL after DeepSpeed wrote checkpoint step4, before its completion marker.
    killed = launch(tiny_model, tiny_data, out, *OPTIONS, env={"OFFLOAD_LAUNCH_KILL_AT": "checkpoint:4"})
    assert killed.returncode == 247  # rank 0's SIGKILL, as DeepSpeed's launch.py passes it on
    assert (
        "a rank was killed (SIGKILL, exit 247" in killed.stderr
        and "the same command resumes after step 2" in killed.stderr
    )
    assert (out / "checkpoints" / "step4").is_dir() and complete(out) == ["step2"]  # half-written: not complete

    # 2. The resume never picks the half-written step4: it removes it, continues after step 2, and is killed
    #    in the middle of step 7 (after a backward, before the optimizer step).
    killed = launch(tiny_model, tiny_data, out, *OPTIONS, env={"OFFLOAD_LAUNCH_KILL_AT": "step:7"})
    assert killed.returncode != 0
    assert "removed incomplete checkpoint step4" in killed.stderr
    assert "resumed from step2 (step 2)" in killed.stderr
    assert complete(out) == ["step4", "step6"]  # --keep-checkpoints 2 rotated step2 out

    # 3. The last resume continues after step 6 and finishes on the uninterrupted run's curve.
    done = run_launch(tiny_model, tiny_data, out, *OPTIONS)
    assert "resumed from step6 (step 6)" in done.stderr
    same_curve(out, reference)
    assert json.loads((out / "run.json").read_text())["skipped_checkpoints"] == []


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A small real file system at `path` (root only; skips the test where mounting is not allowed)."""
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_without_room_skips_the_save_and_keeps_the_previous_checkpoint(tiny_model, tiny_data, tmp_path, reference):
    out = tmp_path / "run"
    # A checkpoint of this model is about 1.3 MiB: room for the first, not for a second next to it.
    with tmpfs(out / "checkpoints", "size=2m"):
        done = run_launch(tiny_model, tiny_data, out, *OPTIONS)
        assert "warning: checkpoint step4 skipped" in done.stderr
        assert "checkpoint step2 is intact" in done.stderr
        assert complete(out) == ["step2"]
        run = json.loads((out / "run.json").read_text())
        assert run["skipped_checkpoints"] == [4, 6, 8]
    same_curve(out, reference)  # skipping saves never changes the training


def test_disk_full_while_writing_fails_that_save_and_resume_continues(tiny_model, tiny_data, tmp_path, reference):
    out = tmp_path / "run"
    # Room in bytes but not in files: the space check passes, then DeepSpeed's write of step4 fails.
    with tmpfs(out / "checkpoints", "size=64m,nr_inodes=9") as checkpoints:
        failed = launch(tiny_model, tiny_data, out, *OPTIONS)
        assert failed.returncode != 0
        assert "checkpoint step4 failed while writing" in failed.stderr
        assert "removed the partial folder; checkpoint step2 is intact" in failed.stderr
        assert "rerun the same command to resume" in failed.stderr
        assert complete(out) == ["step2"] and not (checkpoints / "step4").exists()

        # The user frees space; the same command resumes from step 2 and ends on the uninterrupted curve.
        subprocess.run(["mount", "-o", "remount,nr_inodes=1000", str(checkpoints)], check=True)
        done = run_launch(tiny_model, tiny_data, out, *OPTIONS)
        assert "resumed from step2 (step 2)" in done.stderr
        same_curve(out, reference)


def nvme_sub_groups_config(model: Path, nvme: Path, path: Path) -> Path:
    """A ds_config (written to `path`) that makes DeepSpeed keep one ZeRO-3 optimizer sub-group on NVMe and one
    in memory: every parameter but the last (the LM head) in sub-group 0, the LM head alone in sub-group 1, and
    the swapper's smallest swapped tensor (its aio block_size, DeepSpeed's min_aio_bytes) between their fp32
    sizes. A resume has to restore both kinds (launcher/rank/checkpoints.py, 'NVMe resume')."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        numels = [p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).parameters()]
    swapped, in_memory = 4 * (sum(numels) - numels[-1]), 4 * numels[-1]  # fp32 bytes
    block_size = (swapped + in_memory) // 2 // 4096 * 4096
    assert in_memory < block_size <= swapped, (in_memory, block_size, swapped)
    config = {
        "zero_optimization": {
            "stage": 3,
            "sub_group_size": sum(numels) - numels[-1],
            "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme)},
        },
        "aio": {"block_size": block_size},
    }
    path.write_text(json.dumps(config))
    return path


def test_optimizer_on_nvme_killed_in_a_step_resumes_on_the_same_curve(tiny_model, tiny_data, tmp_path):
    """ZeRO-3 with the optimizer on NVMe, one sub-group swapped and one in memory. DeepSpeed 0.19.8 copies the
    swap files (fp32 weights, Adam's moments) into the checkpoint and back, and nothing else: offload-launch
    restores the rest from the ZeRO optimizer file (the in-memory sub-group's weights and moments, every
    sub-group's Adam step, the swapped moments the fresh swapper would not read) and refreshes the 16-bit
    weights. Before that the resumed curve was 2.10 off at step 4 here (0.45 on the tiny model, whose one
    sub-group stays in memory; 0.20 at step 5 with the whole model swapped)."""
    model, nvme = swapping_model(tiny_model, tmp_path)
    config = nvme_sub_groups_config(model, nvme, tmp_path / "ds_config.json")
    options = ("--steps", "6", "--save-every", "3", "--zero-stage", "3", "--offload-optimizer", "nvme")
    options += ("--nvme-path", str(nvme), "--ds-config", str(config))
    reference_out, out = tmp_path / "reference", tmp_path / "run"
    run_launch(model, tiny_data, reference_out, *options)
    killed = launch(model, tiny_data, out, *options, env={"OFFLOAD_LAUNCH_KILL_AT": "step:5"})
    assert killed.returncode != 0 and complete(out) == ["step3"]
    # What the checkpoint holds: sub-group 0 in swap files (fp32 weights, exp_avg, exp_avg_sq), sub-group 1 only
    # in DeepSpeed's ZeRO optimizer file, which its load_checkpoint skips with the optimizer on NVMe.
    step3 = out / "checkpoints" / "step3"
    assert len(list((step3 / "offloaded_tensors" / "rank00").glob("*.tensor.swp"))) == 3
    (zero_file,) = step3.glob("*zero_pp_rank_0_mp_rank_00_optim_states.pt")
    saved = torch_load(zero_file)["optimizer_state_dict"]
    assert [t.numel() > 0 for t in saved["fp32_flat_groups"]] == [False, True]  # swapped, in memory
    probe = tmp_path / "probe"
    done = run_launch(model, tiny_data, out, *options, env=probe_env(probe))
    assert "resumed from step3 (step 3)" in done.stderr
    assert "restored the optimizer state and refreshed the 16-bit weights" in done.stderr
    swaps = probe_events(probe, "swap_in")  # the restore swaps each swapped sub-group in once, not per parameter
    assert sorted(e["sub_group"] for e in swaps if e["refresh"]) == sorted({e["sub_group"] for e in swaps}) == [0]
    resumed, reference = read_metrics(out), read_metrics(reference_out)
    assert [m["step"] for m in resumed] == list(range(1, 7))  # continued after step 3, each step once
    assert [m["lr"] for m in resumed] == [m["lr"] for m in reference]  # the schedule continues exactly
    assert not list(nvme.glob("offload-launch-*"))  # both finished runs removed their swap folders
    # Deterministic on the CPU: measured bit-identical; the tolerance only leaves float32 rounding room.
    gaps = [abs(a["loss"] - b["loss"]) for a, b in zip(resumed, reference, strict=True)]
    assert max(gaps) < LOSS_TOLERANCE, [(m["loss"], r["loss"]) for m, r in zip(resumed, reference, strict=True)]


def torch_load(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)  # DeepSpeed's file holds its loss scaler
