"""The collectives on the links they cross (plan/network.py): ZeRO's bytes per stage, hand-computed; the slower of
the GPUs' links and the nodes' network bounds the ring; nothing charged on one node whose links nobody described;
the step never gets faster on a slower network; and the plan prefers what sends less across a slow one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from launcher import settings
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.job.planning import build_plan
from launcher.plan import network, timing
from launcher.plan.compute import backward_share
from launcher.plan.framework import STEP_FIXED_SECONDS
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import Strategy
from launcher.plan.workload import Workload
from launcher.views import plan_view
from tests.helpers import host_path
from tests.plan.test_timing import SEEDS_RATES as RATES  # the seeds' rates: 150 TFLOP/s, PCIe 4.0 at 32 GB/s
from tests.plan.test_timing import SEVEN_B

GB = 10**9
ETHERNET_25G = 25e9 / 8  # 25 Gb/s = 3.125 GB/s per direction
NVLINK_A100 = 300e9  # B/s per GPU per direction
# 2048 tokens of 7 B parameters at 6 FLOPs per parameter and token, 150 TFLOP/s: 0.57344 s of compute
COMPUTE_2048 = 6 * SEVEN_B * 2048 / 150e12
ONCE_16 = 15 / 16 * 2 * SEVEN_B  # one all-gather (or reduce-scatter) of 7e9 16-bit values over 16 ranks: 13.125 GB


def step(strategy: Strategy, *, world: int = 16, ranks: int = 8, accum: int = 1, **links) -> timing.StepEstimate:
    shape = Shape(SEVEN_B, SEVEN_B, seq_len=2048, grad_accum=accum)
    rates = replace(RATES, **links)
    return timing.estimate_step(shape, strategy, rates, world=world, ranks_per_node=ranks, has_gpu=True)


# -------------------------------------------------------------------------------------------------- the bytes


def test_zeros_bytes_per_stage_hand_computed():
    # P = 7e9, n = 16 ranks, M = 4 micro-batches; one all-gather = 15/16 x 2 B x 7e9 = 13.125e9 B
    assert ONCE_16 == 13.125e9
    zero1 = network.collectives(SEVEN_B, Strategy(1), 16, 4)
    assert (zero1.reduce, zero1.gathers, zero1.update) == (26_250_000_000, 0, 13_125_000_000)  # all-reduce once a step
    zero2 = network.collectives(SEVEN_B, Strategy(2), 16, 4)
    assert (zero2.reduce, zero2.update) == (4 * 26_250_000_000, 13_125_000_000)  # all-reduce every micro-batch
    zero3 = network.collectives(SEVEN_B, Strategy(3), 16, 4)
    assert (zero3.reduce, zero3.gathers, zero3.update) == (4 * 13_125_000_000, 8 * 13_125_000_000, 0)
    # ZeRO paper, section 7: ZeRO-3 moves 3 psi per micro-batch, 1.5x data parallelism's all-reduce (2 psi)
    assert zero3.total / 4 == 1.5 * 2 * ONCE_16
    # offloading moves no collective bytes: the same ring traffic as without
    assert network.collectives(SEVEN_B, Strategy(3, "cpu", "cpu"), 16, 4) == zero3
    assert network.collectives(SEVEN_B, Strategy(2, "cpu"), 16, 4) == zero2


def test_zenflow_reduces_every_micro_batch_and_gathers_once_per_update():
    zenflow = network.collectives(SEVEN_B, Strategy(1, "cpu", zenflow_interval=4), 16, 2)
    assert zenflow.reduce == 2 * 26_250_000_000 and zenflow.update == 13_125_000_000 // 4


def test_one_rank_sends_nothing():
    assert network.collectives(SEVEN_B, Strategy(3), 1, 8).total == 0


# -------------------------------------------------------------------------------------------------- the links


def test_the_slower_link_bounds_the_ring():
    rates = replace(RATES, network_bytes_per_s=25 * GB, interconnect_bytes_per_s=NVLINK_A100)
    assert network.ring_bytes_per_s(rates, world=16, ranks_per_node=8) == 25 * GB  # the network
    pcie_peers = replace(rates, interconnect_bytes_per_s=10 * GB)  # GPUs talking over PCIe peer-to-peer
    assert network.ring_bytes_per_s(pcie_peers, world=16, ranks_per_node=8) == 10 * GB
    assert network.ring_bytes_per_s(rates, world=8, ranks_per_node=8) == NVLINK_A100  # one node: its GPUs' links
    assert network.ring_bytes_per_s(RATES, world=8, ranks_per_node=8) is None  # nothing described: not charged
    assert network.ring_bytes_per_s(rates, world=2, ranks_per_node=1) == 25 * GB  # one rank per node: no GPU links
    # several nodes, nothing described: the nominal 100 Gb/s NIC = 12.5 GB/s
    assert network.ring_bytes_per_s(RATES, world=16, ranks_per_node=8) == 12.5 * GB


def test_zero3_on_25_gigabit_ethernet_hand_computed():
    # 2 nodes x 8 GPUs, 25 Gb/s = 3.125 GB/s per node, NVLink 300 GB/s: the network bounds the ring.
    # reduce-scatter 13.125 GB / 3.125 GB/s = 4.2 s, hidden behind the backward (2/3 of 0.57344 s = 0.3823 s) as far
    # as it lasts; two all-gathers 26.25 GB / 3.125 GB/s = 8.4 s, charged in full. 39.375 GB in 12.6 s in all.
    zero3 = step(Strategy(3), network_bytes_per_s=ETHERNET_25G, interconnect_bytes_per_s=NVLINK_A100)
    assert zero3.collective_bytes_per_step == 39_375_000_000
    assert zero3.collective_seconds_per_step == pytest.approx(12.6)
    backward = 2 / 3 * COMPUTE_2048
    assert zero3.passes_seconds == pytest.approx(COMPUTE_2048 + (4.2 - backward) + 8.4)
    assert zero3.update_seconds == pytest.approx(STEP_FIXED_SECONDS)


def test_zero2_on_25_gigabit_ethernet_hand_computed():
    # all-reduce 2 x 13.125 GB = 26.25 GB in 8.4 s, 0.3823 s of it behind the backward; the all-gather of the updated
    # weights 13.125 GB in 4.2 s after the step, in the update
    zero2 = step(Strategy(2), network_bytes_per_s=ETHERNET_25G)
    assert zero2.collective_bytes_per_step == 39_375_000_000
    assert zero2.passes_seconds == pytest.approx(COMPUTE_2048 + 8.4 - 2 / 3 * COMPUTE_2048)
    assert zero2.update_seconds == pytest.approx(4.2 + STEP_FIXED_SECONDS)
    assert zero2.offload_overhead_fraction == 0  # the network is not offloading's cost


def test_a_fast_network_hides_the_reduction_behind_the_backward():
    # 200 GB/s: the all-reduce's 26.25 GB take 0.131 s < the 0.382 s backward; only the all-gather (0.0656 s) adds
    zero2 = step(Strategy(2), network_bytes_per_s=200 * GB)
    assert zero2.passes_seconds == pytest.approx(COMPUTE_2048)
    assert zero2.update_seconds == pytest.approx(ONCE_16 / 200e9 + STEP_FIXED_SECONDS)


def test_zero1_reduces_behind_the_last_micro_batch_only():
    # M = 4: ZeRO-1's all-reduce (8.4 s at 25 Gb/s) runs in the last micro-batch's backward only (1/4 of the window)
    zero1 = step(Strategy(1), accum=4, network_bytes_per_s=ETHERNET_25G)
    compute = 4 * COMPUTE_2048
    assert zero1.passes_seconds == pytest.approx(compute + 8.4 - 2 / 3 * compute / 4)


@pytest.mark.parametrize("strategy", [Strategy(1), Strategy(2), Strategy(3), Strategy(2, "cpu"), Strategy(3, "cpu")])
def test_one_node_is_not_charged_and_its_network_does_not_matter(strategy):
    plain = step(strategy, world=8, ranks=8, accum=2)
    assert plain.collective_seconds_per_step == 0
    assert plain.collective_bytes_per_step > 0  # the ring still runs, on links nobody described
    assert step(strategy, world=8, ranks=8, accum=2, network_bytes_per_s=1e6) == plain


def test_one_node_with_described_gpu_links_pays_for_them():
    # 8 GPUs on NVLink 300 GB/s, ZeRO-3: 7/8 x 14 GB = 12.25 GB per gather: 2 x 0.0408 s in the passes
    zero3 = step(Strategy(3), world=8, ranks=8, interconnect_bytes_per_s=NVLINK_A100)
    assert zero3.collective_seconds_per_step == pytest.approx(3 * 12.25e9 / 300e9)
    assert zero3.passes_seconds == pytest.approx(COMPUTE_2048 + 2 * 12.25e9 / 300e9)


@pytest.mark.parametrize("strategy", [Strategy(1), Strategy(2), Strategy(3), Strategy(2, "cpu"), Strategy(3, "cpu")])
def test_a_slower_network_never_makes_the_step_faster(strategy):
    steps = [
        step(strategy, accum=accum, network_bytes_per_s=gbps * GB / 8)
        for accum in (1, 4)
        for gbps in (1, 10, 25, 100, 400, 1600, 10**6)
    ]
    for accum in range(2):
        sweep = steps[7 * accum : 7 * accum + 7]  # 1 Gb/s ... 1 Pb/s
        seconds = [s.step_seconds for s in sweep]
        assert seconds == sorted(seconds, reverse=True)
        collective = [s.collective_seconds_per_step for s in sweep]
        assert all(a > b for a, b in zip(collective, collective[1:], strict=False))


# -------------------------------------------------------------------------------------------------- the plan


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b-hf")


@pytest.fixture(scope="module")
def llama13b():
    return inspect_model("meta-llama/Llama-2-13b-hf")


def two_nodes(network_name: str, gpu_gib: int = 80):
    host = load_host_spec(host_path(f"2x-node-8x-a100-80g-{network_name}"))
    return replace(host, gpus=replace(host.gpus, memory_bytes=gpu_gib * 2**30))


def candidate(plan, label: str):
    return next(c for c in plan.candidates if c.strategy.label == label)


def test_a_slow_network_flips_zero3_to_zero2_with_the_optimizer_offloaded(llama13b):
    """Llama-2-13B on 2 x 8 A100 40 GB at 2 micro-batches per step: ZeRO-2 does not fit, ZeRO-3 does, and so does
    ZeRO-2 with the optimizer on the CPU. Per step ZeRO-3 sends 3 x 2 = 6 gathers' worth (psi = 15/16 x 2 B x 13 B =
    24.4 GB each), ZeRO-2 2 x 2 + 1 = 5. On InfiniBand (200 GB/s per node) the one it saves is 0.12 s and ZeRO-3,
    which keeps the optimizer on the GPU, wins; on 25 Gb/s Ethernet it is 7.8 s, more than CPU-Adam costs."""
    workload = Workload(grad_accum=2)
    ib = make_plan(llama13b, (h := two_nodes("ib", 40)), workload, resolve_rates(h))
    ethernet = make_plan(llama13b, (h := two_nodes("25gbe", 40)), workload, resolve_rates(h))
    assert not candidate(ib, "ZeRO-2").fits
    assert ib.chosen.strategy.label == "ZeRO-3"
    assert ethernet.chosen.strategy.label == "ZeRO-2 + opt->cpu"
    psi = 15 / 16 * 2 * llama13b.params
    for plan in (ib, ethernet):
        assert candidate(plan, "ZeRO-3").timing.collective_bytes_per_step == pytest.approx(6 * psi, abs=2)
        assert candidate(plan, "ZeRO-2 + opt->cpu").timing.collective_bytes_per_step == pytest.approx(5 * psi, abs=2)
    assert any(r.startswith("collectives: each rank sends ") and "3.12 GB/s" in r for r in ethernet.reasons)


def test_accumulation_costs_zero2_a_reduction_per_micro_batch_and_zero1_one_per_step(llama7b):
    """Llama-2-7B at 8 micro-batches per step on the two-node hosts: ZeRO-1 and ZeRO-2 tie on InfiniBand (the
    reductions hide behind the backward), and on 25 Gb/s Ethernet ZeRO-2 pays its 7 more all-reduces: 2 x 7 x psi /
    3.125 GB/s, less the backward of the 7 more micro-batches they hide behind."""
    workload = Workload(grad_accum=8)
    ib = make_plan(llama7b, (h := two_nodes("ib")), workload, resolve_rates(h))
    ethernet = make_plan(llama7b, (h := two_nodes("25gbe")), workload, resolve_rates(h))
    assert candidate(ib, "ZeRO-1").timing.step_seconds == pytest.approx(candidate(ib, "ZeRO-2").timing.step_seconds)
    zero1, zero2 = candidate(ethernet, "ZeRO-1").timing, candidate(ethernet, "ZeRO-2").timing
    psi = 15 / 16 * 2 * llama7b.params
    backward = backward_share(recompute=True) * zero1.compute_seconds_per_step  # all 8 micro-batches
    extra = 2 * 7 * psi / ETHERNET_25G - backward * 7 / 8
    assert zero2.step_seconds - zero1.step_seconds == pytest.approx(extra)
    assert ethernet.chosen.strategy.label == "ZeRO-1"


def test_the_network_term_is_in_the_split_the_json_and_the_rates(llama7b):
    plan = make_plan(llama7b, (h := two_nodes("25gbe")), Workload(), resolve_rates(h))
    name, seconds, moved, _colour = plan_view.step_parts(plan)[-1]
    assert (name, seconds, moved) == (
        "network",
        plan.chosen.timing.collective_seconds_per_step,
        plan.chosen.timing.collective_bytes_per_step,
    )
    text = plan_view.plan_text(plan, None)
    assert "| network " in text and "network 3.12 GB/s per node, GPU links 300 GB/s per GPU" in text
    terms = plan.chosen.timing.to_json()
    assert terms["collective_bytes_per_step"] == plan.chosen.timing.collective_bytes_per_step > 0
    assert terms["collective_seconds_per_step"] > 0
    as_json = plan.to_json(None)
    assert as_json["rates"]["network_bytes_per_s"] == ETHERNET_25G
    assert as_json["rates"]["sources"]["network_bytes_per_s"] == "described"
    assert as_json["host"]["network_bytes_per_s"] == ETHERNET_25G
    one_node = make_plan(llama7b, (h := load_host_spec(host_path("8x-a100-80g"))), Workload(), resolve_rates(h))
    assert [part[0] for part in plan_view.step_parts(one_node)][-1] == "GPU links"  # its NVLink, nominal
    assert one_node.rates.sources["interconnect_bytes_per_s"] == "nominal (NVLink, not measurable here)"
    assert "interconnect_bytes_per_s nominal (NVLink" in plan_view.plan_text(one_node, None)


@pytest.mark.parametrize(
    ("name", "pcie", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", "{generation: 4, width: 16}", (300e9, "NVLink")),  # A100 datasheet: 600 GB/s
        ("NVIDIA H100 80GB HBM3", "{generation: 5, width: 16}", (450e9, "NVLink")),  # what NVML calls the SXM part
        ("NVIDIA H100 NVL", "{generation: 5, width: 16}", (64e9, "PCIe")),  # a PCIe card bridged in pairs
        ("NVIDIA GeForce RTX 4090", "{generation: 4, width: 16}", (32e9, "PCIe")),  # no peer access: via host memory
        ("NVIDIA GeForce RTX 3090", "{generation: 3, width: 8}", (8e9, "PCIe")),  # two cards sharing 16 lanes
    ],
)
def test_the_gpus_links_nobody_described_are_their_nvlink_or_their_pcie(name, pcie, expected, write_host):
    host = load_host_spec(
        write_host(f"gpus: {{count: 2, memory: 24GiB, name: {name!r}}}\ncpu_memory: 128GiB\npcie: {pcie}\n")
    )
    assert network.nominal_gpu_link(host) == expected
    linked = network.with_links(resolve_rates(host), host, ranks_per_node=2)
    assert linked.interconnect_bytes_per_s == expected[0]
    assert linked.sources["interconnect_bytes_per_s"] == f"nominal ({expected[1]}, not measurable here)"
    assert network.with_links(resolve_rates(host), host, ranks_per_node=1).interconnect_bytes_per_s is None


def test_pcie_cards_pay_zero_3_s_gathers_on_their_pcie(llama7b, write_host):
    """[links] two 24 GB consumer cards on PCIe 3: ZeRO-3's gathers and reduce-scatters (3 x 2 B/param x (n-1)/n per
    micro-batch) cross each card's 16 GB/s link and cost the passes their time, where nothing was charged before."""
    text = "gpus: {count: 2, memory: 24GiB, name: NVIDIA GeForce RTX 3090}\ncpu_memory: 256GiB\npcie: {generation: 3}\n"
    host = load_host_spec(write_host(text))
    plan = make_plan(llama7b, host, Workload(zero_stage="3", offload_optimizer="cpu"), resolve_rates(host))
    t = plan.chosen.timing
    sent = 3 * 0.5 * 2 * llama7b.params  # gathers before forward and backward, the gradients' reduce-scatter
    assert t.collective_bytes_per_step == pytest.approx(sent, rel=1e-3)
    assert t.collective_seconds_per_step == pytest.approx(sent / 16e9, rel=1e-3)


