"""The step-time model: the seeds' worked examples, the 4 B/param minimum, overlap, choosing by time, advice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import timing
from launcher.plan.compute import (
    NONMATMUL_BYTES_PER_HIDDEN,
    NONMATMUL_CROSS_BYTES_PER_HIDDEN,
    compute_seconds,
    cpu_adam_seconds,
    flops_per_token,
)
from launcher.plan.framework import STEP_FIXED_SECONDS, ZERO_PASS_BYTES_PER_PARAM, framework_seconds
from launcher.plan.planner import make_plan
from launcher.plan.rates import MFU, PAGEABLE_TO_PINNED, ZERO_TENSOR_SECONDS, Rates, resolve_rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import Strategy
from launcher.plan.traffic import HOST_UPDATE_BYTES_PER_PARAM, Transfers, nvme_bytes, pcie_bytes, transfers
from launcher.plan.workload import Workload
from tests.helpers import host_path

SEVEN_B = 7 * 10**9
SEEDS_RATES = Rates(  # the seeds' example: PCIe 4.0 at 32 GB/s, 150 TFLOP/s of useful compute
    compute_flops_per_s=150e12,
    pcie_bytes_per_s=32e9,
    cpu_adam_params_per_s=80e9 / 12,
    nvme_read_bytes_per_s=7e9,
    nvme_write_bytes_per_s=5e9,
    sources={},
)


ZERO_OFFLOAD = Strategy(2, "cpu")


def shape(tokens: int, grad_accum: int = 1, recompute: bool = False) -> Shape:
    """The seeds' examples: 7 B parameters and nothing else known of the shape (FLOPs are 6·P per token)."""
    return Shape(SEVEN_B, SEVEN_B, seq_len=tokens, grad_accum=grad_accum, recompute=recompute)


def seeds_step(tokens: int, strategy: Strategy = ZERO_OFFLOAD) -> timing.StepEstimate:
    return timing.estimate_step(shape(tokens), strategy, SEEDS_RATES, world=1, ranks_per_node=1, has_gpu=True)


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
        overlapped, serial = pcie_bytes(SEVEN_B, Strategy(2, "cpu"), world, accum)
        assert overlapped + serial == 4 * SEVEN_B // world


def test_no_offload_moves_nothing_over_pcie():
    assert pcie_bytes(SEVEN_B, Strategy(3), 8, 4) == (0, 0)
    step = seeds_step(2048, Strategy(2))
    assert step.pcie_bytes_per_step == 0 and step.offload_overhead_fraction == 0


def test_overlap_is_max_and_serial_work_adds():
    step = seeds_step(2048)
    expected = max(step.compute_seconds_per_step, 14e9 / 32e9) + 14e9 / 32e9 + step.cpu_adam_seconds_per_step
    assert step.step_seconds == pytest.approx(expected + STEP_FIXED_SECONDS)
    assert step.passes_seconds == pytest.approx(max(step.compute_seconds_per_step, 14e9 / 32e9))
    assert step.passes_seconds + step.update_seconds == pytest.approx(step.step_seconds)


def test_recomputation_costs_a_forward():
    assert flops_per_token(SEVEN_B, recompute=True) == 8 * SEVEN_B
    assert flops_per_token(SEVEN_B, recompute=False) == 6 * SEVEN_B


def test_nvme_traffic():
    read, write = nvme_bytes(SEVEN_B, Strategy(3, "nvme", "nvme"), world=1, ranks_per_node=1, grad_accum=2)
    assert read == 12 * SEVEN_B + 2 * 2 * 2 * SEVEN_B  # master, m, v in; the parameters fetched twice per micro-batch
    assert write == 12 * SEVEN_B + 2 * SEVEN_B  # master, m, v out; the updated 16-bit parameters


