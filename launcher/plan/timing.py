"""Step-time model: the phases of one step from its terms.

A step has two phases, which the trainer measures separately (launcher/rank/progress.py PhaseClock):
"passes" (forward and backward of every micro-batch, with what they overlap) and "update" (the optimizer step).
`step_terms` gathers one optimizer step's terms in seconds (StepTerms), each from the module that models it and cites
its sources: compute.py (the passes' work, the optimizer's), traffic.py (PCIe, host memory, NVMe), framework.py
(DeepSpeed's own cost), network.py (the collectives), on the rates of rates.py. This module combines them into the
phases. P = parameters, N = ranks in all, R = ranks per node, t = tokens per micro-batch (micro-batch x sequence
length), M = micro-batches per optimizer step (accumulation).

Sources:
  [seeds-O]   "The swap math": overlapped work costs max(t_compute, t_move), serial work the sum.
              DeepSpeed overlaps gradient copies with the backward (overlap_comm); the CPU-Adam step,
              the weight upload after it, parameter fetches and the NVMe swap are charged serially.
  [DS-pipe]   With offload_optimizer.pipeline_read / pipeline_write (capacity.nvme_optimizer_sizing) DeepSpeed's
              PipelinedOptimizerSwapper reads sub-group i+1 and writes sub-group i-1 from their own aio handles while
              sub-group i steps (stage3.py `_optimizer_states_and_gradient_swap_in` / `_swap_out`, with the async
              swap ops): the swaps run beside CPU-Adam instead of before and after it, so the update costs the
              longer of the two, plus the first read and the last write, which nothing hides (one sub-group of G
              each: the swap time / G).
  [ZenFlow]   (host_buffers.py [ZenFlow]) The device updates the selected top-k share of the parameters every step, at
              the device optimizer's rate; the host updates the rest once per update_interval U steps in its own
              process, asynchronously, while the next U steps' passes compute: only the part of that update (CPU-Adam,
              its host copies, the weights' upload) that outlasts U passes stalls, spread over the U steps. On the CPU
              accelerator the optimizer process takes cores from the passes (ZenFlow's pt_reserved_cores_perc splits
              them), so nothing is hidden: its update is charged in full, spread over the U steps. This follows the
              design (Lan et al. 2025, "ZenFlow: Enabling Stall-Free Offloading Training via Asynchronous Updates"); the
              e2e test measures it here, no published GPU run is in tests/plan/published_runs.yaml yet.
  [SuperOffload] (host_buffers.py [SuperOffload]) CPU-Adam steps each bucket as its gradients arrive, so the update
              overlaps the backward (about 2/3 of the passes' compute, 3/4 with recomputation) and only what outlasts it
              waits, then the weights come back across the link. From the design, not yet checked against a run.
  [network]   The collectives between the ranks (ZeRO's gradient reductions and parameter gathers) on the slower of
              the GPUs' links inside a node and the nodes' network: plan/network.py, which cites its sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from launcher.plan import network
from launcher.plan.compute import backward_share, compute_seconds, optimizer_seconds, plain_optimizer_seconds
from launcher.plan.framework import STEP_FIXED_SECONDS, framework_seconds, no_offload_step_seconds
from launcher.plan.host_buffers import ZENFLOW_TOPK_RATIO
from launcher.plan.rates import Rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import Strategy
from launcher.plan.traffic import (
    Transfers,
    activation_copy_seconds,
    host_bytes,
    nvme_parts,
    nvme_seconds,
    transfers,
)

# Changed whenever a change to this file, or to how its measured inputs are taken, changes what it predicts: finished
# runs calibrate later plans only through the version that predicted them (plan/calibration.py). 2026-12-07: the GPUs'
# links a host does not describe are their nominal NVLink or PCIe (network.py [links]), and DeepSpeed's own passes
# around the GPU optimizer are charged (framework.py [DS-gpu-step]).
MODEL_VERSION = "2026-12-07.1"


@dataclass(frozen=True)
class StepEstimate:
    compute_seconds_per_step: float
    pcie_bytes_per_step: int  # per GPU
    pcie_seconds_per_step: float
    cpu_adam_seconds_per_step: float
    nvme_bytes_per_step: int  # per node
    nvme_seconds_per_step: float
    step_seconds: float
    tokens_per_s: float
    offload_overhead_fraction: float  # share of the step that offloading adds (transfers, CPU-Adam, swaps)
    host_copy_seconds_per_step: float = 0.0  # [DS-step] copies and conversions in host memory
    framework_seconds_per_step: float = 0.0  # [DS-hooks] ZeRO's own cost and the engine's per-step bookkeeping
    passes_seconds: float = 0.0  # the forward/backward phase (what the trainer measures as "passes")
    update_seconds: float = 0.0  # the optimizer-step phase ("update")
    # [network] what one rank sends around the ring per step (with several nodes also what each node's network carries
    # each way), and how long that takes at the ring's rate, hidden behind the backward or not
    collective_bytes_per_step: int = 0
    collective_seconds_per_step: float = 0.0
    # the same step scaled by what finished runs of this model and strategy with as many ranks on this host
    # measured (plan/calibration.py); None: no such runs
    calibrated_step_seconds: float | None = None
    calibration: dict | None = None  # the factors per phase and the number of runs they come from

    @property
    def expected_seconds(self) -> float:
        """What the plan ranks by: the calibrated step where finished runs calibrated it, else this model's."""
        return self.calibrated_step_seconds or self.step_seconds

    def to_json(self) -> dict:
        return {
            "compute_seconds_per_step": self.compute_seconds_per_step,
            "pcie_bytes_per_step": self.pcie_bytes_per_step,
            "pcie_seconds_per_step": self.pcie_seconds_per_step,
            "cpu_adam_seconds_per_step": self.cpu_adam_seconds_per_step,
            "host_copy_seconds_per_step": self.host_copy_seconds_per_step,
            "framework_seconds_per_step": self.framework_seconds_per_step,
            "nvme_bytes_per_step": self.nvme_bytes_per_step,
            "nvme_seconds_per_step": self.nvme_seconds_per_step,
            "collective_bytes_per_step": self.collective_bytes_per_step,
            "collective_seconds_per_step": self.collective_seconds_per_step,
            "passes_seconds": self.passes_seconds,
            "update_seconds": self.update_seconds,
            "step_seconds": self.step_seconds,
            "tokens_per_s": self.tokens_per_s,
            "offload_overhead_fraction": self.offload_overhead_fraction,
            "calibrated_step_seconds": self.calibrated_step_seconds,
            "calibration": self.calibration,
        }


