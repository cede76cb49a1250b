"""The rates a plan runs on (plan/rates.py): measured > described > nominal, each with its source; a GPU's peak from
its datasheet only for an exact SKU, the probed matmul and CPU rates at the nearest probed width."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.plan import rates as plan_rates
from tests.helpers import host_path


def _gpu_host(name: str, tflops=None):
    host = load_host_spec(host_path("1x-h100-80g"))
    return replace(host, gpus=replace(host.gpus, name=name, tflops=tflops))


def test_an_unknown_gpu_gets_the_nominal_figure_and_says_so():
    rates = plan_rates.resolve_rates(_gpu_host("NVIDIA A10G"))
    assert rates.compute_flops_per_s == pytest.approx(plan_rates.NOMINAL_GPU_TFLOPS * 1e12 * plan_rates.MFU)
    assert rates.sources["gpu_tflops"].startswith("nominal") and "A10G" in rates.sources["gpu_tflops"]
    pcie = plan_rates.resolve_rates(_gpu_host("NVIDIA H100 PCIe"))
    assert pcie.compute_flops_per_s == pytest.approx(756e12 * plan_rates.MFU)
    assert pcie.sources["gpu_tflops"] == "datasheet"


def test_a_measured_gpu_matmul_rate_wins_at_the_nearest_probed_width():
    figures = {"gpu_matmul_flops_per_s": 400e12}  # a probe's figures and details, as plain data
    details = {"gpu_matmul_flops_per_s_by_width": {"1024": 200e12, "4096": 400e12, "8192": 600e12}}
    host = _gpu_host("NVIDIA H100 80GB HBM3", tflops=989)
    rates = plan_rates.resolve_rates(host, figures, details, width=5120)
    assert rates.sources["gpu_tflops"] == "measured"
    assert rates.compute_flops_per_s == pytest.approx(400e12 * plan_rates.STEP_SHARE_OF_MATMUL)
    assert plan_rates.resolve_rates(host, figures, details, width=1000).compute_flops_per_s == pytest.approx(
        200e12 * plan_rates.STEP_SHARE_OF_MATMUL
    )


def test_cpu_rate_is_taken_at_the_nearest_probed_width():
    figures = {"cpu_flops_per_s": 9e9}
    details = {"cpu_flops_per_s_by_width": {"128": 3e9, "1024": 1e9}}
    assert plan_rates.cpu_flops_for_width(details, 100) == 3e9
    assert plan_rates.cpu_flops_for_width(details, 4096) == 1e9
    rates = plan_rates.resolve_rates(load_host_spec(host_path("cpu-only")), figures, details, width=128)
    assert rates.compute_flops_per_s == 3e9 and rates.sources["cpu_flops_per_s"] == "measured"


def test_no_probe_and_an_empty_one_differ_only_in_what_was_tried():
    host = load_host_spec(host_path("cpu-only"))
    assert plan_rates.resolve_rates(host) == plan_rates.resolve_rates(host, {}, {})
    tried = plan_rates.resolve_rates(host, {}, {"zero_tensor_seconds": {}})
    assert tried.sources["zero_tensor_seconds"] == "nominal (not measurable here)"


def test_a_probed_cuda_context_replaces_the_nominal_gigabyte_in_every_estimate():
    from launcher.inspection.model import inspect_model
    from launcher.plan import memory
    from launcher.plan.planner import make_plan
    from launcher.plan.workload import Workload

    host, model = _gpu_host("NVIDIA H100 80GB HBM3"), inspect_model("meta-llama/Llama-2-7b")
    nominal = plan_rates.resolve_rates(host)
    probed = plan_rates.resolve_rates(host, {"cuda_context_bytes": 600 * 2**20})
    assert (nominal.cuda_context_bytes, nominal.sources["cuda_context_bytes"]) == (None, "nominal")
    assert (probed.cuda_context_bytes, probed.sources["cuda_context_bytes"]) == (600 * 2**20, "measured")
    before, after = make_plan(model, host, Workload(), nominal), make_plan(model, host, Workload(), probed)
    for old, new in zip(before.candidates, after.candidates, strict=True):
        assert old.memory.gpu_terms["CUDA context"] == memory.CUDA_CONTEXT_BYTES
        assert new.memory.gpu_terms["CUDA context"] == 600 * 2**20
        assert (
            old.memory.gpu_bytes_per_device - new.memory.gpu_bytes_per_device == memory.CUDA_CONTEXT_BYTES - 600 * 2**20
        )
    assert plan_rates.resolve_rates(load_host_spec(host_path("cpu-only"))).cuda_context_bytes is None
