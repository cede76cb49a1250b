"""The workload: what the user asked to run, as the planner sees it (sequence, batch, precision, the parts of
the strategy the user pinned, the schedule), and what it leaves open decided once for a model and a host
(`resolve`). Its values are checked by the bounds and rules declared with each setting (launcher/settings.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher import settings
from launcher.errors import UserInputError
from launcher.inspection.hostprofile import HostProfile
from launcher.inspection.model import ModelProfile
from launcher.plan.adapters import Lora, resolve_targets
from launcher.plan.strategy import Strategy

DEFAULTS = settings.defaults()  # the workload's defaults are the settings' own
DEFAULT_SEQ_LEN = 2048


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
    optimizer_states: str = DEFAULTS["optimizer_states"]  # "fp32" | "bf16" (strategy.py [DS-bf16s])
    zenflow: bool = DEFAULTS["zenflow"]  # host_buffers.py [ZenFlow]
    zenflow_interval: int = DEFAULTS["zenflow_interval"]
    offload_activations: str = DEFAULTS["offload_activations"]  # host_buffers.py [act-offload]
    nvme_path: str | None = DEFAULTS["nvme_path"]
    lr: float = DEFAULTS["lr"]
    warmup_steps: int = DEFAULTS["warmup_steps"]
    steps: int = DEFAULTS["steps"]
    gradient_clipping: float = 1.0
    weight_decay: float = 0.0
    allow_long_seq: bool = DEFAULTS["allow_long_seq"]
    lora: bool = DEFAULTS["lora"]  # adapters.py: a LoRA adapter trains, the base is frozen
    lora_rank: int = DEFAULTS["lora_rank"]
    lora_alpha: float | None = DEFAULTS["lora_alpha"]  # None: 2 x lora_rank
    lora_dropout: float = DEFAULTS["lora_dropout"]
    lora_target: str = DEFAULTS["lora_target"]  # "auto", "all-linear" or leaf names, comma-separated
    merge: bool = DEFAULTS["merge"]  # the export also merges the adapter into a whole model (peaks.py [merge])

    def __post_init__(self) -> None:
        settings.validate(dataclasses.asdict(self))  # the bounds and rules declared with each setting

    @property
    def zenflow_steps(self) -> int:
        """Strategy.zenflow_interval as this workload asks for it (0: no ZenFlow)."""
        return self.zenflow_interval if self.zenflow else 0

    def shaped(self, strategy: Strategy) -> Strategy:
        """`strategy` with this workload's optimizer-state precision and ZenFlow where the optimizer is on the CPU
        (both exist only there: strategy.py [DS-bf16s], [ZenFlow])."""
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


@dataclass(frozen=True)
class Resolved:
    """A workload with what it left open decided for one model and one host (`resolve`): what the planner and
    the measurements for it (job/planning.py) run with."""

    workload: Workload
    """As asked, with `seq_len` filled in: the model's maximum, capped at DEFAULT_SEQ_LEN, when unset."""
    precision: str
    """bf16 or fp16: "auto" is bf16 where the GPU has it (always on the CPU accelerator)."""
    ranks_per_node: int
    """--num-gpus, else every GPU of a node (1 rank on the CPU accelerator)."""
    nodes: int
    """The host's nodes."""
    lora: Lora | None = None
    """The LoRA adapter with its targets resolved for the model (adapters.resolve_targets); None: full fine-tuning."""

    @property
    def seq_len(self) -> int:
        return self.workload.seq_len

    @property
    def world(self) -> int:
        """Ranks in all: ranks per node x nodes."""
        return self.ranks_per_node * self.nodes


def resolve(workload: Workload, model: ModelProfile, host: HostProfile) -> Resolved:
    """The sequence length, the precision and the ranks per node for this model and host, each checked against
    them; a UserInputError names the flag to change."""
    if "nvme" in (workload.offload_optimizer, workload.offload_param) and host.nvme is None:
        raise UserInputError("NVMe offload needs --nvme-path DIR (a folder on a fast local NVMe drive)")
    precision = training_precision(workload.precision, host)
    workload = dataclasses.replace(workload, seq_len=_seq_len(workload, model))
    ranks = _ranks(workload, host)
    if workload.optimizer_states == "bf16" and precision != "bf16":
        raise UserInputError(
            f"--optimizer-states bf16 needs bf16 training, and {host.gpus.name} has no bf16: drop it"
            if host.has_gpu
            else "--optimizer-states bf16 needs bf16 training: drop --precision fp16"
        )
    return Resolved(workload, precision, ranks, host.nodes, lora_of(workload, model))


def lora_of(workload: Workload, model: ModelProfile) -> Lora | None:
    """The workload's LoRA for this model (adapters.py): its targets resolved, alpha 2·r unless given (the
    LLaMA-Factory and axolotl examples' choice; peft's own default is 8 whatever r)."""
    if not workload.lora:
        return None
    if workload.merge and model.source == "local" and not model.has_weights:
        raise UserInputError(
            f"--merge needs the base's weights, and {model.name} has none (it would train from a random start that "
            "the merge cannot rebuild): pass a model folder with weights, or drop --merge"
        )
    alpha = workload.lora_alpha if workload.lora_alpha is not None else 2.0 * workload.lora_rank
    targets = resolve_targets(model, workload.lora_target)
    return Lora(workload.lora_rank, alpha, workload.lora_dropout, targets)


def training_precision(requested: str, host: HostProfile) -> str:
    if requested == "auto":
        return "bf16" if (not host.has_gpu or host.gpus.bf16) else "fp16"
    if requested == "bf16" and host.has_gpu and not host.gpus.bf16:
        cc = ".".join(map(str, host.gpus.compute_capability))
        raise UserInputError(f"--precision bf16: {host.gpus.name} (compute capability {cc}) has no bf16; use fp16")
    if requested == "fp16" and not host.has_gpu:
        raise UserInputError("--precision fp16 is not supported by DeepSpeed's CPU accelerator; use bf16")
    return requested


def _seq_len(workload: Workload, model: ModelProfile) -> int:
    limit = model.max_position_embeddings or DEFAULT_SEQ_LEN
    if workload.seq_len is None:
        return min(DEFAULT_SEQ_LEN, limit)
    if workload.seq_len > limit and not workload.allow_long_seq:
        raise UserInputError(
            f"--seq-len {workload.seq_len} exceeds {model.name}'s max_position_embeddings {limit}; "
            f"use at most {limit}, or add --allow-long-seq if you extended the context yourself"
        )
    return workload.seq_len


def _ranks(workload: Workload, host: HostProfile) -> int:
    if workload.num_gpus is None:
        return host.ranks_per_node
    if host.has_gpu and workload.num_gpus > host.gpus.count:
        raise UserInputError(f"--num-gpus {workload.num_gpus}, but the host has {host.gpus.count} GPU(s) per node")
    return workload.num_gpus