def test_the_optimizer_swap_costs_its_slower_direction():
    """[ZeRO-Inf] a sub-group's write overlaps the next one's read."""
    step = timing.estimate_step(shape(2048), Strategy(3, "nvme"), SEEDS_RATES, world=1, ranks_per_node=1, has_gpu=True)
    assert step.nvme_seconds_per_step == pytest.approx(max(12 * SEVEN_B / 7e9, 12 * SEVEN_B / 5e9))


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
    plan = make_plan(llama7b, host, Workload(), resolve_rates(host))
    both = next(c for c in plan.candidates if c.strategy.label == "ZeRO-3 + opt->cpu + param->cpu")
    assert not both.fits and any("CPU RAM needs" in p for p in both.problems)
    labels = [c.strategy.label for c in plan.candidates if c.fits]
    assert labels.index("ZeRO-3 + opt->nvme + param->cpu") < labels.index("ZeRO-3 + opt->cpu + param->nvme")
    assert plan.chosen.strategy.label == "ZeRO-3 + opt->cpu + param->nvme"
    assert any(r.startswith("runner-up ") and "s/step" in r for r in plan.reasons)


def test_zero3_costs_its_hooks_so_zero2_wins_at_the_same_offload(llama7b):
    # 192 GB RAM: both opt->cpu candidates fit (on 128 GB neither does and the optimizer goes to NVMe); they move
    # the same bytes, and ZeRO-3 adds its per-tensor gather/release hooks [DS-hooks]
    plan = make_plan(llama7b, (h := load_host_spec(host_path("1x-rtx4090-24g-192g"))), Workload(), resolve_rates(h))
    zero2, zero3 = (
        next(c for c in plan.candidates if c.strategy == s) for s in (Strategy(2, "cpu"), Strategy(3, "cpu"))
    )
    assert zero2.fits and zero3.fits
    assert zero3.timing.step_seconds - zero2.timing.step_seconds == pytest.approx(
        zero3.timing.framework_seconds_per_step - zero2.timing.framework_seconds_per_step
    )
    assert zero3.timing.framework_seconds_per_step > 3 * zero2.timing.framework_seconds_per_step
    assert plan.chosen is zero2


def test_batch_advice_when_offload_dominates(llama7b):
    plan = make_plan(
        llama7b, (h := load_host_spec(host_path("1x-rtx4090-24g"))), Workload(seq_len=512), resolve_rates(h)
    )
    advice = plan.advice
    assert advice["offload_overhead_fraction"] > 0.10
    accum = advice["grad_accum"]
    assert accum["value"] > 1 and accum["offload_overhead_fraction"] <= 0.10
    assert accum["tokens_per_s"] > advice["tokens_per_s"]
    if advice["micro_batch"]:
        assert advice["micro_batch"]["offload_overhead_fraction"] <= 0.10
    assert (
        make_plan(llama7b, (h := load_host_spec(host_path("8x-a100-80g"))), Workload(), resolve_rates(h)).advice is None
    )


def test_rates_sources(write_host):
    host = load_host_spec(
        write_host(
            "gpus: {count: 1, memory: 80GiB, tflops: 312}\ncpu_memory: 512GiB\n"
            "cpu_adam_params_per_s: 2e9\npcie: {bandwidth: 25GB/s}\n"
            "nvme: {path: /n, free: 4TB, read: 12GB/s, write: 9GB/s}\n"
        )
    )
    rates = resolve_rates(host)
    assert rates.compute_flops_per_s == 312e12 * MFU
    assert rates.pcie_bytes_per_s == 25e9 and rates.cpu_adam_params_per_s == 2e9
    assert (rates.nvme_read_bytes_per_s, rates.nvme_write_bytes_per_s) == (12e9, 9e9)
    assert rates.sources["cpu_adam_params_per_s"] == "described"
    assert rates.sources["cpu_memory_bandwidth_bytes_per_s"] == "nominal"
    figures = {"cpu_adam_params_per_s": 3e9}  # a probe's figures
    assert resolve_rates(host, figures, {}).cpu_adam_params_per_s == 3e9
    assert resolve_rates(host, figures, {}).sources["cpu_adam_params_per_s"] == "measured"


