"""plan/fit.py: when nothing fits, the candidate that misses by the least is named, with its shortfall."""

from __future__ import annotations

from dataclasses import replace

from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import capacity
from launcher.plan.fit import closest_shortfall
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from launcher.units import GiB, fmt_bytes
from tests.helpers import host_path


def test_the_closest_candidate_misses_by_the_least_and_says_by_how_much():
    host = load_host_spec(host_path("1x-rtx4090-24g"))
    host = replace(host, cpu_memory_bytes=48 * GiB, cpu_memory_available_bytes=48 * GiB, nvme=None)
    plan = make_plan(inspect_model("meta-llama/Llama-2-13b-hf"), host, Workload(), resolve_rates(host))
    assert plan.chosen is None

    def worst(candidate) -> float:
        ratios = [candidate.memory.cpu_bytes / capacity.usable_cpu_bytes(host)]
        ratios.append(candidate.memory.gpu_bytes_per_device / capacity.usable_gpu_bytes(host))
        return max(ratios) if not candidate.memory.nvme_bytes else float("inf")

    best = min(plan.candidates, key=worst)
    assert best is not plan.candidates[0]  # not the first in table order (ZeRO-1, the farthest)
    said = closest_shortfall(plan)
    assert said.startswith(f"{best.strategy.label} (")
    cpu_short = best.memory.cpu_bytes - capacity.usable_cpu_bytes(host)
    gpu_short = best.memory.gpu_bytes_per_device - capacity.usable_gpu_bytes(host)
    tier, short = (
        ("CPU RAM", cpu_short)
        if worst(best) == best.memory.cpu_bytes / capacity.usable_cpu_bytes(host)
        else ("GPU", gpu_short)
    )
    assert said.endswith(f"; {fmt_bytes(short)} short of {tier})")
