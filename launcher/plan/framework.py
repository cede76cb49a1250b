"""DeepSpeed's own cost in a step: ZeRO's per-tensor hooks, its per-parameter work, the engine's bookkeeping.

Sources:
  [DS-hooks]  ZeRO-3 gathers and releases each parameter from Python hooks around every module's forward and
              backward (partitioned_param_coordinator.py `fetch_sub_module` / `release_sub_module`,
              parameter_offload.py's pre/post hooks): a cost per parameter tensor and pass, whatever its size,
              that dominates small models (DeepSpeed issues 1189 and 2637: ZeRO-3 several times slower than
              ZeRO-2 on small models). ZeRO-1/2 with the optimizer offloaded copies each gradient to the host
              partition from its own backward hook (stage_1_and_2.py `copy_grads_in_partition`): a cost per tensor
              and micro-batch. Beside those per-tensor costs, ZeRO's per-parameter work (bucket copies, averaging,
              partition copies, gathers into the full-size buffer) streams bytes per parameter and micro-batch
              through host memory on the CPU accelerator (ZERO_PASS_BYTES_PER_PARAM). All are measured, see
              their comments (the per-tensor seconds: rates.py ZERO_TENSOR_SECONDS).
"""

from __future__ import annotations

from launcher.plan.rates import Rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import Strategy

# ZeRO's per-parameter work per micro-batch on the CPU accelerator, as bytes through the rank's share of the host's
# memory bandwidth, by (ZeRO-3?, optimizer offloaded?, where the parameters live). On a GPU the same work runs as
# device kernels and is not charged: at HBM bandwidth it would add ~0.05 s to Qwen2.5-1.5B's 0.24 s ZeRO-2 step of
# tests/plan/published_runs.yaml, which the runs there do not show.
ZERO_PASS_BYTES_PER_PARAM = {
    (False, False, "none"): 36,
    (False, True, "none"): 72,
    (True, False, "none"): 85,
    (True, True, "none"): 85,
    (True, False, "cpu"): 93,
    (True, True, "cpu"): 93,
    (True, False, "nvme"): 93,
    (True, True, "nvme"): 93,
}
# DeepSpeed's own step with nothing offloaded (stage_1_and_2.py / stage3.py `step`: the gradient partition widened to
# fp32, its norm, the clip, the narrowing back, the gathers), on the CPU accelerator, as bytes per parameter through
# the host's memory beside the optimizer's own: the ~20 M- and ~100 M-parameter ZeRO-2 rows of `make bench` step at
# ~4.7 ns/param, of which the optimizer takes ~0.5; the rest at the probed 31 GB/s is ~130 B/param.
NO_OFFLOAD_STEP_BYTES_PER_PARAM = 130
# [DS-gpu-step] The same step on a GPU, per parameter of the rank's partition through device memory, beside the
# optimizer's own bytes (compute.py device_optimizer_seconds: Adam's 28 and the copy back into the 16-bit weights),
# read in DeepSpeed 0.19.8. ZeRO-1/2 (stage_1_and_2.py `step`): the overflow scan of the 16-bit gradients
# (`has_overflow` -> utils.py `has_inf_or_nan`: amax and amin, 2 + 2 B), the norm (`get_grad_norm_direct` widens each
# gradient to fp64, zero/utils.py `get_norm_dtype`: read 2, write 8, read 8 = 18 B), the partition flattened
# (torch.cat: 2 + 2) and cast to fp32 (2 + 4), unscaled and clipped (`unscale_and_clip_grads` mul_: 4 + 4): 40 B.
# ZeRO-3 (stage3.py `step`): the norm (18), each sub-group's gradients flattened and cast
# (`_prepare_fp32_grad_for_sub_group`: 4 + 6), unscaled and clipped (8): 36 B; fp16 adds an 8 B overflow scan of the
# flat buffer (`has_overflow`: isinf and isnan), not counted (bf16 is the tool's default precision). Checked against
# DeepSpeed's timers: Qwen-72B on 32 x A100 80 GB (issue 6834, ~0.2 s read off a screenshot) is predicted 0.078 s with
# Adam's and the copy's 34 B (2.6x short: per-tensor launches and the rendezvous of the norm's all-reduce are not
# counted); GPT-2 10B on 32 x V100 (docs/_tutorials/zero.md's log: optimizer 2.08 s, with the all-gather) 1.6 s.
GPU_STEP_BYTES_PER_PARAM = {False: 40, True: 36}  # by ZeRO-3?
# Seconds per optimizer step DeepSpeed's engine spends outside the work above (its step bookkeeping: loss scale,
# overflow check, scheduler, timers): the ~1 M-parameter ZeRO-2 + optimizer-on-CPU row's update phase minus CPU-Adam
# and the host copies.
STEP_FIXED_SECONDS = 1.5e-3


def zero_tensor_seconds(strategy: Strategy, recompute: bool, rates: Rates) -> float:
    """[DS-hooks] ZeRO's cost per parameter tensor per micro-batch: ZeRO-3's gather/release hooks every pass (and
    fetches, with the parameters offloaded), ZeRO-1/2's gradient hook (and copy to the offloaded partition)."""
    if strategy.zero_stage >= 3:
        fetch = rates.zero_seconds("zero3_fetch") if strategy.offload_param != "none" else 0.0
        return rates.zero_seconds("zero3_hook_recompute" if recompute else "zero3_hook") + fetch
    return rates.zero_seconds("offload_hook" if strategy.offload_optimizer != "none" else "zero12_hook")


def zero_param_seconds(
    params: int, zero3: bool, offload_optimizer: str, offload_param: str, bandwidth: float, has_gpu: bool
) -> float:
    """[DS-hooks] ZeRO's per-parameter work per micro-batch on the CPU accelerator, `params` (a rank's share)
    through `bandwidth` (the rank's share of the host's memory bandwidth); on a GPU not charged (see
    ZERO_PASS_BYTES_PER_PARAM)."""
    if has_gpu or not bandwidth:
        return 0.0
    return ZERO_PASS_BYTES_PER_PARAM[(zero3, offload_optimizer != "none", offload_param)] * params / bandwidth


def framework_seconds(
    shape: Shape, strategy: Strategy, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool
) -> float:
    """[DS-hooks] ZeRO's own cost in the passes per optimizer step: per parameter tensor and per parameter, every
    micro-batch."""
    per_tensor = zero_tensor_seconds(strategy, shape.recompute, rates) * shape.param_tensors
    bandwidth = (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node
    per_param = zero_param_seconds(
        shape.params // world,
        strategy.zero_stage >= 3,
        strategy.offload_optimizer,
        strategy.offload_param,
        bandwidth,
        has_gpu,
    )
    return (per_tensor + per_param) * shape.grad_accum


def no_offload_step_seconds(
    params: int, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool, zero3: bool
) -> float:
    """DeepSpeed's step around the optimizer when nothing is offloaded: on the CPU accelerator
    NO_OFFLOAD_STEP_BYTES_PER_PARAM at the rank's share of the host's bandwidth, on a GPU [DS-gpu-step]'s bytes at
    the device's memory bandwidth (0 when it is not known)."""
    if has_gpu:
        bandwidth, per_param = rates.device_memory_bytes_per_s or 0.0, GPU_STEP_BYTES_PER_PARAM[zero3]
    else:
        bandwidth, per_param = (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node, NO_OFFLOAD_STEP_BYTES_PER_PARAM
    return per_param * params / world / bandwidth if bandwidth else 0.0
