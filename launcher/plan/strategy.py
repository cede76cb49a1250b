"""A strategy (ZeRO stage, where each part lives) and the ds_config numbers that size it.

The byte widths the estimates count in: bf16 and fp16 are both 2 bytes, fp32 4.

Sources:
  [seeds]   ../shared/seeds: mixed-precision Adam holds 16 B/param = fp16 weight 2 + fp16 grad 2 +
            fp32 master 4 + Adam m 4 + Adam v 4; ZeRO-Offload keeps 2 B/param on the GPU.
  [DS-bf16s] DeepSpeed >= 0.19.1 (PR 8010): `bf16.bf16_master_weights_and_grads` + `bf16.bf16_optimizer_states`
            with the optimizer offloaded to the CPU keep the master weights, Adam's m and v and the optimizer's
            gradient partition in bf16 (base_optimizer.py `_configure_master_weights` -> master_weights_and_grads
            dtype; engine.py builds DeepSpeedCPUAdam with fp32_optimizer_states=False): 2 B each instead of 4, so
            6 + 2 B/param on the CPU instead of 12 + 4. Other numerics: opt-in (--optimizer-states bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_16BIT = 2
BYTES_FP32 = 4
OPTIMIZER_BYTES_PER_PARAM = 12  # [seeds] fp32 master 4 + m 4 + v 4
# DeepSpeed's defaults (runtime/zero/config.py): the bound on the live set (memory.py [DS-live]) when a config does
# not set the keys; the planner writes its own per-plan bound (zero3_live_parameter_limit) into every ZeRO-3 config.
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000


@dataclass(frozen=True)
class Strategy:
    zero_stage: int
    offload_optimizer: str = "none"  # "none" | "cpu" | "nvme"
    offload_param: str = "none"
    # subgroups.py [Twin-Flow] offload_optimizer.ratio as written to the ds_config: the share of the optimizer's
    # sub-groups on the CPU (1: all of them); below 1 only with ZeRO-3 and the optimizer on the CPU
    offload_ratio: float = 1.0
    # [DS-bf16s] the precision of the offloaded optimizer's master weights, moments and gradients: "fp32" | "bf16"
    optimizer_states: str = "fp32"
    # host_buffers.py [ZenFlow] steps between the CPU's updates (ZenFlow's update_interval); 0: no ZenFlow
    zenflow_interval: int = 0
    # host_buffers.py [act-offload] "none" | "cpu": the checkpointed activations in pinned CPU RAM
    offload_activations: str = "none"
    # host_buffers.py [SuperOffload] ZeRO-3, optimizer on the CPU, CUDA: DeepSpeed's superchip offload
    super_offload: bool = False

    @property
    def state_bytes(self) -> int:
        """Bytes per element of the optimizer's master weights, m, v and gradient partition ([DS-bf16s])."""
        return BYTES_16BIT if self.optimizer_states == "bf16" else BYTES_FP32

    @property
    def states_term(self) -> str:
        return f"{self.optimizer_states} optimizer states"

    @property
    def gradients_term(self) -> str:
        return f"{self.optimizer_states} gradient partition"

    @property
    def partial(self) -> bool:
        """Part of the optimizer stays on the GPU (subgroups.py [Twin-Flow])."""
        return self.offload_optimizer == "cpu" and self.offload_ratio < 1

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.partial:
            parts.append(f"opt->cpu {self.offload_ratio:.0%}")
        elif self.offload_optimizer != "none":
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param->{self.offload_param}")
        if self.zenflow_interval:
            parts.append(f"ZenFlow/{self.zenflow_interval}")
        if self.super_offload:
            parts.append("SuperOffload")
        if self.offload_activations != "none":
            parts.append(f"act->{self.offload_activations}")
        label = " + ".join(parts)
        return label + " (bf16 states)" if self.optimizer_states == "bf16" else label

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    def to_json(self) -> dict:
        out: dict = {
            "zero_stage": self.zero_stage,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
        }
        if self.offload_optimizer != "none":
            out["offload_ratio"] = self.offload_ratio
            out["optimizer_states"] = self.optimizer_states
        if self.zenflow_interval:
            out["zenflow_interval"] = self.zenflow_interval
        if self.offload_activations != "none":
            out["offload_activations"] = self.offload_activations
        if self.super_offload:
            out["super_offload"] = True
        return out


@dataclass(frozen=True)
class Buckets:
    """The ds_config numbers the memory model depends on (elements, not bytes)."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    sub_group_size: int
    optimizer_buffer_count: int
    param_buffer_count: int
    param_buffer_size: int
    max_in_cpu: int
    overlap_comm: bool = True
    pipeline: bool = False  # offload_optimizer.pipeline_read / pipeline_write (NVMe: capacity.nvme_optimizer_sizing)
    max_live_parameters: int = DS_MAX_LIVE_PARAMETERS  # stage3_max_live_parameters
    max_reuse_distance: int = DS_MAX_REUSE_DISTANCE  # stage3_max_reuse_distance
