"""Capacity and sizing: what each memory tier of a host offers, whether a strategy's estimate fits in it, and
the integer sizes (buckets, swap buffers, sub-groups) a strategy is sized with on a host.

Pure, like the planner that uses it: same (model, host, strategy) in, same numbers out.
"""

from __future__ import annotations

from launcher.inspection.hostprofile import HostProfile
from launcher.inspection.model import ModelProfile
from launcher.plan import memory
from launcher.plan.memory import Buckets, MemoryEstimate, ModelShape, Strategy
from launcher.units import fmt_bytes

# DeepSpeed defaults for the swap machinery (offload_config.py), kept unless the host calls for less.
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000
DEFAULT_PARAM_BUFFER_SIZE = 100_000_000
OPTIMIZER_BUFFER_COUNT = 4  # FIELD-NOTES: >= number of Adam states (param, m, v, grad)
PARAM_BUFFER_COUNT = 5
MAX_IN_CPU = 1_000_000_000
AIO_ALIGNED_BYTES = 1024  # deepspeed/runtime/swap_tensor/constants.py: swap partitions align to 1 KiB
SWAP_BUFFER_RAM_FRACTION = 0.10  # at most this share of a node's RAM for the optimizer swap buffers
# [Twin-Flow] (memory.py) DeepSpeed splits a partial offload by whole sub-groups: a partial offload's partition is cut
# into about this many, so the share kept on the GPU moves in steps of ~5 % (with DeepSpeed's 1e9-element default a
# 7B partition has 7 sub-groups: steps of 14 %). Each sub-group is one optimizer.step() call: 20 cost nothing.
PARTIAL_OFFLOAD_SUB_GROUPS = 20


# ------------------------------------------------------------------------------------------ capacity


def usable_gpu_bytes(host: HostProfile) -> int:
    return int(host.gpus.memory_bytes * memory.GPU_USABLE_FRACTION)


def usable_cpu_bytes(host: HostProfile) -> int:
    return int(min(host.cpu_memory_available_bytes, host.cpu_memory_bytes) * memory.CPU_USABLE_FRACTION)


def usable_nvme_bytes(host: HostProfile) -> int:
    return int(host.nvme.free_bytes * memory.NVME_USABLE_FRACTION) if host.nvme else 0


def fit_problems(strategy: Strategy, estimate: MemoryEstimate, host: HostProfile) -> tuple[str, ...]:
    problems = []
    if host.has_gpu and estimate.gpu_bytes_per_device > usable_gpu_bytes(host):
        problems.append(
            f"GPU needs {fmt_bytes(estimate.gpu_bytes_per_device)} per device > "
            f"{fmt_bytes(usable_gpu_bytes(host))} usable"
        )
    if estimate.cpu_bytes > usable_cpu_bytes(host):
        problems.append(f"CPU RAM needs {fmt_bytes(estimate.cpu_bytes)} > {fmt_bytes(usable_cpu_bytes(host))} usable")
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
    alignment = AIO_ALIGNED_BYTES // memory.BYTES_16BIT
    partition = -(-numel // world)
    return -(-partition // alignment) * alignment


def size_buckets(model: ModelProfile, host: HostProfile, strategy: Strategy, world: int, ranks: int) -> Buckets:
    """Integer bucket sizes from the hidden size, by Hugging Face's "auto" conventions
    (transformers integrations/deepspeed.py: reduce = h², prefetch = 0.9·h², persistence = 10·h)."""
    h = model.hidden_size
    sub_group = DEFAULT_SUB_GROUP_SIZE
    if strategy.offload_optimizer == "nvme":
        # Optimizer swap buffers pin (buffer_count + 1) x largest sub-group x 4 B per rank [DS-swap], and a
        # sub-group can overshoot sub_group_size by one partition: cap the buffers at a tenth of the node's
        # RAM, never below 10M elements.
        budget_numel = SWAP_BUFFER_RAM_FRACTION * host.cpu_memory_bytes / ranks / ((OPTIMIZER_BUFFER_COUNT + 1) * 4)
        overshoot = -(-model.largest_param_numel // world)
        sub_group = int(min(DEFAULT_SUB_GROUP_SIZE, max(10_000_000, budget_numel - overshoot)))
    elif strategy.partial:
        sub_group = partial_offload_sub_group_size(model.params, world)
    return Buckets(
        reduce_bucket_size=h * h,
        allgather_bucket_size=h * h,
        prefetch_bucket_size=int(0.9 * h * h),
        param_persistence_threshold=10 * h,
        sub_group_size=sub_group,
        optimizer_buffer_count=OPTIMIZER_BUFFER_COUNT,
        param_buffer_count=PARAM_BUFFER_COUNT,
        param_buffer_size=max(DEFAULT_PARAM_BUFFER_SIZE, aligned_partition_numel(model.largest_param_numel, world)),
        max_in_cpu=MAX_IN_CPU,
        # ZeRO-3's live gathered parameters ([DS-live]): bounded per plan, two of the largest blocks; the ds_config
        # gets the same numbers (dsconfig._zero_section), so the GPU estimate counts what DeepSpeed keeps.
        max_live_parameters=memory.zero3_live_parameter_limit(model.layer_params),
        max_reuse_distance=memory.zero3_live_parameter_limit(model.layer_params),
    )


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
    )
