"""End-to-end fixtures: a tiny Llama and its tokenizer made here, trained for real by DeepSpeed on the CPU
accelerator. Compiled ops (cpu_adam, async_io, shm_comm) are cached in ~/.cache/torch_extensions and shared
by every test: only the first launch on a fresh machine compiles them.

The CPU accelerator is pinned for every e2e test, also on a GPU machine (`cpu_accelerator`, autouse): the
planner must plan the CPU host and DeepSpeed must run on it, or the tests fail for the wrong reason. The GPU
tests (tests/gpu) launch with `gpu=True` instead."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_TEXT = REPO / "launcher" / "demo" / "data" / "train.jsonl"
NODE_PEAK_BAND = (0.85, 1.2)  # measured / predicted host RAM per node at its peak (issue 26)
LAUNCH_TIMEOUT_SECONDS = 900  # a fresh machine JIT-compiles DeepSpeed's ops on first use


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """LlamaForCausalLM config (no weights: random init) + a byte-level BPE tokenizer trained on the demo text:
    the GPU check's CPU model (scripts/gpu_check.py builds both, offline)."""
    from scripts.gpu_check import CPU_MODEL, make_model

    return make_model(tmp_path_factory.mktemp("tiny-model"), CPU_MODEL)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A quarter of the demo corpus as jsonl: enough blocks for every test's steps."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    lines = DEMO_TEXT.read_text().splitlines()
    path.write_text("\n".join(lines[: len(lines) // 4]) + "\n")
    return path


# DeepSpeed's accelerator and torch's view of the GPUs (none). The planner reads GPUs through NVML
# (launcher/inspection/host.py), which ignores both, so `cpu_environ` also hides NVML from the launched
# process: a pynvml that cannot be imported is what a host without an NVIDIA driver looks like to it.
CPU_PINS = {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
NO_NVML_STUB = 'raise ImportError("NVML hidden by tests/e2e: this launch plans the CPU host")\n'


@functools.cache
def no_nvml_dir() -> str:
    """A folder whose pynvml cannot be imported, first on the launched process's PYTHONPATH."""
    folder = Path(tempfile.mkdtemp(prefix="offload-launch-no-nvml-"))
    (folder / "pynvml.py").write_text(NO_NVML_STUB)
    return str(folder)


def _python_path(environ: Mapping[str, str], *, nvml: bool) -> str:
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != no_nvml_dir()]
    return os.pathsep.join(parts if nvml else [no_nvml_dir(), *parts])


def cpu_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a launch on DeepSpeed's CPU accelerator, planned for the CPU host, on any machine."""
    return dict(environ, **CPU_PINS, PYTHONPATH=_python_path(environ, nvml=False))


def gpu_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a launch on the GPUs: without the pins above, and without tests/conftest.py's default
    DS_ACCELERATOR=cpu (DeepSpeed picks CUDA itself); a CUDA_VISIBLE_DEVICES the user chose stays."""
    env = {k: v for k, v in environ.items() if k != "DS_ACCELERATOR"}
    if env.get("CUDA_VISIBLE_DEVICES") == "":
        del env["CUDA_VISIBLE_DEVICES"]
    env["PYTHONPATH"] = _python_path(environ, nvml=True)
    return env


@pytest.fixture(autouse=True)
def cpu_accelerator(monkeypatch):
    """Every e2e test's processes (launched through `launch` or straight from os.environ) run on the CPU
    accelerator, planned for the CPU host."""
    for key, value in cpu_environ(os.environ).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)


TRAIN_ARGS = ("--seq-len", "64", "--micro-batch", "4", "--lr", "5e-3", "--warmup-steps", "2")


def launch_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launcher",
        "--model",
        str(model),
        "--data",
        str(data),
        "--output-dir",
        str(out),
        *TRAIN_ARGS,
        *extra,
    ]


def launch(
    model: Path, data: Path, out: Path, *extra: str, env: dict | None = None, gpu: bool = False
) -> subprocess.CompletedProcess:
    """One `offload-launch` training command, whatever its exit status: on the CPU accelerator, planned for
    the CPU host, unless `gpu` (then on the GPUs, as a user would run it)."""
    base = gpu_environ(os.environ) if gpu else cpu_environ(os.environ)
    return subprocess.run(
        launch_args(model, data, out, *extra),
        capture_output=True,
        text=True,
        env=dict(base, HF_HUB_OFFLINE="1", **(env or {})),
        timeout=LAUNCH_TIMEOUT_SECONDS,
        cwd=REPO,
    )


def run_launch(
    model: Path, data: Path, out: Path, *extra: str, env: dict | None = None, gpu: bool = False
) -> subprocess.CompletedProcess:
    """One `offload-launch` training command that must succeed."""
    proc = launch(model, data, out, *extra, env=env, gpu=gpu)
    if proc.returncode != 0:
        raise AssertionError(f"offload-launch exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def check_run(
    out: Path,
    steps: int,
    *,
    stage: int,
    offload_optimizer: str,
    offload_param: str,
    world: int = 1,
    optimizer: str = "DeepSpeedCPUAdam",
    node_peak_band: tuple[float, float] = NODE_PEAK_BAND,
):
    """The files a run leaves, with the right content, and a falling loss."""
    for name in ("plan.json", "ds_config.json", "run_spec.json", "metrics.jsonl", "run.json"):
        assert (out / name).is_file(), name
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    for record in metrics:
        assert {"step", "loss", "lr", "tokens", "tokens_per_s", "step_seconds"} <= set(record)
        assert record["tokens"] == 64 * 4 * world
    run = json.loads((out / "run.json").read_text())
    assert run["zero_stage"] == stage and run["world_size"] == world
    assert (run["offload_optimizer"], run["offload_param"]) == (offload_optimizer, offload_param)
    if offload_optimizer != "none":
        assert run["optimizer"] == optimizer
    assert run["steps"] == steps and run["wall_seconds"] > 0 and run["tokens_per_s"] > 0
    assert run["final_loss"] < run["first_loss"], (run["first_loss"], run["final_loss"])
    assert run["peak_cpu_rss_bytes"] > 0 and run["measured"]["step_seconds"] > 0
    # the plan's predictions sit next to the measurements, with their ratios
    assert run["predicted"]["step_seconds"] > 0 and run["predicted"]["cpu_bytes_per_node"] > 0
    assert run["ratios"]["step_seconds"] > 0
    # the node's true peak (each rank's ru_maxrss and its children's VmHWM, summed over the node's ranks) against the
    # plan's host RAM at its peak moment (plan/peaks.py)
    low, high = node_peak_band
    assert low <= run["ratios"]["cpu_bytes_per_node"] <= high, (run["measured"], run["predicted"])
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert ds_config["zero_optimization"]["stage"] == stage
    assert (out / "final" / "config.json").is_file() and (out / "final" / "tokenizer.json").is_file()
    return run


def swapping_model(tiny_model: Path, folder: Path) -> tuple[Path, Path]:
    """(a variant of the tiny model that DeepSpeed really swaps, an empty NVMe folder), both under `folder`;
    skips the test where DeepSpeed's async_io is not usable. DeepSpeed keeps tensors under 1 MiB (MIN_AIO_BYTES) in
    memory: a 4096 x 256 embedding (2 MiB in bf16) and ~3.3 M parameters in all really swap."""
    from transformers import AutoConfig

    from launcher.inspection.host import aio_usable

    if not aio_usable():
        pytest.skip("DeepSpeed async_io is not usable here: install libaio-dev (make install does, as root)")
    model = folder / "model"
    shutil.copytree(tiny_model, model)
    config = AutoConfig.from_pretrained(model)
    config.vocab_size, config.hidden_size, config.intermediate_size = 4096, 256, 512
    config.save_pretrained(model)
    nvme = folder / "nvme"
    nvme.mkdir()
    return model, nvme