def test_doubling_accumulation_doubles_compute_not_pcie_bytes():
    def step(accum: int) -> timing.StepEstimate:
        return timing.estimate_step(
            shape(2048, accum, recompute=True), ZERO_OFFLOAD, SEEDS_RATES, world=1, ranks_per_node=1, has_gpu=True
        )

    one, two = step(4), step(8)
    assert two.compute_seconds_per_step == pytest.approx(2 * one.compute_seconds_per_step)
    assert two.pcie_bytes_per_step == one.pcie_bytes_per_step == 4 * SEVEN_B
    assert two.cpu_adam_seconds_per_step == one.cpu_adam_seconds_per_step
    assert two.offload_overhead_fraction < one.offload_overhead_fraction


def _offload_step(rates: Rates, pinned: bool) -> timing.StepEstimate:
    return timing.estimate_step(
        shape(1024), ZERO_OFFLOAD, rates, world=1, ranks_per_node=1, has_gpu=True, pinned=pinned
    )


def test_pageable_copies_use_the_pageable_rate_and_do_not_overlap():
    """pin_memory off: the copies run at the pageable rate (PAGEABLE_TO_PINNED x pinned when not measured)
    and synchronously, so the gradient copies no longer hide behind the backward (issue 13, item 3)."""
    pinned = _offload_step(SEEDS_RATES, pinned=True)
    pageable = _offload_step(SEEDS_RATES, pinned=False)
    assert pageable.pcie_bytes_per_step == pinned.pcie_bytes_per_step == 4 * SEVEN_B
    expected = 4 * SEVEN_B / (32e9 * PAGEABLE_TO_PINNED)
    assert pageable.pcie_seconds_per_step == pytest.approx(expected)
    serial = pageable.compute_seconds_per_step + expected + pageable.cpu_adam_seconds_per_step
    assert pageable.step_seconds == pytest.approx(serial + STEP_FIXED_SECONDS)
    assert pageable.step_seconds > pinned.step_seconds


def test_a_measured_pageable_rate_wins_over_the_ratio():

    rates = replace(SEEDS_RATES, pcie_pageable_bytes_per_s=20e9)
    assert rates.host_device_bytes_per_s(False) == 20e9 and rates.host_device_bytes_per_s(True) == 32e9
    assert _offload_step(rates, pinned=False).pcie_seconds_per_step == pytest.approx(4 * SEVEN_B / 20e9)


# ------------------------------------------------------------------------------------------ the terms (issue 14)


def test_attention_adds_narayanans_term():
    """[Narayanan] 12·L·s·h per token (16 with recomputation) beside the weights' 6·P (8·P)."""
    assert flops_per_token(SEVEN_B, False, layers=32, hidden=4096, seq_len=2048) == (
        6 * SEVEN_B + 12 * 32 * 2048 * 4096
    )
    assert flops_per_token(SEVEN_B, True, layers=32, hidden=4096, seq_len=2048) == (8 * SEVEN_B + 16 * 32 * 2048 * 4096)


def test_the_elementwise_work_runs_at_device_memory_bandwidth_and_matters_for_small_hidden_sizes():
    rates = replace(SEEDS_RATES, device_memory_bytes_per_s=2e12)
    wide = Shape(SEVEN_B, SEVEN_B, layers=32, hidden=4096, seq_len=2048)
    narrow = Shape(SEVEN_B, SEVEN_B, layers=512, hidden=1024, seq_len=2048)  # the same P, thin and deep
    flops_only = compute_seconds(wide, SEEDS_RATES)
    elementwise = 3 * NONMATMUL_BYTES_PER_HIDDEN * 4096 * 32 * 2048 / 2e12
    assert compute_seconds(wide, rates) == pytest.approx(flops_only + elementwise)
    assert compute_seconds(narrow, rates) > 2 * compute_seconds(wide, rates) - flops_only


