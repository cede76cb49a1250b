"""`offload-launch probe` measures this host for real (quick sizes), caches, and later plans use the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.inspection import gpu_specs
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
        ("NVIDIA A100 80GB PCIe", 312),
        ("NVIDIA H100 80GB HBM3", 989),  # SXM5
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA A10", 125),
        ("NVIDIA A10G", None),  # AWS's part: no NVIDIA datasheet, and not the A10
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA L4", 121),
        ("NVIDIA GeForce RTX 4090", 165),
        ("NVIDIA GeForce RTX 4090 D", None),  # a different SKU, not a 4090
        ("Tesla V100-SXM2-32GB", 125),
        ("Tesla V100-PCIE-16GB", 112),
        ("Tesla T4", 65),
        ("nvidia  h100  pcie", 756),  # case and runs of spaces do not matter
        ("NVIDIA H100", None),  # which of three H100s? not guessed
        ("NVIDIA H800 PCIe", None),
        ("Mystery GPU", None),
    ],
)
def test_datasheet_tflops_match_exact_skus_only(name, tflops):
    assert gpu_specs.gpu_peak_tflops(name) == tflops
    if tflops is not None:
        assert "datasheet" in gpu_specs.gpu_datasheet(name)[1] or "whitepaper" in gpu_specs.gpu_datasheet(name)[1]


def test_every_table_entry_has_a_source_and_no_entry_matches_another_sku():
    for key, (tflops, source) in gpu_specs.GPU_PEAK_TFLOPS.items():
        assert tflops > 0 and source
        assert gpu_specs.gpu_peak_tflops("NVIDIA " + key) == tflops
        for other in gpu_specs.GPU_PEAK_TFLOPS:  # a name that merely contains another SKU's name is not that SKU
            if other != key and other in key:
                assert gpu_specs.gpu_peak_tflops("NVIDIA " + key) == gpu_specs.GPU_PEAK_TFLOPS[key][0]


def _gpu_host(name: str, tflops=None):
    from dataclasses import replace

    from launcher.inspection.hostspec import load_host_spec
    from tests.helpers import host_path

    host = load_host_spec(host_path("1x-h100-80g"))
    return replace(host, gpus=replace(host.gpus, name=name, tflops=tflops))


def test_an_unknown_gpu_gets_the_nominal_figure_and_says_so():
    rates = probe.resolve_rates(_gpu_host("NVIDIA A10G"), None)
    assert rates.compute_flops_per_s == pytest.approx(probe.NOMINAL_GPU_TFLOPS * 1e12 * probe.MFU)
    assert rates.sources["gpu_tflops"].startswith("nominal") and "A10G" in rates.sources["gpu_tflops"]
    pcie = probe.resolve_rates(_gpu_host("NVIDIA H100 PCIe"), None)
    assert pcie.compute_flops_per_s == pytest.approx(756e12 * probe.MFU) and pcie.sources["gpu_tflops"] == "datasheet"


def test_a_measured_gpu_matmul_rate_wins_at_the_nearest_probed_width():
    result = probe.ProbeResult(
        host_id="h",
        date="d",
        figures={"gpu_matmul_flops_per_s": 400e12},
        details={"gpu_matmul_flops_per_s_by_width": {"1024": 200e12, "4096": 400e12, "8192": 600e12}},
    )
    host = _gpu_host("NVIDIA H100 80GB HBM3", tflops=989)
    rates = probe.resolve_rates(host, result, width=5120)
    assert rates.sources["gpu_tflops"] == "measured"
    assert rates.compute_flops_per_s == pytest.approx(400e12 * probe.STEP_SHARE_OF_MATMUL)
    assert probe.resolve_rates(host, result, width=1000).compute_flops_per_s == pytest.approx(
        200e12 * probe.STEP_SHARE_OF_MATMUL
    )


def test_matmul_timing_runs_on_the_cpu_and_returns_a_positive_rate():
    rate = probe.measure_matmul(64, 128, 96, device="cpu", repeats=2)
    assert rate > 0
    first, by_width = probe.measure_gpu_matmuls([(64, 160), (128, 352)], tokens=32, device="cpu", repeats=1)
    assert set(by_width) == {"64", "128"} and first == by_width["64"] and all(v > 0 for v in by_width.values())
    assert probe.matmul_shapes(4096, 11008, 2048) == [(2048, 4096, 4096), (2048, 4096, 11008)]


def test_probe_passes_the_models_shapes_to_the_gpu_matmuls(monkeypatch, cache_home, tiny_llama_dir):
    """`probe --model DIR --tokens N` times the GPU matmuls at that model's (hidden, intermediate)."""
    from launcher.inspection import host as host_module

    seen = {}

    def fake_run_probe(nvme_path, *, quick, has_gpu, log, gpu_shapes=None, gpu_tokens=0, nvme_sweep=()):
        seen.update(shapes=gpu_shapes, tokens=gpu_tokens, has_gpu=has_gpu)
        return probe.ProbeResult(host_id="h", date="d", figures={})

    monkeypatch.setattr(host_module, "inspect_host", lambda nvme: _gpu_host("NVIDIA H200"))
    monkeypatch.setattr(probe, "run_probe", fake_run_probe)
    result = CliRunner().invoke(cli, ["probe", "--model", str(tiny_llama_dir), "--tokens", "512", "--json"])
    assert result.exit_code == 0, result.output
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    assert seen == {"shapes": [(config.hidden_size, config.intermediate_size)], "tokens": 512, "has_gpu": True}


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
