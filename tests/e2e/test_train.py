"""Real DeepSpeed training on the CPU accelerator: every strategy family, two ranks, resume, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import check_run, launch_args, read_metrics, run_launch, swapping_model

pytestmark = pytest.mark.e2e


def test_zero2_optimizer_on_cpu(tiny_model, tiny_data, tmp_path):
    out = tmp_path / "run"
    run_launch(tiny_model, tiny_data, out, "--steps", "12", "--zero-stage", "2", "--offload-optimizer", "cpu")
    check_run(out, 12, stage=2, offload_optimizer="cpu", offload_param="none")


def test_zero3_optimizer_and_params_on_cpu_then_export_and_reload(tiny_model, tiny_data, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    run_launch(
        tiny_model,
        tiny_data,
        out,
        "--steps",
        "12",
        "--zero-stage",
        "3",
        "--offload-optimizer",
        "cpu",
        "--offload-param",
        "cpu",
    )
    check_run(out, 12, stage=3, offload_optimizer="cpu", offload_param="cpu")

    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    ids = tokenizer("Offloading moves the optimizer states to CPU memory.", return_tensors="pt").input_ids
    with torch.no_grad():
        trained = model(input_ids=ids, labels=ids).loss.item()
        fresh = AutoModelForCausalLM.from_config(model.config)(input_ids=ids, labels=ids).loss.item()
    assert trained < fresh  # the exported weights are the trained ones, not a fresh initialisation


def test_zero3_optimizer_and_params_on_nvme(tiny_model, tiny_data, tmp_path):
    model, nvme = swapping_model(tiny_model, tmp_path)
    out = tmp_path / "run"
    args = ["--steps", "10", "--zero-stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme"]
    run_launch(model, tiny_data, out, *args, "--nvme-path", str(nvme))
    run = check_run(out, 10, stage=3, offload_optimizer="nvme", offload_param="nvme")
    assert run["measured"]["nvme_bytes_per_node"] > 4096 * 256 * 2  # swap files were really written
    ds_config = json.loads((out / "ds_config.json").read_text())
    swap = ds_config["zero_optimization"]["offload_param"]["nvme_path"]
    assert swap.startswith(str(nvme) + "/offload-launch-")  # the run's own subfolder
    assert "intra_op_parallelism" in ds_config["aio"]
    assert not os.path.exists(swap)  # a finished run removes its swap files


def test_two_ranks(tiny_model, tiny_data, tmp_path):
    out = tmp_path / "run"
    proc = run_launch(
        tiny_model,
        tiny_data,
        out,
        "--steps",
        "10",
        "--num-gpus",
        "2",
        "--zero-stage",
        "3",
        "--offload-optimizer",
        "cpu",
        "--offload-param",
        "none",
    )
    check_run(out, 10, stage=3, offload_optimizer="cpu", offload_param="none", world=2)
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 2 * 4
    assert "--num_gpus 2" in proc.stdout
    assert "abort" not in proc.stderr.lower()
    import re

    port = re.search(r"--master_port (\d+)", proc.stdout).group(1)
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))  # no leaked 66 MiB buffers


def run_processes(out: Path) -> list:
    """The processes of the run in `out`: every one names its run_spec.json."""
    import psutil

    spec = str(out.resolve() / "run_spec.json")
    return [p for p in psutil.process_iter(["cmdline"]) if spec in " ".join(p.info["cmdline"] or [])]


def gone_within_10_s(out: Path) -> None:
    killed = time.monotonic()
    while run_processes(out) and time.monotonic() - killed < 10:
        time.sleep(0.2)
    assert run_processes(out) == [], "a process of the run outlived the command by 10 s"


def test_a_hard_killed_command_takes_its_run_with_it_at_every_phase_and_the_next_run_resumes(
    tiny_model, tiny_data, tmp_path
):
    """SIGKILL of offload-launch (the OOM killer, a CI job's timeout) while it tokenizes, in the middle of a step, and
    while a checkpoint is written (drills.py's cli@ points): within 10 s no process of the run is left
    (job/supervise.py), the folder's lock is free, the next command starts, and the last one resumes from the
    checkpoint the killed one completed. Then during a JIT build of cpu_adam (a fresh extensions folder): the
    compilers go too, and the lock they leave is stale for the next run (job/build_locks.py)."""
    from launcher.drills import KILL_AT_ENV

    out = tmp_path / "run"
    options = ("--steps", "4", "--save-every", "2", "--zero-stage", "2", "--offload-optimizer", "cpu")
    for cue in ("cli@tokenize:0", "cli@checkpoint:2", "cli@step:3"):
        killed = subprocess.run(
            launch_args(tiny_model, tiny_data, out, *options),
            capture_output=True,
            text=True,
            env={**os.environ, KILL_AT_ENV: cue},
            timeout=600,
        )
        assert killed.returncode == -signal.SIGKILL, (cue, killed.returncode, killed.stderr[-2000:])
        gone_within_10_s(out)
    resumed = run_launch(tiny_model, tiny_data, out, *options)  # the lock is free
    assert "resumed from step" in resumed.stderr and read_metrics(out)[-1]["step"] == 4

    # a JIT build killed with its command: DeepSpeed's lock is left, nothing builds on, the next run clears it
    from launcher.job import build_locks

    extensions = tmp_path / "extensions"

    def building() -> list[int]:
        table = build_locks.processes()
        return [pid for pid, (_, cwd) in table.items() if cwd == extensions or extensions in cwd.parents]

    proc = subprocess.Popen(
        launch_args(tiny_model, tiny_data, tmp_path / "jit", *options),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)},
    )
    deadline = time.monotonic() + 300
    while not (list(extensions.glob(f"*/{build_locks.LOCK_NAME}")) and building()):
        assert proc.poll() is None and time.monotonic() < deadline, "no op build within 5 minutes"
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    gone_within_10_s(tmp_path / "jit")
    killed = time.monotonic()
    while building() and time.monotonic() - killed < 10:
        time.sleep(0.2)
    assert building() == [], "a compiler outlived the command by 10 s"
    later = time.time() + build_locks.LOCK_GRACE_SECONDS + 1
    assert build_locks.stale_locks([extensions], now=later), "the killed build's lock is not seen as stale"


def test_interrupt_and_resume(tiny_model, tiny_data, tmp_path):
    import psutil

    out = tmp_path / "run"
    # 60 steps: the tiny model steps in ~0.03 s, so with 10 a run could finish between two polls of the marker
    options = ("--steps", "60", "--save-every", "2", "--zero-stage", "2", "--offload-optimizer", "cpu")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        launch_args(tiny_model, tiny_data, out, *options),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600

    def complete_at_or_after_step_4() -> bool:  # only the newest 2 are kept: step4's can be gone between two polls
        return any(int(m.parent.name[4:]) >= 4 for m in (out / "checkpoints").glob("step*/complete.json"))

    while not complete_at_or_after_step_4():
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "no checkpoint at step 4 within 10 minutes"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # what a scheduler or Ctrl-C does to offload-launch
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, log[-2000:]  # 128 + SIGTERM, as the README's exit-code table says
    assert "training stopped by SIGTERM (exit 143); the same command resumes after step" in log
    assert not (out / "run.json").exists()
    spec = str(out.resolve() / "run_spec.json")
    ranks = [p for p in psutil.process_iter(["cmdline"]) if spec in " ".join(p.info["cmdline"] or [])]
    assert ranks == [], "a rank outlived SIGTERM"
    interrupted = [m["step"] for m in read_metrics(out)]
    assert 4 <= max(interrupted) < 60

    resumed = run_launch(tiny_model, tiny_data, out, *options)
    assert "resumed from step" in resumed.stderr
    check_run(out, 60, stage=2, offload_optimizer="cpu", offload_param="none")  # every step exactly once
