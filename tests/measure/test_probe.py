"""`offload-launch probe` measures this host for real (quick sizes; launcher/measure/probe.py, run and cached by
job/measuring.py), caches, and later plans use the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.inspection.host import aio_usable, host_id
from launcher.job import measuring
from launcher.measure import cache, probe

CLI_REPORTING_IMPORTS = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print(json.dumps([m for m in ('torch', 'deepspeed') if m in sys.modules]), "
    "file=sys.stderr))\n"
    "from launcher.cli import main\n"
    "sys.argv = ['offload-launch', *sys.argv[1:]]\n"
    "main()\n"
)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow  # the real probe: CPU-Adam and async_io loaded, memory and FLOP rates measured
def test_quick_probe_measures_caches_and_feeds_the_plan(cache_home, tmp_path, tiny_llama_dir):
    args = ["probe", "--quick", "--json"]
    nvme = None
    if aio_usable():
        nvme = tmp_path / "nvme"
        nvme.mkdir()
        args += ["--nvme-path", str(nvme)]
    # a real process: DeepSpeed's op loader redirects file descriptors, which CliRunner's streams lack; at its exit it
    # says which of torch and DeepSpeed it imported: none, the measuring ran in a child that exited first
    # (job/measuring_process.py), so the CLI never initialized CUDA nor held GPU memory on a GPU host
    proc = subprocess.run(
        [sys.executable, "-c", CLI_REPORTING_IMPORTS, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, XDG_CACHE_HOME=str(cache_home)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == [], "the CLI process imported torch or DeepSpeed"
    data = json.loads(proc.stdout)
    figures = data["figures"]
    assert figures["cpu_memory_bandwidth_bytes_per_s"] > 1e8  # > 0.1 GB/s on any machine
    assert figures["cpu_adam_params_per_s"] > 1e6 and data["details"]["cpu_adam_threads"] >= 1
    assert figures["cpu_flops_per_s"] > 1e8
    if nvme is not None:
        assert figures["nvme_read_bytes_per_s"] > 0 and figures["nvme_write_bytes_per_s"] > 0
        assert set(data["aio"]) == {
            "block_size",
            "queue_depth",
            "intra_op_parallelism",
            "single_submit",
            "overlap_events",
            "use_gds",
        }
        assert list(nvme.iterdir()) == []  # the probe cleans up after itself
    cached = cache.load_probe(cache.probe_path(cache_home / "offload-launch"), host_id())
    assert cached is not None and cached["figures"] == figures and cached["date"] == data["date"]

    plan = CliRunner().invoke(cli, ["--model", str(tiny_llama_dir), "--dry-run", "--json"])
    assert plan.exit_code == 0, plan.output
    rates = json.loads(plan.stdout)["rates"]
    assert rates["sources"]["cpu_adam_params_per_s"] == "measured"
    assert rates["cpu_adam_params_per_s"] == pytest.approx(figures["cpu_adam_params_per_s"])


def test_a_probe_of_another_host_is_ignored(cache_home):
    path = cache.probe_path(cache_home / "offload-launch")
    cache.save_probe(
        probe.ProbeResult(host_id="someone-else", date="2026-01-01T00:00:00Z", figures={"x": 1}).to_json(), path
    )
    assert cache.load_probe(path, host_id()) is None
    path.write_text("{damaged")
    assert cache.load_probe(path, host_id()) is None


def test_probe_rejects_a_missing_nvme_path(cache_home, tmp_path):
    result = CliRunner().invoke(cli, ["probe", "--quick", "--nvme-path", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output


def _gpu_host(name: str, tflops=None):
    from dataclasses import replace

    from launcher.inspection.hostspec import load_host_spec
    from tests.helpers import host_path

    host = load_host_spec(host_path("1x-h100-80g"))
    return replace(host, gpus=replace(host.gpus, name=name, tflops=tflops))


def test_matmul_timing_runs_on_the_cpu_and_returns_a_positive_rate():
    rate = probe.measure_matmul(64, 128, 96, device="cpu", repeats=2)
    assert rate > 0
    first, by_width = probe.measure_gpu_matmuls([(64, 160), (128, 352)], tokens=32, device="cpu", repeats=1)
    assert set(by_width) == {"64", "128"} and first == by_width["64"] and all(v > 0 for v in by_width.values())
    assert probe.matmul_shapes(4096, 11008, 2048) == [(2048, 4096, 4096), (2048, 4096, 11008)]


def test_probe_passes_the_models_shapes_to_the_gpu_matmuls(monkeypatch, cache_home, tiny_llama_dir):
    """`probe --model DIR --tokens N` times the GPU matmuls at that model's (hidden, intermediate) (measured in the
    child job/measuring_process.py starts, which calls probe_and_cache as here)."""
    seen = {}

    def fake_run_probe(
        nvme_path, *, quick, has_gpu, log, gpu_shapes=None, gpu_tokens=0, nvme_sweep=(), zero_costs=None
    ):
        seen.update(shapes=gpu_shapes, tokens=gpu_tokens, has_gpu=has_gpu)
        return probe.ProbeResult(host_id="h", date="d", figures={})

    # no GPU here: the probe sees a described H200 and records what it would time, without timing it
    monkeypatch.setattr(measuring, "inspect_host", lambda nvme: _gpu_host("NVIDIA H200"))
    monkeypatch.setattr(measuring, "run_probe", fake_run_probe)
    measuring.probe_and_cache(None, quick=False, log=lambda _line: None, model=str(tiny_llama_dir), tokens=512)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    assert seen == {"shapes": [(config.hidden_size, config.intermediate_size)], "tokens": 512, "has_gpu": True}


def test_a_probe_read_back_keeps_its_layout(cache_home):
    """job/measuring.with_zero_costs saves a cached probe again: its fields stay in ProbeResult's order."""
    path = cache.probe_path(cache_home / "offload-launch")
    path.parent.mkdir(parents=True)
    shuffled = {"details": {"quick": False}, "figures": {"x": 1.0}, "date": "d", "aio": {}, "host_id": host_id()}
    path.write_text(json.dumps(shuffled))
    assert list(cache.load_probe(path, host_id())) == list(
        probe.ProbeResult(host_id="h", date="d", figures={}).to_json()
    )


