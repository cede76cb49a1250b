"""The workload: what the user asked to run, as the planner sees it (sequence, batch, precision, the parts of
the strategy the user pinned, the schedule). Its values are checked by the bounds and rules declared with
each setting (launcher/settings.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher import settings
from launcher.plan.memory import Strategy

DEFAULTS = settings.defaults()  # the workload's defaults are the settings' own


@dataclass(frozen=True)
class Workload:
    """What the user wants to run. `seq_len=None` means the model's maximum, capped at 2048."""

    seq_len: int | None = DEFAULTS["seq_len"]
    micro_batch: int = DEFAULTS["micro_batch"]
    grad_accum: int = DEFAULTS["grad_accum"]
    precision: str = DEFAULTS["precision"]
    activation_checkpointing: bool = DEFAULTS["activation_checkpointing"]
    num_gpus: int | None = DEFAULTS["num_gpus"]  # ranks per node; None = every GPU (1 rank on the CPU accelerator)
    zero_stage: str = DEFAULTS["zero_stage"]  # "auto" | "1" | "2" | "3"
    offload_optimizer: str = DEFAULTS["offload_optimizer"]
    offload_param: str = DEFAULTS["offload_param"]
    offload_ratio: float | None = DEFAULTS["offload_ratio"]  # None: the plan chooses
    optimizer_states: str = DEFAULTS["optimizer_states"]  # "fp32" | "bf16" (memory.py [DS-bf16s])
    zenflow: bool = DEFAULTS["zenflow"]  # memory.py [ZenFlow]
    zenflow_interval: int = DEFAULTS["zenflow_interval"]
    offload_activations: str = DEFAULTS["offload_activations"]  # memory.py [act-offload]
    nvme_path: str | None = DEFAULTS["nvme_path"]
    lr: float = DEFAULTS["lr"]
    warmup_steps: int = DEFAULTS["warmup_steps"]
    steps: int = DEFAULTS["steps"]
    gradient_clipping: float = 1.0
    weight_decay: float = 0.0
    allow_long_seq: bool = DEFAULTS["allow_long_seq"]

    def __post_init__(self) -> None:
        settings.validate(dataclasses.asdict(self))  # the bounds and rules declared with each setting

    @property
    def zenflow_steps(self) -> int:
        """Strategy.zenflow_interval as this workload asks for it (0: no ZenFlow)."""
        return self.zenflow_interval if self.zenflow else 0

    def shaped(self, strategy: Strategy) -> Strategy:
        """`strategy` with this workload's optimizer-state precision and ZenFlow where the optimizer is on the CPU
        (both exist only there: memory.py [DS-bf16s], [ZenFlow])."""
        if self.offload_activations == "cpu":  # pinned: every strategy keeps its activations on the CPU
            strategy = dataclasses.replace(strategy, offload_activations="cpu")
        if strategy.offload_optimizer != "cpu":
            return strategy
        return dataclasses.replace(
            strategy, optimizer_states=self.optimizer_states, zenflow_interval=self.zenflow_steps
        )

    def allows(self, strategy: Strategy) -> bool:
        """Whether `strategy` respects the pinned parts of the choice."""
        if self.zero_stage != "auto" and strategy.zero_stage != int(self.zero_stage):
            return False
        if self.offload_optimizer != "auto" and strategy.offload_optimizer != self.offload_optimizer:
            return False
        if self.offload_param != "auto" and strategy.offload_param != self.offload_param:
            return False
        if self.offload_ratio is not None and (
            strategy.offload_optimizer == "none"
            or (strategy.offload_optimizer == "cpu" and strategy.offload_ratio != self.offload_ratio)
            or (strategy.offload_optimizer == "nvme" and self.offload_ratio < 1)
        ):
            return False
        if strategy.optimizer_states != self.optimizer_states or strategy.zenflow_interval != self.zenflow_steps:
            return False
        if self.offload_activations != "auto" and strategy.offload_activations != self.offload_activations:
            return False
        # ZeRO-1 with offload only when the user asked for stage 1: ZeRO-2 + offload dominates it.
        return not (strategy.zero_stage == 1 and strategy.offloads and self.zero_stage != "1")
