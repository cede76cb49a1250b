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
# the host's memory beside the optimizer's own (on a GPU not charged, as ZERO_PASS_BYTES_PER_PARAM): the ~20 M- and
# ~100 M-parameter ZeRO-2 rows of `make bench` step at ~4.7 ns/param, of which the optimizer takes ~0.5; the rest at
# the probed 31 GB/s is ~130 B/param.
NO_OFFLOAD_STEP_BYTES_PER_PARAM = 130
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


def no_offload_step_seconds(params: int, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool) -> float:
    """DeepSpeed's step around the optimizer when nothing is offloaded, on the CPU accelerator
    (NO_OFFLOAD_STEP_BYTES_PER_PARAM at the rank's share of the bandwidth); 0 on a GPU (see the constant)."""
    bandwidth = 0.0 if has_gpu else (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node
    return NO_OFFLOAD_STEP_BYTES_PER_PARAM * params / world / bandwidth if bandwidth else 0.0
