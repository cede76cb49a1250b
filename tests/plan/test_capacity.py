"""Sizing for a host: swap buffers hold the largest partition DeepSpeed swaps, sub-groups fit the host's RAM."""

from __future__ import annotations

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan.capacity import aligned_partition_numel
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from tests.helpers import host_path


@pytest.fixture(scope="module")
def llama70b():
    return inspect_model("meta-llama/Llama-2-70b-hf")


def plan_for(model, host_text_or_name, write_host=None, **workload):
    path = host_path(host_text_or_name) if write_host is None else write_host(host_text_or_name)
    return make_plan(model, (h := load_host_spec(path)), Workload(**workload), resolve_rates(h))


def test_param_buffer_holds_the_largest_swapped_partition():
    mixtral = inspect_model("mistralai/Mixtral-8x7B")
    assert mixtral.largest_param_numel == 939_524_096  # fused experts (FIELD-NOTES)
    plan = plan_for(mixtral, "1x-a100-80g", zero_stage="3", offload_optimizer="nvme", offload_param="nvme")
    buckets = plan.chosen.buckets
    assert buckets.param_buffer_size >= mixtral.largest_param_numel
    assert buckets.param_buffer_size % 512 == 0
    assert aligned_partition_numel(1000, 4) == 512 and aligned_partition_numel(2049, 1) == 2560


def test_sub_group_size_sized_to_the_host(write_host):
    # 13B, not 70B: ZeRO-3 keeps the 16-bit gradient partition on the CPU with the optimizer on NVMe too
    # (stage3.py grad_partitions_flat_buffer), 2 B/param pinned; its export gathers 26 GB on rank 0 (peaks.py).
    small = "gpus: {count: 1, memory: 80GiB}\ncpu_memory: 80GiB\nnvme: {path: /n, free: 4TB}\n"
    model = inspect_model("meta-llama/Llama-2-13b-hf")
    plan = plan_for(model, small, write_host, zero_stage="3", offload_optimizer="nvme", offload_param="nvme")
    buckets = plan.chosen.buckets
    assert isinstance(buckets.sub_group_size, int) and buckets.sub_group_size < 10**9
    assert plan.chosen.memory.cpu_terms["optimizer swap buffers (pinned)"] <= 0.11 * 80 * 2**30


def test_zero3_live_parameters_are_sized_per_plan_and_written_as_counted(llama70b):
    """The ds_config's stage3_max_live_parameters / stage3_max_reuse_distance are the sized buckets' numbers,
    two of the model's largest blocks (memory.zero3_live_parameter_limit), and the GPU estimate ([DS-live])
    counts exactly that bound: prediction and config agree. The template sets neither key."""
    import json

    from launcher.config import dsconfig
    from launcher.plan.strategy import DS_MAX_LIVE_PARAMETERS
    from launcher.resources import resource_path

    template = json.loads((resource_path("templates") / "zero3.json").read_text())["zero_optimization"]
    assert "stage3_max_live_parameters" not in template and "stage3_max_reuse_distance" not in template
    llama7b = inspect_model("meta-llama/Llama-2-7b-hf")
    # 7B: two blocks of 202 M, under DeepSpeed's 1e9; 70B: two blocks of 856 M, capped at DeepSpeed's 1e9
    for model, limit in ((llama7b, 2 * llama7b.layer_params), (llama70b, DS_MAX_LIVE_PARAMETERS)):
        assert limit == min(2 * model.layer_params, 10**9)
        plan = plan_for(model, "8x-h100-80g", zero_stage="3")
        buckets = plan.chosen.buckets
        assert buckets.max_live_parameters == buckets.max_reuse_distance == limit
        zero = dsconfig.render(plan)["zero_optimization"]
        assert zero["stage3_max_live_parameters"] == zero["stage3_max_reuse_distance"] == limit
        live = plan.chosen.memory.gpu_terms["live parameters"]
        assert live == 2 * (limit + 2 * model.largest_param_numel)


def test_zero3_live_limit_never_exceeds_deepspeeds_default():
    from launcher.plan import memory
    from launcher.plan.strategy import DS_MAX_LIVE_PARAMETERS

    assert memory.zero3_live_parameter_limit(10**9) == DS_MAX_LIVE_PARAMETERS
    assert memory.zero3_live_parameter_limit(1000) == 2000
