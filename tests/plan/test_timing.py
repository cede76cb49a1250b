"""The step-time model: the seeds' worked examples, the 4 B/param minimum, overlap, choosing by time, advice."""

from __future__ import annotations

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.inspection.rates import ProbeResult, resolve_rates
from launcher.plan import timing
from launcher.plan.memory import Strategy
from launcher.plan.planner import Workload, make_plan
from tests.helpers import host_path

SEVEN_B = 7 * 10**9
SEEDS_RATES = timing.Rates(  # the seeds' example: PCIe 4.0 at 32 GB/s, 150 TFLOP/s of useful compute
    compute_flops_per_s=150e12,
    pcie_bytes_per_s=32e9,
    cpu_adam_params_per_s=80e9 / 12,
    nvme_read_bytes_per_s=7e9,
    nvme_write_bytes_per_s=5e9,
    sources={},
)


ZERO_OFFLOAD = Strategy(2, "cpu")


def seeds_step(tokens: int, strategy: Strategy = ZERO_OFFLOAD) -> timing.StepEstimate:
    return timing.estimate_step(
        SEVEN_B,
        strategy,
        SEEDS_RATES,
        world=1,
        ranks_per_node=1,
        micro_batch=1,
        grad_accum=1,
        seq_len=tokens,
        recompute=False,
        has_gpu=True,
    )


def test_seeds_64k_tokens_hide_the_transfers():
    step = seeds_step(64_000)
    assert step.pcie_bytes_per_step == 28 * 10**9  # 4 B/param, "B = 7e9 x 4 = 28 GB"
    assert step.pcie_seconds_per_step == pytest.approx(0.875)  # "about 0.88 s"
    assert step.compute_seconds_per_step == pytest.approx(17.9, rel=0.01)  # "about 18 s"
    assert step.pcie_seconds_per_step < step.compute_seconds_per_step / 10  # hidden
    assert step.offload_overhead_fraction < 0.10


def test_seeds_512_tokens_transfers_dominate():
    step = seeds_step(512)
    assert step.compute_seconds_per_step == pytest.approx(0.143, rel=0.01)  # "about 0.14 s"
    assert step.pcie_seconds_per_step > 5 * step.compute_seconds_per_step
    assert step.offload_overhead_fraction > 0.9


@pytest.mark.parametrize("world", [1, 4])
def test_zero_offload_moves_the_4_byte_minimum_whatever_the_batch(world):
    for accum in (1, 8):
        overlapped, serial = timing.pcie_bytes(SEVEN_B, Strategy(2, "cpu"), world, accum)
        assert overlapped + serial == 4 * SEVEN_B // world


def test_no_offload_moves_nothing_over_pcie():
    assert timing.pcie_bytes(SEVEN_B, Strategy(3), 8, 4) == (0, 0)
    step = seeds_step(2048, Strategy(2))
    assert step.pcie_bytes_per_step == 0 and step.offload_overhead_fraction == 0


def test_overlap_is_max_and_serial_work_adds():
    step = seeds_step(2048)
    expected = max(step.compute_seconds_per_step, 14e9 / 32e9) + 14e9 / 32e9 + step.cpu_adam_seconds_per_step
    assert step.step_seconds == pytest.approx(expected)


def test_recomputation_costs_a_forward():
    assert timing.flops_per_token(SEVEN_B, recompute=True) == 8 * SEVEN_B
    assert timing.flops_per_token(SEVEN_B, recompute=False) == 6 * SEVEN_B


def test_nvme_traffic():
    read, write = timing.nvme_bytes(SEVEN_B, Strategy(3, "nvme", "nvme"), world=1, ranks_per_node=1, grad_accum=2)
    assert read == 16 * SEVEN_B + 2 * 2 * 2 * SEVEN_B
    assert write == 16 * SEVEN_B + 2 * SEVEN_B


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def test_time_beats_the_fixed_order(llama7b, write_host):
    # 8 GiB GPU: parameters must leave it. 180 GiB RAM (153 GiB usable): the optimizer fits on CPU (opt->cpu +
    # param->nvme needs 148.6 GiB: 16 B/param of fp32 states and gradients, DeepSpeed's 16-bit gradient partition
    # and torch's power-of-two rounding of the pinned buffers) but not with the parameters too (161.3 GiB). Order says
    # opt->nvme + param->cpu first; it swaps 16 B/param to NVMe every step, so opt->cpu + param->nvme is faster.
    host = load_host_spec(
        write_host("gpus: {count: 1, memory: 8GiB}\ncpu_memory: 180GiB\nnvme: {path: /n, free: 2TB}\n")
    )
    plan = make_plan(llama7b, host, Workload())
    both = next(c for c in plan.candidates if c.strategy.label == "ZeRO-3 + opt->cpu + param->cpu")
    assert not both.fits and any("CPU RAM needs" in p for p in both.problems)
    labels = [c.strategy.label for c in plan.candidates if c.fits]
    assert labels.index("ZeRO-3 + opt->nvme + param->cpu") < labels.index("ZeRO-3 + opt->cpu + param->nvme")
    assert plan.chosen.strategy.label == "ZeRO-3 + opt->cpu + param->nvme"
    assert any(r.startswith("runner-up ") and "s/step" in r for r in plan.reasons)