NVME_UNDER_LIMIT = (
    "import json, sys\n"
    "from launcher.measure.probe import run_probe\n"
    "result = run_probe(sys.argv[1], quick=True, has_gpu=False, log=lambda line: print(line, file=sys.stderr))\n"
    "print(json.dumps({'figures': result.figures, 'details': result.details}))\n"
)


@pytest.mark.slow  # two real quick probes, NVMe through async_io, under a memlock limit without CAP_IPC_LOCK
@pytest.mark.skipif(not aio_usable(), reason="DeepSpeed's async_io needs libaio")
def test_the_nvme_probe_never_aborts_under_a_small_memlock_limit(tmp_path):
    """A pageable buffer made async_io mlock a bounce buffer, which docker's default limit refused with SIGABRT
    (deepspeed_pin_tensor.cpp), leaving probe.bin behind. The probe locks its buffer as a run's swapper does, and
    says in one line why it cannot when the limit is below it (docker's default 8 MiB here; the probe with a
    limit it fits in is test_quick_probe_measures_caches_and_feeds_the_plan's)."""
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop CAP_IPC_LOCK")
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    shell = f'ulimit -l 8192 && exec {sys.executable} -c "$0" {nvme}'
    proc = subprocess.run(
        ["setpriv", "--bounding-set=-ipc_lock", "bash", "-c", shell, NVME_UNDER_LIMIT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(nvme.iterdir()) == []  # nothing left in the user's folder
    assert "nvme_read_bytes_per_s" not in result["figures"] and result["figures"]["cpu_adam_params_per_s"] > 0
    assert "memlock limit 8.0 MiB < the 16.0 MiB buffer" in result["details"]["nvme_not_measured"]
    assert "NVMe not measured: memlock limit" in proc.stderr