def test_several_nodes_without_a_described_network_say_which_figure_they_assumed(llama7b, write_host):
    text = "gpus: {count: 8, memory: 80GiB, name: NVIDIA A100-SXM4-80GB}\ncpu_memory: 1TiB\nnodes: 2\n"
    plan = make_plan(llama7b, (h := load_host_spec(write_host(text))), Workload(), resolve_rates(h))
    notes = [w for w in plan.warnings if w.startswith("network nominal: ")]
    assert notes == [
        "network nominal: 100 Gb/s per node (12.5 GB/s each way) for the collectives between the 2 nodes; state "
        "yours as network.bandwidth (and network.nics) in a described host, --host-spec (docs/planning.md, "
        "'Several nodes: the network')"
    ]
    assert plan.rates.network_bytes_per_s == 12.5e9 and plan.rates.sources["network_bytes_per_s"] == "nominal"
    described = make_plan(
        llama7b,
        (h := load_host_spec(write_host(text + "network: {bandwidth: 100Gb/s}\n"))),
        Workload(),
        resolve_rates(h),
    )
    assert not any(w.startswith("network nominal") for w in described.warnings)
    assert described.chosen.timing == plan.chosen.timing  # the nominal figure is 100 Gb/s: the same step
    one_node = make_plan(llama7b, (h := load_host_spec(host_path("8x-a100-80g"))), Workload(), resolve_rates(h))
    assert not any(w.startswith("network nominal") for w in one_node.warnings)
    assert "network_bytes_per_s" not in one_node.rates.sources


def test_a_hostfile_sets_the_nodes_and_the_nominal_network(tmp_path: Path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=8\nnode-b slots=8\nnode-c slots=8\n")
    typed = {
        "model": "meta-llama/Llama-2-7b-hf",
        "host_spec": host_path("8x-a100-80g"),
        "hostfile": str(hostfile),
    }
    plan = build_plan(settings.layer(typed))
    assert plan.host.nodes == 3 and plan.world_size == 24
    assert any(w.startswith("network nominal: 100 Gb/s per node") and "the 3 nodes" in w for w in plan.warnings)
    assert plan.chosen.timing.collective_seconds_per_step > 0