def test_few_tokens_per_micro_batch_are_memory_bound():
    """[roofline] one token per micro-batch still streams every weight three times."""
    rates = replace(SEEDS_RATES, device_memory_bytes_per_s=2e12)
    one_token = Shape(SEVEN_B, SEVEN_B, seq_len=1)
    assert compute_seconds(one_token, rates) == pytest.approx(3 * 2 * SEVEN_B / 2e12)


def test_measured_passes_replace_the_flops_and_scale_with_the_tokens():
    rates = replace(SEEDS_RATES, passes_per_layer_seconds=0.01, passes_fixed_seconds=0.005, passes_tokens=512)
    measured = Shape(SEVEN_B, SEVEN_B, layers=4, seq_len=128, micro_batch=4, grad_accum=3)
    assert compute_seconds(measured, rates) == pytest.approx(3 * (4 * 0.01 + 0.005))
    doubled = replace(measured, micro_batch=8)  # batch advice asks about another micro-batch
    assert compute_seconds(doubled, rates) == pytest.approx(2 * compute_seconds(measured, rates))


def test_parameters_offloaded_with_the_optimizer_on_the_gpu_send_the_update_back():
    moved = transfers(SEVEN_B, Strategy(3, "none", "cpu"), world=1, grad_accum=2)
    assert moved == Transfers(gradients=0, fetches=2 * 2 * 2 * SEVEN_B, weights=2 * SEVEN_B)
    both = transfers(SEVEN_B, Strategy(3, "cpu", "cpu"), world=1, grad_accum=2)
    assert both.weights == 0  # the optimizer's host copy is the parameters' home


def test_cpu_adam_runs_at_the_rate_measured_for_a_ranks_threads():
    """4 ranks on 16 cores: each steps with 4 threads (OMP_NUM_THREADS), at the rate the probe measured there."""
    rates = replace(SEEDS_RATES, cpu_cores=16, cpu_adam_params_per_s_by_threads={16: 8e9, 4: 3e9})
    assert rates.adam_params_per_s_per_rank(4) == 3e9
    assert rates.adam_params_per_s_per_rank(1) == 8e9
    assert rates.adam_params_per_s_per_rank(2) == SEEDS_RATES.cpu_adam_params_per_s / 2  # 8 threads: not measured
    assert cpu_adam_seconds(SEVEN_B, world=4, ranks_per_node=4, rates=rates) == pytest.approx(SEVEN_B / 4 / 3e9)


def test_host_copies_share_the_nodes_bandwidth_between_its_ranks():
    rates = replace(SEEDS_RATES, cpu_memory_bytes_per_s=100e9)

    def host_seconds(ranks: int) -> float:
        step = timing.estimate_step(shape(2048), ZERO_OFFLOAD, rates, world=ranks, ranks_per_node=ranks, has_gpu=True)
        return step.host_copy_seconds_per_step

    assert host_seconds(1) == pytest.approx(HOST_UPDATE_BYTES_PER_PARAM * SEVEN_B / 100e9)
    assert host_seconds(4) == pytest.approx(host_seconds(1))  # a quarter of the parameters at a quarter of the rate


