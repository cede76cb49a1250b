"""Capacity and sizing: what each memory tier of a host offers, whether a strategy's estimate fits in it, and
the integer sizes (buckets, swap buffers, sub-groups) a strategy is sized with on a host.

Pure, like the planner that uses it: same (model, host, strategy) in, same numbers out.
"""

from __future__ import annotations

import math
from dataclasses import replace

from launcher.inspection.hostprofile import HostProfile
from launcher.inspection.model import ModelProfile
from launcher.plan.memory import MemoryEstimate, zero3_live_parameter_limit
from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import BYTES_16BIT, BYTES_FP32, Buckets, Strategy
from launcher.units import fmt_bytes

# DeepSpeed defaults for the swap machinery (offload_config.py), kept unless the host calls for less.
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000
DEFAULT_PARAM_BUFFER_SIZE = 100_000_000
OPTIMIZER_BUFFER_COUNT = 4  # FIELD-NOTES: >= number of Adam states (param, m, v, grad)
# [DS-pipe] DeepSpeed's PipelinedOptimizerSwapper (swap_tensor/pipelined_optimizer_swapper.py
# `_swap_in_optimizer_state`) takes num_tensors (fp32 param, m, v) + 1 (gradient) = 4 buffers per sub-group in
# flight, asserting "ran out of swap buffers, try increasing 'buffer_count'": with pipeline_read and pipeline_write
# the next sub-group is read and the previous written while the current one steps: 3 x 4 buffers.
PIPELINED_BUFFER_COUNT = 3 * OPTIMIZER_BUFFER_COUNT
# The smallest sub-group worth pipelining: 10 M fp32 elements make 40 MB per swap request, past the size where a
# single NVMe drive's sequential bandwidth levels off (the probe's sweep writes 16-64 MB blocks); below it the
# requests get too small and pipelining costs more buffers than it hides.
MIN_SUB_GROUP = 10_000_000
PARAM_BUFFER_COUNT = 5
MAX_IN_CPU = 1_000_000_000
AIO_ALIGNED_BYTES = 1024  # deepspeed/runtime/swap_tensor/constants.py: swap partitions align to 1 KiB
SWAP_BUFFER_RAM_FRACTION = 0.10  # at most this share of a node's RAM for the optimizer swap buffers
# [Twin-Flow] (subgroups.py) DeepSpeed splits a partial offload by whole sub-groups: a partial offload's partition is
# cut into about this many, so the share kept on the GPU moves in steps of ~5 % (with DeepSpeed's 1e9-element default
# a 7B partition has 7 sub-groups: steps of 14 %). Each sub-group is one optimizer.step() call: 20 cost nothing.
PARTIAL_OFFLOAD_SUB_GROUPS = 20
GPU_USABLE_FRACTION = 0.90  # allocator fragmentation headroom on the GPU
# Host RAM a run cannot use, beside what its ranks hold (the ranks' own processes are memory.py's baseline term):
# - the processes beside the ranks for the whole run: the offload-launch command (343 MiB RSS), DeepSpeed's runner
#   (245 MiB) and its per-node launch.py (245 MiB), the supervisor (11 MiB): 844 MiB measured here during a run;
# - on a live host, nothing else: MemAvailable (/proc/meminfo, read by inspection/host.py) is the kernel's own
#   estimate of what new work can take without swapping, net of its reserves and of page cache it cannot drop
#   (Documentation/filesystems/proc.rst);
# - on a described host, whose figure is the installed RAM: the kernel's page-frame array, one 64-byte struct page
#   per 4 KiB page (Documentation/mm/memory-model.rst; 1/64 of RAM), and an allowance of 1 GiB for the kernel's slab
#   and page tables and an idle server's daemons (stated, not measured: a live host measures it).
SIDE_PROCESSES_BYTES = 844 * 2**20
MEMMAP_SHARE = 1 / 64
DESCRIBED_OS_BYTES = 2**30
NVME_USABLE_FRACTION = 0.95


# ------------------------------------------------------------------------------------------ capacity


def usable_gpu_bytes(host: HostProfile) -> int:
    return int(host.gpus.memory_bytes * GPU_USABLE_FRACTION)


