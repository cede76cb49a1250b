"""`offload-launch probe` measures this host for real (quick sizes), caches, and later plans use the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.inspection import rates as probe
from launcher.inspection.host import aio_usable


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
    # a real process: DeepSpeed's op loader redirects file descriptors, which CliRunner's streams lack
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, XDG_CACHE_HOME=str(cache_home)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
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
    cached = probe.load_cached(probe.cache_path(cache_home / "offload-launch"), probe.host_id())
    assert cached is not None and cached.figures == figures and cached.date == data["date"]

    plan = CliRunner().invoke(cli, ["--model", str(tiny_llama_dir), "--dry-run", "--json"])
    assert plan.exit_code == 0, plan.output
    rates = json.loads(plan.stdout)["rates"]
    assert rates["sources"]["cpu_adam_params_per_s"] == "measured"
    assert rates["cpu_adam_params_per_s"] == pytest.approx(figures["cpu_adam_params_per_s"])


def test_a_probe_of_another_host_is_ignored(cache_home):
    path = probe.cache_path(cache_home / "offload-launch")
    probe.save(probe.ProbeResult(host_id="someone-else", date="2026-01-01T00:00:00Z", figures={"x": 1}), path)
    assert probe.load_cached(path, probe.host_id()) is None


def test_probe_rejects_a_missing_nvme_path(cache_home, tmp_path):
    result = CliRunner().invoke(cli, ["probe", "--quick", "--nvme-path", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA GeForce RTX 4090", 165),
        ("Mystery GPU", None),
    ],
)
def test_datasheet_tflops(name, tflops):
    assert probe.gpu_peak_tflops(name) == tflops


def test_cpu_rate_is_taken_at_the_nearest_probed_width():
    result = probe.ProbeResult(
        host_id="h",
        date="d",
        figures={"cpu_flops_per_s": 9e9},
        details={"cpu_flops_per_s_by_width": {"128": 3e9, "1024": 1e9}},
    )
    assert probe.cpu_flops_for_width(result, 100) == 3e9
    assert probe.cpu_flops_for_width(result, 4096) == 1e9
    from launcher.inspection.hostspec import load_host_spec
    from tests.helpers import host_path

    rates = probe.resolve_rates(load_host_spec(host_path("cpu-only")), result, width=128)
    assert rates.compute_flops_per_s == 3e9 and rates.sources["cpu_flops_per_s"] == "measured"