@dataclass(frozen=True)
class StepTerms:
    """One optimizer step's terms in seconds, before the phases combine them [seeds-O], and the bytes they move."""

    compute: float = 0.0  # the passes' own work (compute.compute_seconds)
    activations: float = 0.0  # traffic.py [act-offload]: the saved tensors down and back, serial in the passes
    gradients: float = 0.0  # PCIe: the 16-bit gradients down, overlapped with the backward
    fetches: float = 0.0  # PCIe: the offloaded parameters up, in the passes
    weights: float = 0.0  # PCIe: the updated weights across, in the update
    host_passes: float = 0.0  # traffic.py [DS-step]: host copies in the passes (the CPU accelerator's)
    host_update: float = 0.0  # traffic.py [DS-step]: host copies in the update
    adam: float = 0.0  # the optimizer, where it runs (compute.optimizer_seconds)
    engine_step: float = 0.0  # DeepSpeed's step around it with nothing offloaded (framework.no_offload_step_seconds)
    nvme_passes: float = 0.0  # the parameters' reads (traffic.nvme_seconds)
    nvme_update: float = 0.0  # the optimizer's swap
    hooks: float = 0.0  # ZeRO's own cost in the passes (framework.framework_seconds)
    comm: network.CollectiveTimes = field(default_factory=network.CollectiveTimes)  # [network]
    moved: Transfers = field(default_factory=Transfers)  # host<->device bytes per GPU (none on the CPU accelerator)
    nvme_bytes: int = 0  # per node, both phases

    @property
    def pcie(self) -> float:
        return self.gradients + self.fetches + self.weights

    @property
    def host_copies(self) -> float:
        return self.host_passes + self.host_update