def usable_cpu_bytes(host: HostProfile) -> int:
    """Host RAM per node a run's peak may reach: what the kernel says is available (live), or the installed RAM less
    the kernel's and the OS's share (described), less the processes beside the ranks."""
    if host.source == "live":
        free = min(host.cpu_memory_available_bytes, host.cpu_memory_bytes)
    else:
        free = int(host.cpu_memory_bytes * (1 - MEMMAP_SHARE)) - DESCRIBED_OS_BYTES
    return max(0, free - SIDE_PROCESSES_BYTES)


def cpu_memory_for(need: int, host: HostProfile) -> int:
    """The least RAM per node (installed, or available on a live host) whose usable_cpu_bytes holds `need`."""
    if host.source == "live":
        return need + SIDE_PROCESSES_BYTES
    installed = math.ceil((need + SIDE_PROCESSES_BYTES + DESCRIBED_OS_BYTES) / (1 - MEMMAP_SHARE))
    while usable_cpu_bytes(replace(host, cpu_memory_bytes=installed - 1)) >= need:  # int() rounding: at most a step
        installed -= 1
    return installed


def usable_nvme_bytes(host: HostProfile) -> int:
    return int(host.nvme.free_bytes * NVME_USABLE_FRACTION) if host.nvme else 0


def fit_problems(strategy: Strategy, estimate: MemoryEstimate, host: HostProfile) -> tuple[str, ...]:
    problems = []
    if host.has_gpu and estimate.gpu_bytes_per_device > usable_gpu_bytes(host):
        problems.append(
            f"GPU needs {fmt_bytes(estimate.gpu_bytes_per_device)} per device > "
            f"{fmt_bytes(usable_gpu_bytes(host))} usable"
        )
    if estimate.cpu_bytes > usable_cpu_bytes(host):
        problems.append(
            f"CPU RAM needs {fmt_bytes(estimate.cpu_bytes)} at the {estimate.cpu_peak_moment} > "
            f"{fmt_bytes(usable_cpu_bytes(host))} usable"
        )
    if "nvme" in (strategy.offload_optimizer, strategy.offload_param):
        if host.nvme is None:
            problems.append("no NVMe: pass --nvme-path DIR")
        elif estimate.nvme_bytes > usable_nvme_bytes(host):
            problems.append(f"NVMe needs {fmt_bytes(estimate.nvme_bytes)} > {fmt_bytes(usable_nvme_bytes(host))} free")
    return tuple(problems)


# ------------------------------------------------------------------------------------------ sizing


