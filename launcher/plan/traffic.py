"""The bytes a step moves over PCIe, through host memory and to NVMe.

P = parameters, N = ranks in all, R = ranks per node, M = micro-batches per optimizer step (timing.py).

Sources:
  [seeds-B]   ZeRO-Offload moves 2 B/param of 16-bit gradients down and 2 B/param of updated 16-bit weights
              up per optimizer step: 4 B/param, the minimum, independent of the batch. DeepSpeed's compact
              gradient partition buffer accumulates on the GPU and copies once at the step boundary
              (stage_1_and_2.py `copy_grads_in_partition`).
  [DS-step]   What DeepSpeed does in host memory around CPU-Adam, read in stage_1_and_2.py / stage3.py: the
              16-bit gradients are widened into the fp32 partition (read 2 B, write 4 B per param; on the CPU
              accelerator a host copy during the backward, on a GPU part of the overlapped transfer); the step
              reads that partition for the norm (`complete_grad_norm_calculation_for_cpu_offload`, 4 B), CPU-Adam
              runs (not fused with the copy back: `_optimizer_step` calls plain `optimizer.step()`), and
              `_update_model_bit16_weights` narrows the fp32 master into the 16-bit copy (read 4 B, write 2 B):
              10 B/param in the update besides the 28 B CPU-Adam streams (compute.py [seeds-A]), at the rank's share
              of the bandwidth. With 16-bit optimizer states, half the state-sized bytes (compute.py [bf16-states]).
  [ZeRO-Inf]  Rajbhandari et al. 2021, "ZeRO-Infinity": with parameters offloaded, each rank fetches its
              16-bit partition before the forward and again before the backward of every micro-batch;
              with the optimizer on NVMe the fp32 master, m, v (12 B) are read in and written out once per
              step, a sub-group at a time, the write of one overlapping the read of the next
              (partitioned_optimizer_swapper.py), so the slower direction sets the time. The fp32 gradients'
              swap (4 B) goes out during the backward and is not charged: the bench's NVMe rows measure update
              phases of 0.44-0.62 of the summed 16 B read + 16 B written.
  [act-offload] With the activations offloaded (host_buffers.py [act-offload]) each saved tensor goes to the host in the
              forward, synchronously (`pack_to_cpu` copy_ into a pinned tensor), and comes back in the backward: twice
              its bytes across PCIe per micro-batch, charged serially in the passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.host_buffers import offloaded_activation_numels
from launcher.plan.rates import Rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import BYTES_16BIT, BYTES_FP32, OPTIMIZER_BYTES_PER_PARAM, Strategy


def host_update_bytes(state_bytes: int) -> int:
    """[DS-step] per parameter in the update: the norm's read and the narrowing's read of the state-sized master
    and gradient, the 16-bit write: 10 B with fp32 states, 6 with bf16 (compute.py [bf16-states])."""
    return 2 * state_bytes + BYTES_16BIT


def host_widen_bytes(state_bytes: int) -> int:
    """[DS-step] per parameter and micro-batch on the CPU accelerator: the 16-bit gradient read, the state-sized
    write: 6 B with fp32 states, 4 with bf16 (compute.py [bf16-states])."""
    return BYTES_16BIT + state_bytes


# [DS-step] host memory bytes per parameter around CPU-Adam: the norm's read (4), the narrowing (4 + 2) in the update;
# the widening of the gradients (2 + 4) per micro-batch, a host copy in the passes on the CPU accelerator.
HOST_UPDATE_BYTES_PER_PARAM = host_update_bytes(BYTES_FP32)
HOST_WIDEN_BYTES_PER_PARAM = host_widen_bytes(BYTES_FP32)


@dataclass(frozen=True)
class Transfers:
    """Host<->device bytes per GPU per optimizer step, by when they move [seeds-B] [ZeRO-Inf]."""

    gradients: int = 0  # 16-bit gradients down, overlapped with the backward (overlap_comm)
    fetches: int = 0  # offloaded 16-bit parameters up, before each forward and backward: in the passes
    weights: int = 0  # updated 16-bit weights across after the optimizer step: in the update

    @property
    def total(self) -> int:
        return self.gradients + self.fetches + self.weights


def transfers(params: int, strategy: Strategy, world: int, grad_accum: int, trainable: int = 0) -> Transfers:
    """Optimizer offloaded: gradients down (2 B/param, overlapped with backward) and updated weights up
    (2 B/param, after the CPU step) [seeds-B]. Parameters offloaded: the 16-bit partition is fetched for
    the forward and again for the backward of every micro-batch (2 x 2 B/param) [ZeRO-Inf]; with the optimizer
    on the host the updated weights then stay there (no upload); with the optimizer on the GPU the updated
    partition goes back down (2 B/param). The fetches are charged in full: prefetching hides only part of them
    in practice (DeepSpeed issue 3901, Falcon-7B on 8 x A100: ZeRO-3 2.86 s/step, with parameter offload
    6.05 s/step). With an adapter (`trainable` of the `params`: memory.py [DS-frozen]) only its gradients and
    weights move after the backward; the frozen base is fetched like any parameter."""
    partition, optimized = params // world, (trainable or params) // world
    gradients = fetches = weights = 0
    if strategy.offload_optimizer != "none":
        gradients = BYTES_16BIT * optimized
        if strategy.offload_param == "none":
            weights = BYTES_16BIT * optimized
    if strategy.offload_param != "none":
        fetches = 2 * BYTES_16BIT * partition * grad_accum
        if strategy.offload_optimizer == "none":
            weights = BYTES_16BIT * optimized
    return Transfers(gradients, fetches, weights)


def pcie_bytes(params: int, strategy: Strategy, world: int, grad_accum: int) -> tuple[int, int]:
    """(overlapped, serial) host<->device bytes per GPU per optimizer step (`transfers`)."""
    moved = transfers(params, strategy, world, grad_accum)
    return moved.gradients, moved.fetches + moved.weights


def host_bytes(
    params: int, strategy: Strategy, world: int, moved: Transfers, has_gpu: bool, accum: int
) -> tuple[int, int]:
    """(passes, update) bytes of host memory traffic per rank per optimizer step where the optimizer runs on the
    host (offloaded, or on the CPU accelerator): [DS-step]'s norm and narrowing in the update, and on the CPU
    accelerator the widening of each micro-batch's gradients in the passes and the transfers, which are memcpys
    there (each byte read and written)."""
    optimizer_on_host = strategy.offload_optimizer != "none" or not has_gpu
    update = host_update_bytes(strategy.state_bytes) * params // world if optimizer_on_host else 0
    passes = 0
    if not has_gpu:
        passes = host_widen_bytes(strategy.state_bytes) * params // world * accum + 2 * moved.fetches
        update += 2 * moved.weights
    return passes, update


def nvme_bytes(params: int, strategy: Strategy, world: int, ranks_per_node: int, grad_accum: int) -> tuple[int, int]:
    """(read, write) NVMe bytes per node per optimizer step [ZeRO-Inf]."""
    fetched, (read, write) = nvme_parts(params, strategy, world, ranks_per_node, grad_accum)
    return fetched + read, write


def nvme_parts(
    params: int, strategy: Strategy, world: int, ranks_per_node: int, grad_accum: int, trainable: int = 0
) -> tuple[int, tuple[int, int]]:
    """(parameter reads in the passes, (read, write) in the update) NVMe bytes per node per step [ZeRO-Inf]; with an
    adapter (`trainable`) the optimizer's states and the updated weights are the adapter's only."""
    per_node = params * ranks_per_node // world
    optimized = (trainable or params) * ranks_per_node // world
    fetched = read = write = 0
    if strategy.offload_optimizer == "nvme":
        state = OPTIMIZER_BYTES_PER_PARAM * optimized  # master, m, v: in before the step, out after it
        read += state
        write += state
    if strategy.offload_param == "nvme":
        fetched = 2 * BYTES_16BIT * per_node * grad_accum  # forward + backward fetches
        write += BYTES_16BIT * optimized  # updated weights
    return fetched, (read, write)


def nvme_seconds(fetched: int, read: int, write: int, rates: Rates) -> tuple[float, float]:
    """(passes, update) seconds of NVMe traffic: the parameter reads, and [ZeRO-Inf] the optimizer's swap, where the
    swapper writes a sub-group out while it reads the next one in, so the slower direction counts."""
    t_passes = fetched / rates.nvme_read_bytes_per_s
    return t_passes, max(read / rates.nvme_read_bytes_per_s, write / rates.nvme_write_bytes_per_s)


def activation_copy_seconds(shape: Shape, strategy: Strategy, rates: Rates, has_gpu: bool, pinned: bool) -> float:
    """[act-offload] the saved tensors down in the forward and up in the backward, every micro-batch; on the CPU
    accelerator a host copy each way (read and write)."""
    if strategy.offload_activations == "none" or not shape.recompute:
        return 0.0
    saved = offloaded_activation_numels(
        shape.seq_len, shape.micro_batch, shape.hidden, shape.layers, shape.vocab, shape.cross_layers
    )
    moved = 2 * sum(saved)
    rate = rates.host_device_bytes_per_s(pinned) if has_gpu else (rates.cpu_memory_bytes_per_s or 0) / 2
    return moved * shape.grad_accum / rate if rate else 0.0