def step_terms(
    shape: Shape,
    strategy: Strategy,
    rates: Rates,
    *,
    world: int,
    ranks_per_node: int,
    has_gpu: bool,
    pinned: bool = True,
    gpu_share: float = 0.0,
) -> StepTerms:
    """Every term of one optimizer step (`estimate_step` explains the arguments); [Twin-Flow] (compute.py) only the
    host's share of the optimizer uploads its weights and runs DeepSpeed's host copies."""
    params, accum = shape.optimized, shape.grad_accum  # the optimizer's parameters (an adapter's, with one)
    t_compute = compute_seconds(shape, rates)
    moved = transfers(shape.params, strategy, world, accum, shape.trainable)
    host_share = 1.0 - gpu_share  # [Twin-Flow] what CPU-Adam steps, and uploads after
    moved = replace(moved, weights=int(moved.weights * host_share))
    t_host_passes, t_host_update = _host_copies(
        params, strategy, moved, rates, host_share, world, ranks_per_node, has_gpu, accum
    )
    if not has_gpu:  # the CPU accelerator: no PCIe; its copies are the host traffic above
        moved = Transfers()
    pcie_rate = rates.host_device_bytes_per_s(pinned)
    t_gradients, t_fetches, t_weights = (b / pcie_rate for b in (moved.gradients, moved.fetches, moved.weights))
    no_offload = strategy.offload_optimizer == "none"
    fetched, (read, write) = nvme_parts(shape.params, strategy, world, ranks_per_node, accum, shape.trainable)
    t_nvme_passes, t_nvme_update = nvme_seconds(fetched, read, write, rates)
    return StepTerms(
        compute=t_compute,
        activations=activation_copy_seconds(shape, strategy, rates, has_gpu, pinned),
        gradients=t_gradients,
        fetches=t_fetches,
        weights=t_weights,
        host_passes=t_host_passes,
        host_update=t_host_update,
        adam=optimizer_seconds(params, strategy, world, ranks_per_node, rates, has_gpu, gpu_share),
        engine_step=(
            no_offload_step_seconds(params, world, ranks_per_node, rates, has_gpu, strategy.zero_stage >= 3)
            if no_offload
            else 0.0
        ),
        nvme_passes=t_nvme_passes,
        nvme_update=t_nvme_update,
        hooks=framework_seconds(shape, strategy, world, ranks_per_node, rates, has_gpu),
        comm=network.collective_times(shape, strategy, rates, world, ranks_per_node, t_compute),
        moved=moved,
        nvme_bytes=fetched + read + write,
    )


