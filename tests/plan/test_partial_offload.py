"""Partial optimizer offload (DeepSpeed's Twin-Flow, `offload_optimizer.ratio`, subgroups.py [Twin-Flow]): the split
DeepSpeed really makes, what each half costs, and the planner's choice of the share."""

from __future__ import annotations

import types
from dataclasses import replace

import pytest

from launcher.config import dsconfig
from launcher.config.keys import strategy_of
from launcher.config.merge import pins_from_config
from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import subgroups
from launcher.plan.candidates import Inputs, estimate_candidate
from launcher.plan.capacity import model_shape, size_buckets, usable_gpu_bytes
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import Strategy
from launcher.plan.workload import Workload
from tests.helpers import host_path


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def host(name):
    return load_host_spec(host_path(name))


def plan_for(model, name, **workload):
    return make_plan(model, (h := host(name)), Workload(**workload), resolve_rates(h))


# ------------------------------------------------------------------------------------------ the split


def test_sub_groups_are_formed_as_deepspeed_forms_them(llama7b):
    """subgroups.stage3_subgroups against DeepSpeed's own `_create_fp16_sub_groups`, run on the model's tensors."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    for world, sub_group_size in ((1, 337_000_000), (2, 10**9), (8, 50_000_000), (1, 10**10)):
        params = [types.SimpleNamespace(partition_numel=lambda n=n, w=world: -(-n // w)) for n in llama7b.param_numels]
        theirs = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(
            types.SimpleNamespace(sub_group_size=sub_group_size), params
        )
        shape = ModelShape(
            llama7b.params, llama7b.largest_param_numel, 0, 0, 0, 0, 0, param_numels=llama7b.param_numels
        )
        ours = subgroups.stage3_subgroups(shape, world, sub_group_size)
        assert ours == [sum(p.partition_numel() for p in group) for group in theirs]


@pytest.mark.parametrize("groups", range(1, 65))
def test_the_written_ratio_keeps_exactly_the_sub_groups_planned(groups):
    for on_gpu in range(groups + 1):
        ratio = subgroups.ratio_keeping(on_gpu, groups)
        assert 0 <= ratio <= 1
        # stage3.py `_create_fp32_partitions`: sub-group i stays on the GPU when i < int((1 - ratio) * groups)
        assert sum(i < int((1 - ratio) * groups) for i in range(groups)) == on_gpu


def test_both_halves_are_counted_and_nothing_twice(llama7b):
    a100 = host("1x-a100-80g")
    inputs = Inputs(llama7b, a100, Workload(seq_len=2048), resolve_rates(a100), 1, 1)
    full = estimate_candidate(inputs, Strategy(3, "cpu"))
    half = estimate_candidate(inputs, Strategy(3, "cpu", offload_ratio=0.5))
    on_gpu = half.memory.gpu_terms["fp32 optimizer states (GPU share)"]
    on_cpu = half.memory.cpu_terms["fp32 optimizer states"]
    assert on_gpu + on_cpu == full.memory.cpu_terms["fp32 optimizer states"]  # 12 B/param, split
    # half the sub-groups, about half the elements (a group closes on the tensor that reaches sub_group_size)
    assert on_gpu == pytest.approx(0.5 * 12 * llama7b.params, rel=0.1)
    grads = half.memory.gpu_terms["fp32 gradient partition (GPU share)"]
    assert grads + half.memory.cpu_terms["fp32 gradient partition"] == 4 * llama7b.params
    # the 16-bit gradient partition stays on the CPU whole (stage3.py grad_partitions_flat_buffer)
    assert half.memory.cpu_terms["16-bit gradient partition"] == full.memory.cpu_terms["16-bit gradient partition"]
    # the GPU's share is stepped there: less CPU-Adam, fewer weights uploaded, a faster step
    assert half.timing.cpu_adam_seconds_per_step < full.timing.cpu_adam_seconds_per_step
    assert half.timing.pcie_bytes_per_step < full.timing.pcie_bytes_per_step
    assert half.timing.step_seconds < full.timing.step_seconds


# ------------------------------------------------------------------------------------------ the choice


def test_80gb_keeps_the_largest_share_that_fits(llama7b):
    plan = plan_for(llama7b, "1x-a100-80g")
    chosen = plan.chosen
    assert chosen.strategy.partial and chosen.strategy.label == f"ZeRO-3 + opt->cpu {chosen.strategy.offload_ratio:.0%}"
    a100 = host("1x-a100-80g")
    assert chosen.memory.gpu_bytes_per_device <= usable_gpu_bytes(a100)
    # one more sub-group on the GPU would not fit
    buckets = size_buckets(llama7b, a100, chosen.strategy, 1, 1)
    groups = len(subgroups.stage3_subgroups(model_shape(llama7b, buckets), 1, buckets.sub_group_size))
    kept = subgroups.gpu_subgroup_count(groups, chosen.strategy.offload_ratio)
    more = Strategy(3, "cpu", offload_ratio=subgroups.ratio_keeping(kept + 1, groups))
    assert not estimate_candidate(Inputs(llama7b, a100, plan.workload, plan.rates, 1, 1), more).fits
    full = next(c for c in plan.candidates if c.strategy == Strategy(3, "cpu"))
    assert full.timing.step_seconds > 1.4 * chosen.timing.step_seconds
    reason = next(r for r in plan.reasons if r.startswith("partial optimizer offload"))
    assert "Twin-Flow" in reason and f"ratio {chosen.strategy.offload_ratio:g}" in reason
    config = dsconfig.render(plan)
    assert config["zero_optimization"]["offload_optimizer"]["ratio"] == chosen.strategy.offload_ratio
    assert config["zero_optimization"]["sub_group_size"] == buckets.sub_group_size
    dsconfig.validate(config, 1)  # the JSON Schema and DeepSpeed's own models
    assert strategy_of(config) == chosen.strategy
    assert chosen.strategy.to_json()["offload_ratio"] == chosen.strategy.offload_ratio


def test_no_partial_offload_where_the_gpu_has_no_room_or_needs_no_offload(llama7b):
    small = plan_for(llama7b, "1x-rtx4090-24g-192g")  # 24 GB: all of it goes to the CPU
    assert small.chosen.strategy == Strategy(2, "cpu")
    assert small.chosen.strategy.to_json()["offload_ratio"] == 1.0
    assert "ratio" not in dsconfig.render(small)["zero_optimization"]["offload_optimizer"]
    roomy = plan_for(llama7b, "8x-a100-80g")  # every state fits on the GPUs: no offload at all
    assert not roomy.chosen.strategy.offloads and "offload_ratio" not in roomy.chosen.strategy.to_json()
    cpu_only = plan_for(llama7b, "cpu-only")  # the CPU accelerator steps a "GPU" share on the CPU anyway
    assert not any(c.strategy.partial for c in cpu_only.candidates)


def test_the_ratio_can_be_pinned_and_is_checked(llama7b):
    plan = plan_for(llama7b, "1x-a100-80g", offload_ratio=0.7)
    assert plan.chosen.strategy == Strategy(3, "cpu", offload_ratio=0.7)
    assert plan.chosen.strategy.label == "ZeRO-3 + opt->cpu 70%"
    assert all(c.strategy.offload_ratio == 0.7 for c in plan.candidates if c.strategy.offload_optimizer == "cpu")
    full = plan_for(llama7b, "1x-a100-80g", offload_ratio=1.0)
    assert full.chosen.strategy.offload_optimizer != "none" and not full.chosen.strategy.partial
    for bad, message in (
        (dict(offload_ratio=1.5), "--offload-ratio must be above 0 and at most 1"),
        (dict(offload_ratio=0.0), "--offload-ratio must be above 0"),
        (dict(offload_ratio=0.5, zero_stage="2"), "needs ZeRO-3"),
        (dict(offload_ratio=0.5, offload_optimizer="nvme"), "needs --offload-optimizer cpu"),
    ):
        with pytest.raises(UserInputError, match=message):
            Workload(**bad)


def test_a_users_ds_config_pins_its_ratio_or_deepspeeds_default():
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}
    assert pins_from_config(config)["offload_ratio"] == 0.3
    assert strategy_of(config) == Strategy(3, "cpu", offload_ratio=0.3)
    del config["zero_optimization"]["offload_optimizer"]["ratio"]
    assert pins_from_config(config)["offload_ratio"] == 1.0  # DeepSpeed offloads it all unless told
    config["zero_optimization"]["stage"] = 2
    assert "offload_ratio" not in pins_from_config(config)


def test_partial_offload_on_a_pinned_cpu_host_is_planned_as_asked(llama7b):
    plan = plan_for(llama7b, "cpu-only", offload_ratio=0.5, seq_len=128)
    candidate = next(c for c in plan.candidates if c.strategy.partial)
    full = estimate_candidate(Inputs(llama7b, plan.host, plan.workload, plan.rates, 1, 1), Strategy(3, "cpu"))
    # timed as the full offload it really is there (every sub-group stepped by CPU-Adam)
    assert candidate.timing.cpu_adam_seconds_per_step == full.timing.cpu_adam_seconds_per_step
    assert replace(candidate.strategy, offload_ratio=1.0) == full.strategy
