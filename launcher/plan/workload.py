"""The workload: what the user asked to run, as the planner sees it (sequence, batch, precision, the parts of
the strategy the user pinned, the schedule). Its values are validated where they are declared
(launcher/settings.py); here live only the rules that tie one to another."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import UserInputError
from launcher.plan.memory import Strategy

OFFLOAD_CHOICES = ("auto", "none", "cpu", "nvme")
PRECISIONS = ("auto", "bf16", "fp16")


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
        errors = []
        for flag, value in (
            ("--micro-batch", self.micro_batch),
            ("--grad-accum", self.grad_accum),
            ("--steps", self.steps),
        ):
            if value < 1:
                errors.append(f"{flag} must be at least 1, got {value}")
        if self.seq_len is not None and self.seq_len < 1:
            errors.append(f"--seq-len must be at least 1, got {self.seq_len}")
        if self.num_gpus is not None and self.num_gpus < 1:
            errors.append(f"--num-gpus must be at least 1, got {self.num_gpus}")
        if self.warmup_steps < 0:
            errors.append(f"--warmup-steps must not be negative, got {self.warmup_steps}")
        if not self.lr > 0:
            errors.append(f"--lr must be positive, got {self.lr}")
        if self.precision not in PRECISIONS:
            errors.append(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision}")
        if self.zero_stage not in ("auto", "1", "2", "3"):
            errors.append(f"--zero-stage must be auto, 1, 2 or 3, got {self.zero_stage}")
        for flag, value in (("--offload-optimizer", self.offload_optimizer), ("--offload-param", self.offload_param)):
            if value not in OFFLOAD_CHOICES:
                errors.append(f"{flag} must be one of {', '.join(OFFLOAD_CHOICES)}, got {value}")
        if self.zero_stage in ("1", "2") and self.offload_param in ("cpu", "nvme"):
            errors.append(
                f"--offload-param {self.offload_param} needs ZeRO-3 (parameters are only partitioned at stage 3); "
                f"drop --zero-stage {self.zero_stage} or use --offload-param none"
            )
        if self.zero_stage in ("1", "2") and self.offload_optimizer == "nvme":
            errors.append(
                f"--offload-optimizer nvme is supported by DeepSpeed with ZeRO-3 only; drop --zero-stage "
                f"{self.zero_stage} or use --offload-optimizer cpu"
            )
        if errors:
            raise UserInputError("; ".join(errors))

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