def _host_copies(
    params: int,
    strategy: Strategy,
    moved: Transfers,
    rates: Rates,
    host_share: float,
    world: int,
    ranks_per_node: int,
    has_gpu: bool,
    accum: int,
) -> tuple[float, float]:
    """(passes, update) seconds of DeepSpeed's host copies (traffic.host_bytes), the update's for the host's share
    of the optimizer, at the rank's share of the host's bandwidth: all ranks copy at once."""
    host_passes, host_update = host_bytes(params, strategy, world, moved, has_gpu, accum)
    host_update = int(host_update * host_share)
    bandwidth = (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node
    t_host_passes = host_passes / bandwidth if bandwidth else 0.0
    t_host_update = host_update / bandwidth if bandwidth else 0.0
    return t_host_passes, t_host_update


def _passes(terms: StepTerms, pinned: bool) -> float:
    """The passes phase [seeds-O]: the compute, or the gradient copies it overlaps when they take longer, then
    ZeRO's own cost, the parameter fetches (PCIe, NVMe), the host copies, the activations and the collectives."""
    t = terms
    # [seeds-O] the gradient copies hide behind the backward, unless [pageable] (rates.py): a copy to pageable memory
    # is synchronous, so nothing overlaps
    overlapped = max(t.compute, t.gradients) if pinned else t.compute + t.gradients
    # [ZeRO-Inf] the parameter swapper prefetches from NVMe into its buffers while the passes compute
    return max(overlapped, t.nvme_passes) + t.hooks + t.fetches + t.host_passes + t.activations + t.comm.passes


def _update(terms: StepTerms, strategy: Strategy, recompute: bool, pipelined_groups: int) -> float:
    """The update phase before its collectives, serial [seeds-O]: the optimizer, DeepSpeed's step and host copies,
    the weights across PCIe, the optimizer's NVMe swap, the engine's fixed cost; SuperOffload's and the pipelined
    swapper's variants."""
    t = terms
    update = t.adam + t.engine_step + t.host_update + t.weights + t.nvme_update + STEP_FIXED_SECONDS
    if strategy.super_offload:
        update = _super_offload_update(t, recompute)
    if pipelined_groups and t.nvme_update:
        update += _pipelined_swaps(t, pipelined_groups)
    return update


def _super_offload_update(terms: StepTerms, recompute: bool) -> float:
    """[SuperOffload] the update behind the backward, the upload after it."""
    backward = terms.compute * backward_share(recompute)
    return max(0.0, terms.adam + terms.host_update - backward) + terms.weights + STEP_FIXED_SECONDS


def _pipelined_swaps(terms: StepTerms, groups: int) -> float:
    """[DS-pipe] what the pipelined swapper changes: the swaps beside CPU-Adam, but the first read and last write."""
    on_host = terms.adam + terms.host_update
    return max(on_host, terms.nvme_update) + terms.nvme_update / groups - on_host - terms.nvme_update


def _zenflow_update(
    terms: StepTerms, interval: int, passes: float, selective: float, has_gpu: bool
) -> tuple[StepTerms, float]:
    """[ZenFlow] the host's update once per `interval` steps, its terms spread over them, and the update phase."""
    t = replace(
        terms,
        adam=terms.adam / interval,
        host_update=terms.host_update / interval,
        weights=terms.weights / interval,
        moved=replace(terms.moved, weights=terms.moved.weights // interval),
    )
    update = zenflow_update_seconds(
        interval * (t.adam + t.host_update + t.weights), selective, passes, interval, has_gpu
    )
    return t, update + STEP_FIXED_SECONDS


def zenflow_update_seconds(host_update: float, selective: float, passes: float, interval: int, has_gpu: bool) -> float:
    """[ZenFlow] the update phase per step: the device's selective update, and the part of the host's update (once
    per `interval` steps) that the next `interval` steps' passes do not hide, spread over them."""
    hidden = interval * passes if has_gpu else 0.0
    return selective + max(0.0, host_update - hidden) / interval


def _without_offload(
    terms: StepTerms,
    strategy: Strategy,
    step: float,
    params: int,
    world: int,
    ranks_per_node: int,
    rates: Rates,
    has_gpu: bool,
) -> float:
    """What the step would cost with nothing offloaded: the passes, ZeRO's own cost and collectives, the engine's,
    the optimizer where it would then run (on the GPU; the CPU accelerator's optimizer is on the CPU either way)."""
    t = terms
    without_offload = t.compute + t.hooks + t.comm.passes + t.comm.update + STEP_FIXED_SECONDS
    if not strategy.offloads:
        return step
    if strategy.offload_optimizer == "none":
        return without_offload + (t.adam + t.engine_step)
    # the optimizer where it would run: on the GPU, or torch's fused AdamW on the CPU accelerator
    adam = plain_optimizer_seconds(params, world, ranks_per_node, rates, has_gpu)
    zero3 = strategy.zero_stage >= 3
    return without_offload + (adam + no_offload_step_seconds(params, world, ranks_per_node, rates, has_gpu, zero3))


def estimate_step(
    shape: Shape,
    strategy: Strategy,
    rates: Rates,
    *,
    world: int,
    ranks_per_node: int,
    has_gpu: bool,
    pinned: bool = True,
    gpu_share: float = 0.0,
    pipelined_groups: int = 0,
) -> StepEstimate:
    """Both phases of one optimizer step [seeds-O]. Passes: the compute, or the gradient copies it overlaps when
    they take longer, then the ZeRO-3 hooks and the parameter fetches (PCIe, NVMe), which wait. Update: CPU-Adam,
    DeepSpeed's host copies, the weights across PCIe, the optimizer's NVMe swap, the engine's fixed cost.
    `pinned`: whether the offloaded host buffers are page-locked (pin_memory), which sets the copy rate;
    `pipelined_groups`: the optimizer's sub-groups per rank when its NVMe swaps are pipelined ([DS-pipe]; 0: serial);
    `gpu_share`: the optimizer's share a partial offload keeps on the GPU (memory.optimizer_gpu_share); 0 on the
    CPU accelerator, where that "device" is the CPU and DeepSpeed steps every sub-group with CPU-Adam (stage3.py
    `_optimizer_step`: cur_device == 'cpu')."""
    params = shape.optimized
    t = step_terms(
        shape,
        strategy,
        rates,
        world=world,
        ranks_per_node=ranks_per_node,
        has_gpu=has_gpu,
        pinned=pinned,
        gpu_share=gpu_share,
    )
    passes = _passes(t, pinned)
    update = _update(t, strategy, shape.recompute, pipelined_groups)
    if strategy.zenflow_interval:
        selective = ZENFLOW_TOPK_RATIO * plain_optimizer_seconds(params, world, ranks_per_node, rates, has_gpu)
        t, update = _zenflow_update(t, strategy.zenflow_interval, passes, selective, has_gpu)
    update += t.comm.update  # [network] the updated weights gathered after the step
    step = passes + update
    without_offload = _without_offload(t, strategy, step, params, world, ranks_per_node, rates, has_gpu)
    tokens_per_step = shape.tokens_per_micro_batch * shape.grad_accum * world
    return StepEstimate(
        compute_seconds_per_step=t.compute,
        pcie_bytes_per_step=t.moved.total,
        pcie_seconds_per_step=t.pcie,
        cpu_adam_seconds_per_step=t.adam,
        nvme_bytes_per_step=t.nvme_bytes,
        nvme_seconds_per_step=t.nvme_passes + t.nvme_update,
        step_seconds=step,
        tokens_per_s=tokens_per_step / step,
        offload_overhead_fraction=max(0.0, 1.0 - without_offload / step),
        host_copy_seconds_per_step=t.host_copies,
        framework_seconds_per_step=t.hooks + STEP_FIXED_SECONDS,
        passes_seconds=passes,
        update_seconds=update,
        collective_bytes_per_step=t.comm.bytes,
        collective_seconds_per_step=t.comm.seconds,
    )
