"""The workload: what the user asked to run, as the planner sees it (sequence, batch, precision, the parts of
the strategy the user pinned, the schedule). Its values are checked by the bounds and rules declared with
each setting (launcher/settings.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher import settings
from launcher.plan.memory import Strategy


@dataclass(frozen=True)
class Workload:
    """What the user wants to run. `seq_len=None` means the model's maximum, capped at 2048."""

    seq_len: int | None = None
    micro_batch: int = 1
    grad_accum: int = 1
    precision: str = "auto"
    activation_checkpointing: bool = True
    num_gpus: int | None = None  # ranks per node; None = every GPU (1 rank on the CPU accelerator)
    zero_stage: str = "auto"  # "auto" | "1" | "2" | "3"
    offload_optimizer: str = "auto"
    offload_param: str = "auto"
    nvme_path: str | None = None
    lr: float = 2e-5
    warmup_steps: int = 10
    steps: int = 100
    gradient_clipping: float = 1.0
    weight_decay: float = 0.0
    allow_long_seq: bool = False

    def __post_init__(self) -> None:
        settings.validate(dataclasses.asdict(self))  # the bounds and rules declared with each setting

    def allows(self, strategy: Strategy) -> bool:
        """Whether `strategy` respects the pinned parts of the choice."""
        if self.zero_stage != "auto" and strategy.zero_stage != int(self.zero_stage):
            return False
        if self.offload_optimizer != "auto" and strategy.offload_optimizer != self.offload_optimizer:
            return False
        if self.offload_param != "auto" and strategy.offload_param != self.offload_param:
            return False
        # ZeRO-1 with offload only when the user asked for stage 1: ZeRO-2 + offload dominates it.
        return not (strategy.zero_stage == 1 and strategy.offloads and self.zero_stage != "1")
