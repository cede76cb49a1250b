"""Host buffers: torch's pinned-memory rounding and the one allocator setting the estimate and the ranks share."""

from __future__ import annotations

import pytest

from launcher.plan import host_buffers

GiB = 2**30


def test_pinned_rounding_is_torch_power_of_two():
    assert host_buffers.pinned_bytes(34_488_324_096) == 64 * GiB  # the 35 GB fp32 partition
    assert host_buffers.pinned_bytes(32 * GiB) == 32 * GiB and host_buffers.pinned_bytes(1) == 1
    assert (
        host_buffers.pinned_bytes(100 * 2**20, host_buffers.PINNED_ROUND_LIMIT_BYTES) == 100 * 2**20
    )  # above the limit
    assert host_buffers.pinned_bytes(40 * 2**20, host_buffers.PINNED_ROUND_LIMIT_BYTES) == 64 * 2**20
    assert host_buffers.PINNED_ALLOC_CONF == "pinned_max_round_threshold_mb:64,pinned_max_cached_size_mb:64"


@pytest.mark.parametrize(
    ("accelerator", "environ", "torch", "local", "expected"),
    [
        ("cuda", {}, "2.13.0+cu128", True, host_buffers.PINNED_ALLOC_CONF),  # the one case torch is told
        ("cuda", {}, "2.14.1", True, host_buffers.PINNED_ALLOC_CONF),
        ("cuda", {}, "2.12.0+cu124", True, None),  # the keys do not exist before 2.13
        ("cuda", {}, "garbage", True, None),
        ("cuda", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "2.13.0", True, None),  # the user's wins
        ("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "x"}, "2.13.0", True, None),
        ("cuda", {}, "2.13.0", False, None),  # --hostfile: other machines, their torch unknown
        ("cpu", {}, "2.13.0", True, None),  # no CUDA host allocator
    ],
)
def test_the_allocator_setting_is_one_decision_for_the_estimate_and_the_ranks(
    accelerator, environ, torch, local, expected
):
    conf = host_buffers.pinned_alloc_conf(accelerator, environ, torch, local_ranks=local)
    assert conf == expected
    assert host_buffers.pinned_round_limit(conf) == (host_buffers.PINNED_ROUND_LIMIT_BYTES if expected else None)


def test_offloaded_activations_keep_torchs_cached_rounding_in_the_estimate_and_the_launch():
    """save_on_cpu pins new tensors every micro-batch: under PINNED_ALLOC_CONF those above 64 MiB would be freed and
    pinned again each time, so a strategy that offloads activations runs (and is sized) with torch's default."""
    from dataclasses import replace

    from launcher.inspection.hostspec import load_host_spec
    from launcher.inspection.model import inspect_model
    from launcher.plan.candidates import Inputs, estimate_candidate
    from launcher.plan.planner import make_plan
    from launcher.plan.rates import resolve_rates
    from launcher.plan.workload import Workload
    from tests.helpers import host_path

    host = load_host_spec(host_path("1x-a100-80g"))
    model, workload = inspect_model("meta-llama/Llama-2-7b"), Workload(offload_optimizer="cpu", zero_stage="2")
    plan = make_plan(model, host, workload, resolve_rates(host), alloc_conf=host_buffers.PINNED_ALLOC_CONF)
    offloaded = plan.chosen.strategy
    with_activations = replace(offloaded, offload_activations="cpu")
    assert host_buffers.strategy_alloc_conf(plan.alloc_conf, offloaded) == host_buffers.PINNED_ALLOC_CONF
    assert host_buffers.strategy_alloc_conf(plan.alloc_conf, with_activations) is None

    def cpu_bytes(strategy, alloc_conf):
        inputs = Inputs(model, host, plan.workload, plan.rates, 1, 1, alloc_conf)
        return estimate_candidate(inputs, strategy).memory.cpu_bytes

    conf = host_buffers.PINNED_ALLOC_CONF
    assert cpu_bytes(offloaded, conf) < cpu_bytes(offloaded, None)  # the 64 MiB limit stops the rounding
    assert cpu_bytes(with_activations, conf) == cpu_bytes(with_activations, None)  # not set for this one
