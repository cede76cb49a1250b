"""What ZeRO's data parallelism sends between the ranks, and what that costs on the links it crosses: each GPU's link
to the node's other GPUs, and the node's network to the other nodes. One ring model for both: the slower link bounds
the ring (timing.py adds the result to the step; reasons.py says it in a sentence).

Sources:
  [busbw]   NCCL tests, doc/PERFORMANCE.md ("Bus bandwidth"): with each rank's bandwidth to the outside world B, an
            all-reduce of S bytes over n ranks takes at best S/B x 2(n-1)/n, a reduce-scatter or an all-gather (S the
            whole array) S/B x (n-1)/n, "independent of the algorithm used (ring, tree, or other)", and the bus
            bandwidth B "should reflect the speed of the hardware bottleneck: NVLink, PCI, QPI, or network".
  [ring]    Which link that is, for n = N nodes x R ranks: NCCL's rings run through a node's GPUs and leave it once (one
            hop per node onto the network per ring; its channels spread over the node's NICs), so every byte a rank
            sends around the ring crosses each node's network too, once per direction: per collective a node's NICs
            together carry what one rank sends, S x (n-1)/n for a reduce-scatter, while each GPU's own link carries the
            same. A hierarchical algorithm (reduce-scatter inside the node, 1/R of the data per GPU across the
            nodes, all-gather inside) puts as much on each node's network. So B = min(one GPU's link to the others,
            the node's network), both per direction (`ring_bytes_per_s`): with one node only the GPUs' links, which a
            described host may state (gpus.interconnect); where it does not, [links] says what they are taken to be.
  [ZeRO]    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 7:
            data parallelism all-reduces the gradients, 2Ψ per rank (Ψ the model's elements); ZeRO-1/2 reduce-scatter
            the gradients and all-gather the updated parameters, 2Ψ as well; ZeRO-3 all-gathers the parameters before
            the forward and again before the backward and reduce-scatters the gradients: 3Ψ, 1.5x the baseline.
  [DS-12]   What DeepSpeed 0.19.8 sends at ZeRO-1/2 (stage_1_and_2.py): `average_tensor` all-reduces each gradient
            bucket (use_multi_rank_bucket_allreduce, True by default and left so by the tool's ds_config:
            `allreduce_and_scatter` -> `allreduce_bucket` -> dist.all_reduce), 2(n-1)/n x 2 B/param in 16 bits
            (engine.py `communication_data_type`: the training precision), not the paper's reduce-scatter; after the
            optimizer step `all_gather_dp_groups` gathers the updated 16-bit partitions, (n-1)/n x 2 B/param. ZeRO-2
            reduces at every micro-batch (engine.py `allreduce_gradients`: "ZeRO stage >= 2 communicates during non
            gradient accumulation boundaries as well"; stage_1_and_2.py `reduce_ready_partitions_and_remove_grads`:
            `if self.partition_gradients or self.is_gradient_accumulation_boundary() or self.zenflow`), ZeRO-1 only at
            the accumulation boundary, once per step; with ZenFlow at every micro-batch, and the updated weights are
            gathered when the CPU's update lands, once per update_interval steps (zenflow_stage_1_and_2.py).
  [DS-3]    ZeRO-3 (stage3.py, partitioned_param_coordinator.py): every micro-batch all-gathers each module's 16-bit
            parameters before its forward and before its backward, and reduce-scatters the gradients
            (`__avg_scatter_grads` -> reduce_scatter_coalesced): 3 x (n-1)/n x 2 B/param. With activation recomputation
            the recomputed forward's gather serves the backward right after it (the tool's stage3_max_reuse_distance
            keeps a block's parameters for their next use), so still two gathers. Parameters under
            stage3_param_persistence_threshold stay whole and are not gathered: a small share, not subtracted.
  [overlap] As the rest of the model (timing.py [seeds-O]): with overlap_comm (the tool's ds_config templates set
            it) the gradient reductions run on their own stream during the backward of the micro-batches that make
            them (all of them at ZeRO-2/3, the last one at ZeRO-1), so only what outlasts that backward adds; the
            backward is 2/3 of a micro-batch's compute, 3/4 with recomputation (4·P of 6·P FLOPs per token, 6·P of
            8·P: compute.py [seeds-F], `backward_share`). ZeRO-3's gathers are charged in full, as traffic.py charges
            the offloaded parameters' fetches (prefetching hides only part of them: DeepSpeed issue 3901); the
            all-gather after the optimizer step waits for the step and adds to the update.
  [links]   A GPU's link to the node's other GPUs when nobody described it ([busbw]: the hardware bottleneck): on an
            SXM board, its NVLink, per direction half the total its datasheet gives (NVIDIA V100: 300 GB/s, A100: 600,
            H100 and H200: 900, B200: 1.8 TB/s), the figure the tool's 8 x A100 recipes state; a PCIe card's traffic to
            another card crosses its own PCIe link (peer to peer through the switch or root complex, or NCCL's
            shared-memory transport through host memory where peer access is off, as on GeForce cards), so the host's
            PCIe rate per direction bounds it, from its generation and width. A live host reads no topology, so its
            GPUs are taken as named too. `with_links` marks the source "nominal" and the plan says which link it took.
  [nominal] A node whose network is not described (a live host: nothing here can measure it) is taken to have one
            100 Gb/s NIC: 100 Gigabit Ethernet (IEEE 802.3) or InfiniBand EDR / HDR100, a common cluster node's link;
            the plan says so in one line (reasons.py). GPU servers built for multi-node training have far more (a DGX
            A100: 8 x 200 Gb/s HDR InfiniBand for compute traffic, DGX A100 datasheet), which a described host states.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from launcher.plan.compute import backward_share
from launcher.plan.rates import Rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import BYTES_16BIT, Strategy
from launcher.units import GB

if TYPE_CHECKING:
    from launcher.inspection.hostprofile import HostProfile

NOMINAL_NETWORK_BITS_PER_S = 100 * 10**9  # [nominal] one 100 Gb/s NIC per node
NOMINAL_NETWORK_BYTES_PER_S = NOMINAL_NETWORK_BITS_PER_S / 8  # 12.5 GB/s per direction


@dataclass(frozen=True)
class Collectives:
    """Bytes one rank sends around the ring per optimizer step, by when they move ([DS-12], [DS-3]); with several
    nodes also what each node's network carries per direction ([ring])."""

    reduce: int = 0  # the gradients' all-reduce (ZeRO-1/2) or reduce-scatter (ZeRO-3): in the backward, overlapped
    gathers: int = 0  # ZeRO-3's parameter all-gathers before each forward and backward: in the passes
    update: int = 0  # ZeRO-1/2's all-gather of the updated 16-bit partitions after the optimizer step

    @property
    def total(self) -> int:
        return self.reduce + self.gathers + self.update