def test_zero_pays_per_tensor_and_per_parameter():
    """[DS-hooks] ZeRO-3: every tensor every pass (more with the parameters offloaded); ZeRO-2 with the optimizer
    offloaded: every tensor once per micro-batch; without offload no per-tensor hook. On the CPU accelerator each also
    streams its bytes per parameter through the host's memory; on a GPU those are not charged."""
    hooked = Shape(SEVEN_B, SEVEN_B, param_tensors=291, seq_len=2048, grad_accum=2, recompute=True)
    rates = replace(SEEDS_RATES, cpu_memory_bytes_per_s=50e9)

    def framework(strategy: Strategy, has_gpu: bool = False) -> float:
        return framework_seconds(hooked, strategy, world=1, ranks_per_node=1, rates=rates, has_gpu=has_gpu)

    def per_param(key) -> float:
        return ZERO_PASS_BYTES_PER_PARAM[key] * SEVEN_B / 50e9 * 2

    nominal = ZERO_TENSOR_SECONDS
    assert framework(Strategy(2)) == pytest.approx(nominal["zero12_hook"] * 291 * 2 + per_param((False, False, "none")))
    assert framework(Strategy(2), has_gpu=True) == pytest.approx(nominal["zero12_hook"] * 291 * 2)
    assert framework(Strategy(2, "cpu")) == pytest.approx(
        nominal["offload_hook"] * 291 * 2 + per_param((False, True, "none"))
    )
    hooks = nominal["zero3_hook_recompute"] + nominal["zero3_fetch"]  # the shape recomputes
    assert framework(Strategy(3, "cpu", "cpu")) == pytest.approx(hooks * 291 * 2 + per_param((True, True, "cpu")))
    assert framework(Strategy(3, "cpu", "cpu"), has_gpu=True) == pytest.approx(hooks * 291 * 2)
    assert framework(Strategy(3), has_gpu=True) == pytest.approx(nominal["zero3_hook_recompute"] * 291 * 2)


def test_a_host_measured_per_tensor_cost_replaces_the_nominal_one():
    """measure/zero_costs.py's figures (Rates.zero_tensor_seconds) win, family by family."""
    hooked = Shape(SEVEN_B, SEVEN_B, param_tensors=100, seq_len=2048, grad_accum=1, recompute=False)
    measured = replace(SEEDS_RATES, zero_tensor_seconds={"zero3_hook": 2e-3, "zero12_hook": 1e-4})

    def framework(strategy: Strategy, rates) -> float:
        return framework_seconds(hooked, strategy, world=1, ranks_per_node=1, rates=rates, has_gpu=True)

    assert framework(Strategy(3), measured) == pytest.approx(2e-3 * 100)
    assert framework(Strategy(2), measured) == pytest.approx(1e-4 * 100)
    fetch = ZERO_TENSOR_SECONDS["zero3_fetch"]  # not measured: nominal
    assert framework(Strategy(3, "cpu", "cpu"), measured) == pytest.approx((2e-3 + fetch) * 100)
    assert framework(Strategy(2, "cpu"), measured) == framework(Strategy(2, "cpu"), SEEDS_RATES)


def test_the_phases_add_up_and_nothing_offloaded_is_no_offload_overhead():
    for strategy in (Strategy(2), Strategy(2, "cpu"), Strategy(3, "cpu", "cpu"), Strategy(3, "nvme", "nvme")):
        step = timing.estimate_step(shape(2048), strategy, SEEDS_RATES, world=1, ranks_per_node=1, has_gpu=True)
        assert step.passes_seconds + step.update_seconds == pytest.approx(step.step_seconds)
        assert (step.offload_overhead_fraction == 0) == (not strategy.offloads)


# ------------------------------------------------------------------------------------------ model families (issue 16)


def test_an_encoder_decoder_costs_6p_per_position_pair_plus_its_cross_attention():
    """[enc-dec] s source tokens through the encoder's P_e, s target tokens through the decoder's P_d: 6·(P_e + P_d)
    per pair of positions, the same weights term as a causal LM of P_e + P_d; the attention counts L_e + 2·L_d
    sublayers at the attention width d."""
    p, s, d = 11_307_321_344, 512, 16_384
    enc_dec = flops_per_token(p, False, layers=48, hidden=d, seq_len=s, cross_layers=24)
    causal = flops_per_token(p, False, layers=48, hidden=d, seq_len=s)
    assert enc_dec == 6 * p + 12 * (24 + 2 * 24) * s * d
    assert enc_dec - causal == 12 * 24 * s * d  # the decoder's cross-attention, over the s source tokens
    assert flops_per_token(p, True, layers=48, hidden=d, seq_len=s, cross_layers=24) == (8 * p + 16 * 72 * s * d)