def test_ties_keep_the_framework_order(llama7b):
    # 192 GB RAM: both opt->cpu candidates fit (on 128 GB neither does and the optimizer goes to NVMe)
    plan = make_plan(llama7b, load_host_spec(host_path("1x-rtx4090-24g-192g")), Workload())
    zero2, zero3 = (
        next(c for c in plan.candidates if c.strategy == s) for s in (Strategy(2, "cpu"), Strategy(3, "cpu"))
    )
    assert zero2.fits and zero3.fits
    assert zero2.timing.step_seconds == pytest.approx(zero3.timing.step_seconds)
    assert plan.chosen is zero2


def test_batch_advice_when_offload_dominates(llama7b):
    plan = make_plan(llama7b, load_host_spec(host_path("1x-rtx4090-24g")), Workload(seq_len=512))
    advice = plan.advice
    assert advice["offload_overhead_fraction"] > 0.10
    accum = advice["grad_accum"]
    assert accum["value"] > 1 and accum["offload_overhead_fraction"] <= 0.10
    assert accum["tokens_per_s"] > advice["tokens_per_s"]
    if advice["micro_batch"]:
        assert advice["micro_batch"]["offload_overhead_fraction"] <= 0.10
    assert make_plan(llama7b, load_host_spec(host_path("8x-a100-80g")), Workload()).advice is None


def test_rates_sources(write_host):
    host = load_host_spec(
        write_host(
            "gpus: {count: 1, memory: 80GiB, tflops: 312}\ncpu_memory: 512GiB\n"
            "cpu_adam_params_per_s: 2e9\npcie: {bandwidth: 25GB/s}\n"
            "nvme: {path: /n, free: 4TB, read: 12GB/s, write: 9GB/s}\n"
        )
    )
    rates = resolve_rates(host, None)
    assert rates.compute_flops_per_s == 312e12 * timing.MFU
    assert rates.pcie_bytes_per_s == 25e9 and rates.cpu_adam_params_per_s == 2e9
    assert (rates.nvme_read_bytes_per_s, rates.nvme_write_bytes_per_s) == (12e9, 9e9)
    assert rates.sources["cpu_adam_params_per_s"] == "described"
    assert rates.sources["cpu_memory_bandwidth_bytes_per_s"] == "nominal"
    probe = ProbeResult(host_id="x", date="d", figures={"cpu_adam_params_per_s": 3e9})
    assert resolve_rates(host, probe).cpu_adam_params_per_s == 3e9
    assert resolve_rates(host, probe).sources["cpu_adam_params_per_s"] == "measured"


def test_doubling_accumulation_doubles_compute_not_pcie_bytes():
    def step(accum: int) -> timing.StepEstimate:
        return timing.estimate_step(
            SEVEN_B,
            ZERO_OFFLOAD,
            SEEDS_RATES,
            world=1,
            ranks_per_node=1,
            micro_batch=1,
            grad_accum=accum,
            seq_len=2048,
            recompute=True,
            has_gpu=True,
        )

    one, two = step(4), step(8)
    assert two.compute_seconds_per_step == pytest.approx(2 * one.compute_seconds_per_step)
    assert two.pcie_bytes_per_step == one.pcie_bytes_per_step == 4 * SEVEN_B
    assert two.cpu_adam_seconds_per_step == one.cpu_adam_seconds_per_step
    assert two.offload_overhead_fraction < one.offload_overhead_fraction


def _offload_step(rates: timing.Rates, pinned: bool) -> timing.StepEstimate:
    return timing.estimate_step(
        SEVEN_B,
        ZERO_OFFLOAD,
        rates,
        world=1,
        ranks_per_node=1,
        micro_batch=1,
        grad_accum=1,
        seq_len=1024,
        recompute=False,
        has_gpu=True,
        pinned=pinned,
    )


def test_pageable_copies_use_the_pageable_rate_and_do_not_overlap():
    """pin_memory off: the copies run at the pageable rate (PAGEABLE_TO_PINNED x pinned when not measured)
    and synchronously, so the gradient copies no longer hide behind the backward (issue 13, item 3)."""
    pinned = _offload_step(SEEDS_RATES, pinned=True)
    pageable = _offload_step(SEEDS_RATES, pinned=False)
    assert pageable.pcie_bytes_per_step == pinned.pcie_bytes_per_step == 4 * SEVEN_B
    expected = 4 * SEVEN_B / (32e9 * timing.PAGEABLE_TO_PINNED)
    assert pageable.pcie_seconds_per_step == pytest.approx(expected)
    serial = pageable.compute_seconds_per_step + expected + pageable.cpu_adam_seconds_per_step
    assert pageable.step_seconds == pytest.approx(serial)
    assert pageable.step_seconds > pinned.step_seconds


def test_a_measured_pageable_rate_wins_over_the_ratio():
    from dataclasses import replace

    rates = replace(SEEDS_RATES, pcie_pageable_bytes_per_s=20e9)
    assert rates.host_device_bytes_per_s(False) == 20e9 and rates.host_device_bytes_per_s(True) == 32e9
    assert _offload_step(rates, pinned=False).pcie_seconds_per_step == pytest.approx(4 * SEVEN_B / 20e9)