@dataclass(frozen=True)
class CollectiveTimes:
    """The collectives of one optimizer step in seconds at the ring's rate, and what each phase pays for them."""

    bytes: int = 0  # Collectives.total
    seconds: float = 0.0  # all of them at the ring's rate, hidden or not
    passes: float = 0.0  # what the passes pay: the reductions that outlast their backward, and the gathers
    update: float = 0.0  # what the update pays: the all-gather after the step


def reduces_every_micro_batch(strategy: Strategy) -> bool:
    """[DS-12] ZeRO-2/3 and ZenFlow reduce the gradients at every micro-batch; ZeRO-1 at the step's last one."""
    return strategy.zero_stage >= 2 or bool(strategy.zenflow_interval)


def collectives(params: int, strategy: Strategy, world: int, grad_accum: int, trainable: int = 0) -> Collectives:
    """[DS-12] [DS-3] with [busbw]'s (n-1)/n per reduce-scatter or all-gather and twice that per all-reduce, of the
    model's 16-bit parameters or gradients (2 B/param); nothing with one rank. With an adapter (`trainable` of the
    `params`, memory.py [DS-frozen]) only its gradients are reduced and its weights gathered after the step; ZeRO-3
    still gathers every parameter, frozen or not, for each pass."""
    if world <= 1:
        return Collectives()
    gathered = (world - 1) / world * BYTES_16BIT * params  # one all-gather of the whole model
    once = (world - 1) / world * BYTES_16BIT * (trainable or params)  # ... of what the optimizer owns
    if strategy.zero_stage >= 3:
        return Collectives(reduce=round(once * grad_accum), gathers=round(2 * gathered * grad_accum))
    reductions = grad_accum if reduces_every_micro_batch(strategy) else 1
    gathered = once / strategy.zenflow_interval if strategy.zenflow_interval else once
    return Collectives(reduce=round(2 * once * reductions), update=round(gathered))