def test_the_step_counts_the_attention_width_and_the_cross_attention_sublayers():
    rates = replace(SEEDS_RATES, device_memory_bytes_per_s=2e12)
    causal = Shape(SEVEN_B, SEVEN_B, layers=32, hidden=1024, seq_len=512)
    wide = replace(causal, attention_width=16_384)
    enc_dec = replace(wide, cross_layers=16)
    tokens = 512
    assert compute_seconds(wide, SEEDS_RATES) - compute_seconds(causal, SEEDS_RATES) == pytest.approx(
        12 * 32 * 512 * (16_384 - 1024) * tokens / 150e12
    )
    extra = compute_seconds(enc_dec, rates) - compute_seconds(wide, rates)
    flops = 12 * 16 * 512 * 16_384 * tokens / 150e12
    elementwise = 3 * NONMATMUL_CROSS_BYTES_PER_HIDDEN * 1024 * 16 * tokens / 2e12
    assert extra == pytest.approx(flops + elementwise)


def test_t5_11b_plans_from_its_bundled_config_with_both_stacks():
    plan = make_plan(
        inspect_model("t5-11b"), (h := load_host_spec(host_path("1x-a100-80g"))), Workload(), resolve_rates(h)
    )
    assert plan.model.kind == "seq2seq-lm" and plan.workload.seq_len == 512
    assert plan.chosen is not None
    shape = plan.chosen.timing
    p, s, d = plan.model.params, 512, 128 * 128
    flops = (8 * p + 16 * (48 + 24) * s * d) * s  # recomputed (activation checkpointing is on by default)
    assert shape.compute_seconds_per_step >= flops / plan.rates.compute_flops_per_s


def test_deepspeed_s_own_step_on_the_gpu_streams_the_bytes_read_in_its_source():
    """framework.py [DS-gpu-step]: with nothing offloaded the update is Adam's 28 B/param and the copy back into the
    16-bit weights (4 + 2), plus DeepSpeed's passes around them (overflow scan, fp64 norm, flatten, cast, unscale):
    40 B/param at ZeRO-1/2, 36 at ZeRO-3, per parameter of the rank's partition at the device's memory bandwidth."""
    from launcher.plan.compute import device_optimizer_seconds
    from launcher.plan.framework import GPU_STEP_BYTES_PER_PARAM, no_offload_step_seconds

    rates = replace(SEEDS_RATES, device_memory_bytes_per_s=2.0e12)
    params, world = 72_000_000_000, 32
    share = params / world / 2.0e12
    assert device_optimizer_seconds(params, world, rates) == pytest.approx(34 * share)
    assert no_offload_step_seconds(params, world, 8, rates, True, zero3=False) == pytest.approx(40 * share)
    assert no_offload_step_seconds(params, world, 8, rates, True, zero3=True) == pytest.approx(36 * share)
    assert GPU_STEP_BYTES_PER_PARAM == {False: 4 + 18 + 4 + 6 + 8, True: 18 + 10 + 8}
    unknown = replace(rates, device_memory_bytes_per_s=None)
    assert no_offload_step_seconds(params, world, 8, unknown, True, zero3=True) == 0.0  # nothing to rate it with
    shape = Shape(params=params, compute_params=params, layers=80, hidden=8192, seq_len=8192)
    for stage in (2, 3):  # one node of 32 whose links nobody described here: no collectives in the update
        step = timing.estimate_step(
            shape, Strategy(zero_stage=stage), rates, world=world, ranks_per_node=world, has_gpu=True
        )
        expected = (34 + GPU_STEP_BYTES_PER_PARAM[stage == 3]) * share + STEP_FIXED_SECONDS
        assert step.update_seconds == pytest.approx(expected, rel=1e-6)
