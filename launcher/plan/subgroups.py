"""ZeRO-3's optimizer sub-groups as stage3.py forms them, and the share a partial offload keeps on the GPU.

N = data-parallel world size (all ranks).

Sources:
  [Twin-Flow] DeepSpeed ZeRO-Offload++ (blogs/deepspeed-offloadpp, PR 4636, DeepSpeed >= 0.12.4):
            offload_optimizer.ratio, ZeRO-3 only. stage3.py `_create_fp32_partitions` keeps sub-group i on the GPU
            when i < int((1 - ratio) x sub-groups), the rest on the CPU: the GPU's share holds its fp32 master, m,
            v (12 B) and fp32 gradient (4 B, `subgroup_gradient_buffer.to(device)`) on the device and is stepped by
            torch's AdamW there (`backup_optimizer`); the 16-bit gradient partition stays on the CPU whole
            (`grad_partitions_flat_buffer`). The split is by whole sub-groups, so the share is quantized.
"""

from __future__ import annotations

from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import Buckets, Strategy


def optimizer_subgroup_numel(params: int, world: int, sub_group_size: int, largest_param_numel: int) -> int:
    """Largest ZeRO-3 optimizer sub-group per rank: params are added until the group reaches
    sub_group_size (stage3.py `_create_fp16_sub_groups`), so it can overshoot by one partition."""
    return min(params // world, sub_group_size + -(-largest_param_numel // world))


def stage3_subgroup_numels(partition: int, sub_group_size: int, subgroup_numel: int) -> list[int]:
    """ZeRO-3 sub-groups of one rank's partition (stage3.py `_create_fp16_sub_groups`): params are added until
    a group reaches sub_group_size, so each full group holds between sub_group_size and `subgroup_numel`
    (optimizer_subgroup_numel) elements. Counted as full groups of the larger size, one per sub_group_size
    of the partition (an upper bound on both the count and the sizes), the last one the remainder."""
    if partition <= 0:
        return []
    if sub_group_size >= partition:
        return [partition]
    full = (partition - 1) // sub_group_size
    return [subgroup_numel] * full + [max(1, partition - full * subgroup_numel)]


def gpu_subgroup_count(groups: int, ratio: float) -> int:
    """[Twin-Flow] how many of a rank's sub-groups stage3.py keeps on the GPU: those with i < int((1 - ratio) x
    sub-groups)."""
    return int((1 - ratio) * groups)


def split_subgroups(partition: int, sub_group_size: int, subgroup_numel: int, ratio: float) -> tuple[list, list]:
    """(the sub-groups on the GPU, those on the CPU) of stage3_subgroup_numels' bound ([Twin-Flow])."""
    groups = stage3_subgroup_numels(partition, sub_group_size, subgroup_numel)
    on_gpu = gpu_subgroup_count(len(groups), ratio)
    return groups[:on_gpu], groups[on_gpu:]


def stage3_subgroups(shape: ModelShape, world: int, sub_group_size: int) -> list[int]:
    """One rank's ZeRO-3 sub-groups as stage3.py `_create_fp16_sub_groups` forms them: each tensor's partition
    (ceil(numel / N), `partition_numel()`) added in order until a group reaches sub_group_size; the whole
    partition is one group when sub_group_size is not below it. Without the tensors' sizes, the bound of
    stage3_subgroup_numels."""
    if not shape.optimized_numels:
        partition = shape.optimized_params // world
        subgroup = optimizer_subgroup_numel(
            shape.optimized_params, world, sub_group_size, shape.largest_optimized_numel
        )
        return stage3_subgroup_numels(partition, sub_group_size, subgroup)
    # the trainable tensors only (memory.py [DS-frozen]: stage3.py `_get_trainable_parameter_groups`)
    partitions = [-(-numel // world) for numel in shape.optimized_numels]
    if sub_group_size >= sum(partitions):
        return [sum(partitions)]
    groups, size = [], 0
    for numel in partitions:
        size += numel
        if size >= sub_group_size:
            groups.append(size)
            size = 0
    return groups + ([size] if size else [])


def optimizer_gpu_share(shape: ModelShape, strategy: Strategy, buckets: Buckets, world: int) -> float:
    """The share of the optimizer's elements a partial offload keeps on the GPU ([Twin-Flow]); 0 otherwise."""
    if not strategy.partial or strategy.zero_stage < 3:
        return 0.0
    groups = stage3_subgroups(shape, world, buckets.sub_group_size)
    on_gpu = gpu_subgroup_count(len(groups), strategy.offload_ratio)
    return sum(groups[:on_gpu]) / sum(groups)


def ratio_keeping(on_gpu: int, groups: int) -> float:
    """The offload_optimizer.ratio that keeps exactly the first `on_gpu` of `groups` sub-groups on the GPU
    (stage3.py's int((1 - ratio) x groups) == on_gpu): the share on the CPU, rounded to 6 digits and nudged down
    where floating point would land one sub-group short."""
    ratio = round(1 - on_gpu / groups, 6)
    while int((1 - ratio) * groups) < on_gpu:
        ratio = round(ratio - 1e-6, 6)
    return ratio