def aligned_partition_numel(numel: int, world: int) -> int:
    """A tensor's per-rank ZeRO-3 partition as the swapper sees it: ceil(numel / N), rounded up to the
    aio alignment (1 KiB = 512 fp16 elements) - what offload_param.buffer_size must hold (DeepSpeed issue
    3506, "More elements N than buffer size")."""
    alignment = AIO_ALIGNED_BYTES // BYTES_16BIT
    partition = -(-numel // world)
    return -(-partition // alignment) * alignment


def size_buckets(
    model: ModelProfile,
    host: HostProfile,
    strategy: Strategy,
    world: int,
    ranks: int,
    *,
    nvme_pipeline: bool = True,
    pinned: dict | None = None,
) -> Buckets:
    """Integer bucket sizes from the hidden size, by Hugging Face's "auto" conventions
    (transformers integrations/deepspeed.py: reduce = h², prefetch = 0.9·h², persistence = 10·h); `pinned`: the
    sizes a user's ds_config sets (config/merge.bucket_pins), which DeepSpeed will use instead."""
    return replace(_sized_buckets(model, host, strategy, world, ranks, nvme_pipeline=nvme_pipeline), **(pinned or {}))


def _sized_buckets(
    model: ModelProfile, host: HostProfile, strategy: Strategy, world: int, ranks: int, *, nvme_pipeline: bool
) -> Buckets:
    h = model.hidden_size
    sub_group = DEFAULT_SUB_GROUP_SIZE
    buffer_count, pipeline = OPTIMIZER_BUFFER_COUNT, False
    if strategy.offload_optimizer == "nvme":
        sub_group, buffer_count, pipeline = nvme_optimizer_sizing(model, host, world, ranks, pipeline=nvme_pipeline)
    elif strategy.partial:
        sub_group = partial_offload_sub_group_size(model.optimized_params, world)
    return Buckets(
        reduce_bucket_size=h * h,
        allgather_bucket_size=h * h,
        prefetch_bucket_size=int(0.9 * h * h),
        # a LoRA's tensors stay whole on every rank (config/lint_adapters.py [DS-persist]): no gather of a few
        # thousand elements per module per pass, and peft's own save works too
        param_persistence_threshold=max(10 * h, model.largest_optimized_numel if model.trainable_params else 0),
        sub_group_size=sub_group,
        optimizer_buffer_count=buffer_count,
        pipeline=pipeline,
        param_buffer_count=PARAM_BUFFER_COUNT,
        param_buffer_size=max(DEFAULT_PARAM_BUFFER_SIZE, aligned_partition_numel(model.largest_param_numel, world)),
        max_in_cpu=MAX_IN_CPU,
        # ZeRO-3's live gathered parameters ([DS-live]): bounded per plan, two of the largest blocks; the ds_config
        # gets the same numbers (dsconfig._zero_section), so the GPU estimate counts what DeepSpeed keeps.
        max_live_parameters=zero3_live_parameter_limit(model.layer_params),
        max_reuse_distance=zero3_live_parameter_limit(model.layer_params),
    )


def nvme_optimizer_sizing(
    model: ModelProfile, host: HostProfile, world: int, ranks: int, *, pipeline: bool = True
) -> tuple[int, int, bool]:
    """(sub_group_size, buffer_count, pipelined) for the optimizer on NVMe. The swap buffers pin (buffer_count + 1)
    x the largest sub-group x 4 B per rank [DS-swap], and a sub-group can overshoot sub_group_size by one
    partition; they get at most a tenth of the node's RAM. Pipelined ([DS-pipe]: the next sub-group read and the
    previous written while one steps; timing [DS-pipe]) with PIPELINED_BUFFER_COUNT buffers of MIN_SUB_GROUP
    elements when the budget holds them and the partition has more than one: requests large enough for the
    drive's bandwidth, and as many sub-groups as that allows, since only the first read and the last write (one
    sub-group each) are not hidden - so more RAM never changes the choice once it fits. Else DeepSpeed's serial
    swapper with OPTIMIZER_BUFFER_COUNT buffers of sub-groups as large as the budget allows (fewer, larger
    requests; the serial swap costs the same whatever their number), never below MIN_SUB_GROUP nor above
    DeepSpeed's default."""
    overshoot = -(-model.largest_optimized_numel // world)
    partition = model.optimized_params // world

    def largest(count: int) -> int:
        budget_numel = SWAP_BUFFER_RAM_FRACTION * host.cpu_memory_bytes / ranks / ((count + 1) * BYTES_FP32)
        return int(min(DEFAULT_SUB_GROUP_SIZE, budget_numel - overshoot))

    if pipeline and largest(PIPELINED_BUFFER_COUNT) >= MIN_SUB_GROUP and partition > MIN_SUB_GROUP:
        return MIN_SUB_GROUP, PIPELINED_BUFFER_COUNT, True
    return max(MIN_SUB_GROUP, largest(OPTIMIZER_BUFFER_COUNT)), OPTIMIZER_BUFFER_COUNT, False


def partial_offload_sub_group_size(params: int, world: int) -> int:
    """sub_group_size for a partial offload: the rank's partition in PARTIAL_OFFLOAD_SUB_GROUPS pieces, never
    above DeepSpeed's default."""
    return max(1, min(DEFAULT_SUB_GROUP_SIZE, -(-(params // world) // PARTIAL_OFFLOAD_SUB_GROUPS)))


def model_shape(model: ModelProfile, buckets: Buckets) -> ModelShape:
    return ModelShape(
        params=model.params,
        largest_param_numel=model.largest_param_numel,
        layer_params=model.layer_params,
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        vocab_size=model.vocab_size,
        persistent_params=model.params_below(buckets.param_persistence_threshold),
        param_numels=model.param_numels,
        cross_attention_layers=model.cross_attention_layers,
        attention_width=model.attention_width,
        trainable_params=model.trainable_params,
        trainable_numels=model.trainable_numels,
        adapter_saved_bytes_per_token=model.adapter_saved_bytes_per_token,
    )