def ring_bytes_per_s(rates: Rates, world: int, ranks_per_node: int) -> float | None:
    """[ring] the rate of the slowest link the ring crosses, per direction: the node's network with several nodes
    (its described figure, else [nominal]), each GPU's link to the others where described and the node has several
    ranks; None when nothing bounds it (one node, its GPUs' links not described)."""
    links = []
    if world > ranks_per_node:
        links.append(rates.network_bytes_per_s or NOMINAL_NETWORK_BYTES_PER_S)
    if ranks_per_node > 1 and rates.interconnect_bytes_per_s:
        links.append(rates.interconnect_bytes_per_s)
    return min(links) if links else None


def collective_times(
    shape: Shape, strategy: Strategy, rates: Rates, world: int, ranks_per_node: int, t_compute: float
) -> CollectiveTimes:
    """One step's collectives at the ring's rate and what each phase pays ([overlap]): the reductions beyond the
    backward of the micro-batches that make them, the ZeRO-3 gathers in full in the passes, the all-gather after the
    step in the update. Nothing when no link bounds the ring."""
    moved = collectives(shape.params, strategy, world, shape.grad_accum, shape.trainable)
    rate = ring_bytes_per_s(rates, world, ranks_per_node)
    if not rate or not moved.total:
        return CollectiveTimes(bytes=moved.total)
    t_reduce, t_gathers, t_update = (b / rate for b in (moved.reduce, moved.gathers, moved.update))
    reducing = 1.0 if reduces_every_micro_batch(strategy) else 1 / shape.grad_accum
    frozen_share = shape.frozen / shape.compute_params if shape.compute_params else 0.0
    window = t_compute * backward_share(shape.recompute, frozen_share) * reducing
    return CollectiveTimes(
        bytes=moved.total,
        seconds=t_reduce + t_gathers + t_update,
        passes=max(0.0, t_reduce - window) + t_gathers,
        update=t_update,
    )


# [links] NVLink per GPU per direction, half the bidirectional total of each datasheet, by what NVML and the vendors
# name the SXM parts; the first match wins. "H100 NVL" and "H200 NVL" are PCIe cards bridged in pairs or fours, and
# fall through to PCIe with every other card.
NVLINK_BYTES_PER_S = (
    (("V100-SXM",), 150 * GB),  # NVIDIA V100 datasheet: NVLink 300 GB/s
    (("A100-SXM", "A800-SXM"), 300 * GB),  # NVIDIA A100 datasheet: NVLink 600 GB/s (A800: 400, taken as A100's)
    (("H100 80GB HBM3", "H100-SXM", "H100 SXM", "H800"), 450 * GB),  # NVIDIA H100 datasheet: NVLink 900 GB/s
    (("H200",), 450 * GB),  # NVIDIA H200 datasheet: NVLink 900 GB/s (the SXM part; NVL excluded below)
    (("B200", "B100"), 900 * GB),  # NVIDIA DGX B200 datasheet: NVLink 5, 1.8 TB/s per GPU
)


def nominal_gpu_link(host: HostProfile) -> tuple[float, str]:
    """[links] (bytes/s per direction, the link's name) between this node's GPUs when nobody described it."""
    name = host.gpus.name
    if " NVL" not in name:
        for patterns, rate in NVLINK_BYTES_PER_S:
            if any(p in name for p in patterns):
                return float(rate), "NVLink"
    return float(host.pcie_bytes_per_s), "PCIe"


def with_links(rates: Rates, host: HostProfile, ranks_per_node: int) -> Rates:
    """`rates` with the host's links for the collectives, where the rates do not carry them already: the node's
    network (described; with several nodes and none described, [nominal]) and each GPU's link to the others
    (described, else [links]), each with its source where the plan's ring crosses it."""
    network = rates.network_bytes_per_s or host.network_bytes_per_s
    interconnect = rates.interconnect_bytes_per_s or host.gpus.interconnect_bytes_per_s
    sources = dict(rates.sources)
    if host.nodes > 1:
        sources.setdefault("network_bytes_per_s", "described" if network else "nominal")
        network = network or NOMINAL_NETWORK_BYTES_PER_S
    if ranks_per_node > 1 and host.has_gpu:
        if interconnect:
            sources.setdefault("interconnect_bytes_per_s", "described")
        else:
            interconnect, link = nominal_gpu_link(host)
            sources["interconnect_bytes_per_s"] = f"nominal ({link}, not measurable here)"
    return replace(rates, network_bytes_per_s=network, interconnect_bytes_per_s=interconnect, sources=sources)
