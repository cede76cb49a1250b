"""ZeRO's per-tensor cost, measured under DeepSpeed (launcher/measure/zero_costs.py, with the configs and the
arithmetic of job/measuring.py)."""

from __future__ import annotations

import pytest

from launcher.job import measuring
from launcher.measure import zero_costs
from launcher.plan.rates import ZERO_TENSOR_SECONDS


def test_each_family_is_its_excess_over_the_bare_model_per_tensor_less_the_per_parameter_part():
    deltas = {"zero12_hook": 0.02, "offload_hook": 0.03, "zero3_hook": 0.2, "zero3_hook_recompute": 0.22}
    deltas["zero3_fetch"] = 0.25
    param_seconds = dict.fromkeys(deltas, 0.0) | {"zero3_hook": 0.01, "zero3_fetch": 0.02}
    costs = zero_costs.per_tensor_costs(deltas, 100, param_seconds)
    assert costs["zero12_hook"] == pytest.approx(2e-4) and costs["offload_hook"] == pytest.approx(3e-4)
    assert costs["zero3_hook"] == pytest.approx(1.9e-3) and costs["zero3_hook_recompute"] == pytest.approx(2.2e-3)
    assert costs["zero3_fetch"] == pytest.approx(0.23 / 100 - 1.9e-3)  # what offloading the parameters adds
    assert set(costs) == set(ZERO_TENSOR_SECONDS)  # every family the step-time model charges
    faster = zero_costs.per_tensor_costs(dict(deltas, zero12_hook=-0.01), 100, param_seconds)
    assert faster["zero12_hook"] == 0  # noise below the bare model is no negative cost
    swamped = zero_costs.per_tensor_costs(dict(deltas, zero3_hook=0.005), 100, param_seconds)
    assert "zero3_hook" not in swamped  # ZeRO-3 cannot be free: the noise swamped it, the nominal figure stays


def test_the_figures_are_found_among_other_printed_lines():
    line = '{"zero3_hook": 0.002, "device": "cpu", "tensors": 57}'
    assert zero_costs._figures(f"DeepSpeed op built successfully\n{line}\n[INFO] done\n")["zero3_hook"] == 0.002
    assert zero_costs._figures("no json here\n[1, 2]\n") is None


def test_the_families_take_turns_within_each_round():
    calls = []

    def timer(name, seconds):
        def timed():
            calls.append(name)
            return seconds[len([c for c in calls if c == name]) - 1]

        return timed

    passes = {"a": timer("a", [9, 9, 1, 2, 3]), "b": timer("b", [9, 9, 5, 5, 7])}
    assert zero_costs.time_rounds(passes, warmup=2, repeats=3) == {"a": 2, "b": 5}
    assert calls == ["a", "b"] * 5


def test_the_excess_is_over_the_bare_model_checkpointed_as_the_family_is():
    medians = {"bare": 1.0, "bare_recompute": 1.5} | dict.fromkeys(zero_costs.FAMILIES, 2.0)
    excess = zero_costs.excess_seconds(medians)
    assert excess["zero3_hook_recompute"] == 0.5 and excess["zero3_hook"] == excess["zero12_hook"] == 1.0


def test_every_family_is_planned_as_offload_launch_writes_it(tmp_path):
    """The probe's engines run the ds_configs the tool writes for each family's strategy."""
    from launcher.inspection.host import inspect_host

    profile, configs = measuring.zero_cost_configs(tmp_path, inspect_host(None))
    assert len(profile.param_numels) == 57  # 6 blocks of 9 tensors, the embedding, the norm and the head
    for family, (stage, optimizer, param, _) in zero_costs.FAMILIES.items():
        zero = configs[family]["zero_optimization"]
        assert str(zero["stage"]) == stage
        assert zero.get("offload_optimizer", {}).get("device", "none") == optimizer
        assert zero.get("offload_param", {}).get("device", "none") == param


@pytest.mark.slow
def test_measured_for_real_under_deepspeed():
    """About 15 s: five engines and the bare model on this host's accelerator (the CPU one here)."""
    from launcher.inspection.host import inspect_host

    said: list[str] = []
    costs = measuring.measure_zero_costs(inspect_host(None), 20e9, log=said.append)["zero_tensor_seconds"]
    assert not [line for line in said if "not measured" in line], said
    assert costs["device"] == "cpu" and costs["tensors"] == 57
    assert 2e-4 < costs["zero3_hook"] < 2e-2  # ms-scale Python hooks (2.4 ms on the 2-core development machine)
    assert costs["zero3_hook"] > 3 * costs["zero12_hook"]  # a fetch and a release per pass against one hook
    assert costs["zero3_hook_recompute"] > 0.8 * costs["zero3_hook"]


def test_a_family_that_does_not_fit_here_leaves_the_nominal_figures(tmp_path):
    """A host whose RAM (or GPU) another job fills: the families' configs cannot be written, and the probe keeps
    its other figures instead of failing; the plan says the cost was not measurable."""
    from dataclasses import replace

    from launcher.inspection.host import inspect_host

    crowded = replace(inspect_host(None), cpu_memory_available_bytes=64 * 2**20)
    said: list[str] = []
    assert measuring.measure_zero_costs(crowded, 20e9, log=said.append) == {"zero_tensor_seconds": {}}
    assert "not measured" in said[-1] and "nominal figures" in said[-1]
