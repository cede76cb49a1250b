"""Step-time model: the seeds' race between moving bytes and computing, per candidate strategy.

One function per term, each citing its source. P = parameters, N = ranks in all, R = ranks per node,
T = tokens per rank per optimizer step (micro-batch x accumulation x sequence length).

Sources:
  [seeds-F]   "CPU Offload Math": a step costs ~6·P FLOPs per token (forward + backward); activation
              recomputation adds a forward, ~8·P (the seeds' "8 with recomputation").
  [seeds-B]   ZeRO-Offload moves 2 B/param of 16-bit gradients down and 2 B/param of updated 16-bit weights
              up per optimizer step: 4 B/param, the minimum, independent of the batch. DeepSpeed's compact
              gradient partition buffer accumulates on the GPU and copies once at the step boundary
              (stage_1_and_2.py `copy_grads_in_partition`).
  [seeds-A]   CPU-Adam streams the 12 B/param of fp32 state through DRAM once per step: t = 12·P / bandwidth.
  [ZeRO-Inf]  Rajbhandari et al. 2021, "ZeRO-Infinity": with parameters offloaded, each rank fetches its
              16-bit partition before the forward and again before the backward of every micro-batch;
              with the optimizer on NVMe the fp32 master, m, v (12 B) and fp32 gradient (4 B) are read and
              written once per step.
  [seeds-O]   "The swap math": overlapped work costs max(t_compute, t_move), serial work the sum.
              DeepSpeed overlaps gradient copies with the backward (overlap_comm); the CPU-Adam step,
              the weight upload after it, parameter fetches and the NVMe swap are charged serially.
  [pageable]  A copy from pageable host memory cannot be DMAed directly: the CUDA driver stages it through a
              pinned bounce buffer, one extra CPU memcpy per chunk, and the copy is synchronous (CUDA C++
              Best Practices Guide, "Pinned Memory"; M. Harris, "How to Optimize Data Transfers in CUDA
              C/C++", NVIDIA blog 2012, bandwidthTest pinned vs pageable). `offload-launch probe` measures
              both (rates.py `measure_pcie`); without a measured pageable figure the model assumes half the
              pinned rate (PAGEABLE_TO_PINNED), an assumption, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.memory import BYTES_16BIT, BYTES_FP32, OPTIMIZER_BYTES_PER_PARAM, Strategy

# [pageable] pageable / pinned host<->device bandwidth when no pageable rate was measured (an assumption).
PAGEABLE_TO_PINNED = 0.5
MFU = 0.5  # achievable fraction of a GPU's peak dense TFLOP/s in training (PaLM reports 46 %, Chowdhery 2022)


@dataclass(frozen=True)
class Rates:
    """The figures the model runs on, each with where it came from ("measured", "described", "nominal")."""

    compute_flops_per_s: float  # useful FLOP/s per rank (peak x MFU on a GPU)
    pcie_bytes_per_s: float  # host<->device from pinned memory, per direction, per GPU
    cpu_adam_params_per_s: float  # per node, all cores
    nvme_read_bytes_per_s: float  # per node
    nvme_write_bytes_per_s: float
    sources: dict  # figure name -> "measured" | "described" | "nominal"
    pcie_pageable_bytes_per_s: float | None = None  # the same from pageable memory, when measured

    def host_device_bytes_per_s(self, pinned: bool) -> float:
        """The host<->device rate DeepSpeed's offload copies get: pinned, or pageable when pin_memory is off
        (measured, else PAGEABLE_TO_PINNED x pinned [pageable])."""
        if pinned:
            return self.pcie_bytes_per_s
        return self.pcie_pageable_bytes_per_s or self.pcie_bytes_per_s * PAGEABLE_TO_PINNED


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
    offload_overhead_fraction: float  # share of the step not spent computing

    def to_json(self) -> dict:
        return {
            "compute_seconds_per_step": self.compute_seconds_per_step,
            "pcie_bytes_per_step": self.pcie_bytes_per_step,
            "pcie_seconds_per_step": self.pcie_seconds_per_step,
            "cpu_adam_seconds_per_step": self.cpu_adam_seconds_per_step,
            "nvme_bytes_per_step": self.nvme_bytes_per_step,
            "nvme_seconds_per_step": self.nvme_seconds_per_step,
            "step_seconds": self.step_seconds,
            "tokens_per_s": self.tokens_per_s,
            "offload_overhead_fraction": self.offload_overhead_fraction,
        }


def flops_per_token(params: int, recompute: bool) -> int:
    """[seeds-F] 6·P (forward 2·P + backward 4·P), 8·P when activations are recomputed."""
    return (8 if recompute else 6) * params


def compute_seconds(params: int, tokens_per_rank: int, recompute: bool, flops_per_s: float) -> float:
    return flops_per_token(params, recompute) * tokens_per_rank / flops_per_s


def pcie_bytes(params: int, strategy: Strategy, world: int, grad_accum: int) -> tuple[int, int]:
    """(overlapped, serial) host<->device bytes per GPU per optimizer step.

    Optimizer offloaded: gradients down (2 B/param, overlapped with backward) and updated weights up
    (2 B/param, after the CPU step) [seeds-B]. Parameters offloaded: the 16-bit partition is fetched for
    the forward and again for the backward of every micro-batch (2 x 2 B/param) [ZeRO-Inf]; the updated
    weights then stay on the host, so there is no upload. The fetches are charged in full: prefetching
    hides only part of them in practice (DeepSpeed issue 3901, Falcon-7B on 8 x A100: ZeRO-3 2.86 s/step,
    with parameter offload 6.05 s/step)."""
    partition = params // world
    overlapped = serial = 0
    if strategy.offload_optimizer != "none":
        overlapped += BYTES_16BIT * partition
        if strategy.offload_param == "none":
            serial += BYTES_16BIT * partition
    if strategy.offload_param != "none":
        serial += 2 * BYTES_16BIT * partition * grad_accum
    return overlapped, serial


def cpu_adam_seconds(params: int, world: int, ranks_per_node: int, params_per_s: float) -> float:
    """[seeds-A] the node updates the partitions of its R ranks with all its cores."""
    return params * ranks_per_node / world / params_per_s


def nvme_bytes(params: int, strategy: Strategy, world: int, ranks_per_node: int, grad_accum: int) -> tuple[int, int]:
    """(read, write) NVMe bytes per node per optimizer step [ZeRO-Inf]."""
    per_node = params * ranks_per_node // world
    read = write = 0
    if strategy.offload_optimizer == "nvme":
        state = (OPTIMIZER_BYTES_PER_PARAM + BYTES_FP32) * per_node  # master, m, v + fp32 gradient
        read += state
        write += state
    if strategy.offload_param == "nvme":
        read += 2 * BYTES_16BIT * per_node * grad_accum  # forward + backward fetches
        write += BYTES_16BIT * per_node  # updated weights
    return read, write


def estimate_step(
    params: int,
    strategy: Strategy,
    rates: Rates,
    *,
    world: int,
    ranks_per_node: int,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    recompute: bool,
    has_gpu: bool,
    compute_params: int | None = None,
    pinned: bool = True,
) -> StepEstimate:
    """`params` size the transfers and the optimizer; `compute_params` (default: all of them) the FLOPs;
    `pinned`: whether the offloaded host buffers are page-locked (pin_memory), which sets the copy rate."""
    tokens_per_rank = micro_batch * grad_accum * seq_len
    t_compute = compute_seconds(compute_params or params, tokens_per_rank, recompute, rates.compute_flops_per_s)
    overlapped, serial = pcie_bytes(params, strategy, world, grad_accum) if has_gpu else (0, 0)
    if not pinned:  # [pageable] a copy to pageable memory is synchronous: nothing overlaps the backward
        overlapped, serial = 0, overlapped + serial
    pcie_rate = rates.host_device_bytes_per_s(pinned)
    t_pcie_overlapped = overlapped / pcie_rate
    t_pcie_serial = serial / pcie_rate
    # Without offload the optimizer runs where the weights are: fused on the GPU (negligible next to the
    # passes), or on the CPU accelerator, where it is the same memory-bound CPU loop as CPU-Adam.
    optimizer_on_cpu = strategy.offload_optimizer != "none" or not has_gpu
    t_adam = cpu_adam_seconds(params, world, ranks_per_node, rates.cpu_adam_params_per_s) if optimizer_on_cpu else 0.0
    read, write = nvme_bytes(params, strategy, world, ranks_per_node, grad_accum)
    t_nvme = read / rates.nvme_read_bytes_per_s + write / rates.nvme_write_bytes_per_s
    # [seeds-O]: copies that overlap compute cost max(); the update, the upload and the swap add.
    step = max(t_compute, t_pcie_overlapped) + t_pcie_serial + t_adam + t_nvme
    tokens_per_step = tokens_per_rank * world
    return StepEstimate(
        compute_seconds_per_step=t_compute,
        pcie_bytes_per_step=overlapped + serial,
        pcie_seconds_per_step=t_pcie_overlapped + t_pcie_serial,
        cpu_adam_seconds_per_step=t_adam,
        nvme_bytes_per_step=read + write,
        nvme_seconds_per_step=t_nvme,
        step_seconds=step,
        tokens_per_s=tokens_per_step / step,
        offload_overhead_fraction=max(0.0, 1.0 - t_compute / step),
    )
