"""The lint's rules for a partial or 16-bit optimizer offload to DeepSpeedCPUAdam (lint_modes.py runs them):
partial offload (`offload_optimizer.ratio`), 16-bit master weights and optimizer states, and whether a full
optimizer offload leaves a partial one's predicted win unused. Each rule cites where DeepSpeed 0.19.8 refuses the
combination (error) or ignores it (warning).
"""

from __future__ import annotations

import math
from dataclasses import replace

from launcher.config.finding import Finding
from launcher.config.keys import (
    BATCH_KEYS,
    _dict,
    _get,
    _int,
    _is_auto,
    config_buckets,
    estimate_config,
    known_keys,
    strategy_of,
)
from launcher.errors import UserInputError
from launcher.plan import subgroups
from launcher.plan.candidates import Inputs, estimate_candidate
from launcher.plan.capacity import model_shape, partial_offload_sub_group_size, usable_gpu_bytes
from launcher.plan.modes import partial_offload_candidate
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes

# A full optimizer offload "leaves an obvious win unused" when the planner's best partial offload is predicted at
# least this much faster (the share of the step batch advice aims to win back, planner.OVERHEAD_TARGET)
PARTIAL_OFFLOAD_WIN = 1.10
OFFLOAD_OPTIMIZER = "zero_optimization.offload_optimizer"

# ------------------------------------------------------------------------------------------ offload modes
# Partial offload (offload_optimizer.ratio), 16-bit master weights and optimizer states: each rule cites where
# DeepSpeed 0.19.8 refuses the combination (error) or ignores it (warning). Only values the schema accepts are
# judged here, so a wrong type stays the schema's one finding.


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _not_cpu_adam(config: dict, zero: dict) -> tuple[str, str] | None:
    """Why the optimizer DeepSpeed builds for an offloaded optimizer is not DeepSpeedCPUAdam itself (the checks
    that need it compare its type exactly, so a subclass fails them too); None when it is, or when the config cannot
    say (a client optimizer). Returned as (why, what to change).
    engine.py `_configure_basic_optimizer`: "Adam"/"AdamW" (any case) -> `get_optimizer_configuration`, which
    returns torch's AdamW for params.torch_adam, else ZenFlowCPUAdam with zenflow, else DeepSpeedCPUAdam."""
    optimizer = config.get("optimizer")
    kind = _dict(optimizer).get("type")
    if not isinstance(kind, str):
        return None  # no optimizer type: the client's optimizer (config.py get_optimizer_name)
    if kind.lower() not in ("adam", "adamw"):
        return f"optimizer.type {kind} builds another optimizer", "use optimizer type AdamW"
    if _dict(optimizer.get("params")).get("torch_adam") is True:
        return "optimizer.params.torch_adam builds torch's AdamW", "remove torch_adam"
    if isinstance(zero.get("zenflow"), dict):
        return "zero_optimization.zenflow builds ZenFlowCPUAdam", "remove zenflow"
    return None


def _ratio_findings(
    config: dict, zero: dict, stage: int | None, device: str, plan: Plan | None, world: int
) -> list[Finding]:
    """offload_optimizer.ratio < 1, the partial offload ([Twin-Flow], subgroups.py)."""
    ratio = _dict(zero.get("offload_optimizer")).get("ratio")
    if not _number(ratio) or not 0 <= ratio < 1 or stage is None:
        return []
    refused = _ratio_refusals(config, zero, stage, device, ratio)
    if refused:
        return refused
    ignored = _ratio_device_warnings(device)
    if ignored:
        return ignored
    return _ratio_quantum_findings(config, ratio, plan, world) if plan is not None and ratio > 0 else []


def _ratio_refusals(config: dict, zero: dict, stage: int, device: str, ratio: float) -> list[Finding]:
    """A partial offload DeepSpeed refuses: below ZeRO-3, or stepped by another optimizer than DeepSpeedCPUAdam."""
    path = f"{OFFLOAD_OPTIMIZER}.ratio"
    if stage != 3:
        # runtime/zero/config.py DeepSpeedZeroConfig.offload_ratio_check asserts it whatever the device:
        # "Partial offloading only supported for ZeRO Stage 3."
        return [
            Finding(
                "error",
                path,
                f"{ratio:g} < 1 is a partial offload, which DeepSpeed supports with ZeRO stage 3 only: it refuses it "
                f"at stage {stage} ('Partial offloading only supported for ZeRO Stage 3'); set zero_optimization.stage "
                "to 3, or remove ratio",
            )
        ]
    not_cpu_adam = _not_cpu_adam(config, zero)
    if device != "none" and not_cpu_adam:
        reason, fix = not_cpu_adam
        # runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3.__init__, with the optimizer offloaded and ratio != 1:
        # assert type(init_optimizer) == DeepSpeedCPUAdam, 'Hybrid Optimizer Only Supports DeepSpeedCPUAdam'
        return [
            Finding(
                "error",
                path,
                "a partial offload steps the CPU's share with DeepSpeedCPUAdam only: DeepSpeed refuses any other "
                f"optimizer ('Hybrid Optimizer Only Supports DeepSpeedCPUAdam'), and {reason}; {fix}, or remove "
                "ratio",
            )
        ]
    return []


def _ratio_device_warnings(device: str) -> list[Finding]:
    """A ZeRO-3 ratio the offload device leaves without effect: no offload, or NVMe."""
    path = f"{OFFLOAD_OPTIMIZER}.ratio"
    if device == "none":
        # stage3.py `_configure_offloading` sets offload_optimizer only for a device other than none, and
        # `_create_fp32_partitions` splits the sub-groups (subgroup_to_device) only then: the ratio is never read
        return [
            Finding(
                "warning",
                path,
                "does nothing without optimizer offload: DeepSpeed splits the optimizer's sub-groups between GPU and "
                "CPU only when offload_optimizer.device is cpu, so all of the optimizer stays on the GPU; set device "
                "cpu, or remove ratio",
            )
        ]
    if device == "nvme":
        # stage3.py `_create_fp32_partitions`: a sub-group the swapper can swap (`_swappable_optimizer_subgroup`: at
        # least an aio block, 1 MiB or more) is swapped to NVMe whatever subgroup_to_device says, and
        # `_optimizer_step` steps the ratio's "GPU" sub-groups with `backup_optimizer`, torch's AdamW, on those
        # CPU-resident tensors
        return [
            Finding(
                "warning",
                path,
                "with device nvme the ratio keeps nothing on the GPU: ZeRO-3 still swaps its sub-groups to NVMe and "
                "steps the share the ratio gives the GPU with torch's AdamW on the CPU; a partial offload is a CPU "
                "offload: set device cpu, or remove ratio",
            )
        ]
    return []


def _ratio_quantum_findings(config: dict, ratio: float, plan: Plan, world: int) -> list[Finding]:
    """stage3.py `_create_fp32_partitions` keeps sub-group i on the GPU when i < int((1 - ratio) x sub-groups): with
    this model's sub-groups (subgroups.stage3_subgroups, the config's sub_group_size) a ratio can keep none."""
    strategy = strategy_of(config)
    ranks = plan.ranks_per_node if world == plan.world_size else max(1, min(world, plan.host.ranks_per_node))
    buckets = config_buckets(config, plan, strategy, world, ranks)
    groups = len(subgroups.stage3_subgroups(model_shape(plan.model, buckets), world, buckets.sub_group_size))
    if subgroups.gpu_subgroup_count(groups, ratio) > 0:
        return []
    smaller = partial_offload_sub_group_size(plan.model.params, world)
    return [
        Finding(
            "warning",
            f"{OFFLOAD_OPTIMIZER}.ratio",
            f"{ratio:g} keeps nothing on the GPU: {plan.model.name}'s partition at world size {world} forms {groups} "
            f"sub-group(s) of sub_group_size {buckets.sub_group_size}, and DeepSpeed keeps the first int((1 - ratio) "
            f"x {groups}) = 0 of them there; lower zero_optimization.sub_group_size (e.g. {smaller}) or the ratio",
        )
    ]


def _bf16_state_findings(config: dict, zero: dict, stage: int | None, device: str) -> list[Finding]:
    """bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states ([DS-bf16s], strategy.py)."""
    name = "bf16" if "bf16" in config else "bfloat16"  # precision_config.get_bfloat16_config: bf16, else the old name
    section = _dict(config.get(name))
    master = section.get("bf16_master_weights_and_grads") is True
    states = section.get("bf16_optimizer_states") is True
    findings = _bf16_states_alone_findings(name, section, stage)
    if not master or stage is None:
        return findings
    if stage == 0:
        # runtime/config.py _do_error_check: "Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2,
        # or 3." (bf16_optimizer_states is asserted the same way, after it)
        return [
            *findings,
            Finding(
                "error",
                f"{name}.bf16_master_weights_and_grads",
                "is supported with ZeRO stage 1, 2 or 3 only: DeepSpeed refuses it at stage 0 "
                "('Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3'); set "
                "zero_optimization.stage",
            ),
        ]
    return (
        findings
        + _bf16_master_offload_findings(config, zero, name, stage, device, states)
        + _bf16_not_enabled_findings(config, name, section)
    )


def _bf16_states_alone_findings(name: str, section: dict, stage: int | None) -> list[Finding]:
    """bf16_optimizer_states without bf16_master_weights_and_grads."""
    master_unset = section.get("bf16_master_weights_and_grads", False) is False  # else True, or the schema's type error
    if section.get("bf16_optimizer_states") is not True or not master_unset:
        return []
    # runtime/config.py DeepSpeedConfig._do_error_check (and base_optimizer.py `_configure_master_weights`):
    # "bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled."
    stage_too = " and ZeRO stage 1-3" if stage == 0 else ""
    return [
        Finding(
            "error",
            f"{name}.bf16_optimizer_states",
            f"needs bf16_master_weights_and_grads true{stage_too}: DeepSpeed refuses it alone "
            "('bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled'); set both, or remove "
            "it",
        )
    ]


def _bf16_master_offload_findings(
    config: dict, zero: dict, name: str, stage: int, device: str, states: bool
) -> list[Finding]:
    """bf16 master weights at ZeRO-1/2/3 with fp32 optimizer states on the GPU, or offloaded to another optimizer
    than DeepSpeedCPUAdam."""
    # runtime/base_optimizer.py `_configure_master_weights`, with the validator of stage_1_and_2.py
    # (`_enforce_cpu_offload`) and stage3.py (`_enforce_optimizer_offload`): with bf16 master weights and either fp32
    # optimizer states or an offloaded optimizer, assert <offloaded> and type(optimizer) == DeepSpeedCPUAdam
    # ("Master weights feature requires ZeRO-N Offload with DeepSpeedCPUAdam"). Offloaded: device cpu or nvme.
    # bf16 master weights + bf16 optimizer states without offload pass: 16-bit states on the GPU.
    master_path = f"{name}.bf16_master_weights_and_grads"
    not_cpu_adam = _not_cpu_adam(config, zero)
    if not states and device == "none":
        return [
            Finding(
                "error",
                master_path,
                "with fp32 optimizer states DeepSpeed needs the optimizer offloaded to DeepSpeedCPUAdam and refuses "
                f"it on the GPU ('Master weights feature requires ZeRO-{stage} Offload with DeepSpeedCPUAdam'); set "
                "zero_optimization.offload_optimizer.device to cpu, or bf16_optimizer_states true to keep 16-bit "
                "states on the GPU",
            )
        ]
    if device != "none" and not_cpu_adam:
        reason, fix = not_cpu_adam
        return [
            Finding(
                "error",
                master_path,
                "with the optimizer offloaded DeepSpeed needs DeepSpeedCPUAdam ('Master weights feature requires "
                f"ZeRO-{stage} Offload with DeepSpeedCPUAdam'), and {reason}; {fix}, or remove it",
            )
        ]
    return []


def _bf16_not_enabled_findings(config: dict, name: str, section: dict) -> list[Finding]:
    """bf16 master weights in a config that does not enable bf16."""
    enabled = section.get("enabled")
    if enabled is True or _is_auto(enabled):
        return []
    # Nothing in DeepSpeed checks it: the ZeRO optimizer keeps the master weights in bf16 whatever the model's
    # dtype (base_optimizer.py `_configure_master_weights` returns torch.bfloat16 for the flag alone)
    model = "fp16" if _get(config, "fp16.enabled") is True else "fp32"
    return [
        Finding(
            "warning",
            f"{name}.bf16_master_weights_and_grads",
            f"bf16 is not enabled: DeepSpeed does not check it and keeps the master weights and gradients of this "
            f"{model} model in bf16, coarser than the model itself; set {name}.enabled true, or remove it",
        )
    ]


def _unused_gpu_findings(config: dict, plan: Plan, world: int) -> list[Finding]:
    """A full CPU optimizer offload at ZeRO-2/3 on a GPU with room for part of the optimizer: the planner's best
    partial offload for this model, host and world ([Twin-Flow], modes.partial_offload_candidate), when it is
    predicted at least PARTIAL_OFFLOAD_WIN faster than the config's own strategy (candidates.estimate_candidate, at the
    config's micro-batch and accumulation), with the GPU memory the config leaves idle (keys.estimate_config)."""
    if not plan.host.has_gpu or "ratio" not in known_keys().get(OFFLOAD_OPTIMIZER, ()):
        return []  # the CPU accelerator steps the "GPU" share on the CPU too; a DeepSpeed without the key
    zero = _dict(config.get("zero_optimization"))
    offload = _dict(zero.get("offload_optimizer"))
    if isinstance(zero.get("zenflow"), dict) or offload.get("super_offload") is True:
        return []  # other optimizers than the one the planner times
    strategy, estimate = estimate_config(config, plan, world)
    full = strategy.offload_optimizer == "cpu" and strategy.offload_param == "none" and not strategy.partial
    usable = usable_gpu_bytes(plan.host)
    idle = usable - estimate.gpu_bytes_per_device
    if not full or strategy.zero_stage not in (2, 3) or idle <= 0:
        return []
    micro, accumulation = (_int(config.get(key)) for key in BATCH_KEYS[1:])
    ranks = plan.ranks_per_node if world == plan.world_size else max(1, min(world, plan.host.ranks_per_node))
    try:
        workload = replace(
            plan.workload,
            offload_ratio=None,
            zero_stage="auto",
            offload_optimizer="auto",
            offload_param="auto",
            optimizer_states=strategy.optimizer_states,
            zenflow=False,
            micro_batch=micro if micro and micro > 0 else plan.workload.micro_batch,
            grad_accum=accumulation if accumulation and accumulation > 0 else plan.workload.grad_accum,
        )
    except UserInputError:
        return []  # a workload the settings refuse (bf16 states with fp16 ...): nothing to compare
    inputs = Inputs(plan.model, plan.host, workload, plan.rates, world, ranks, plan.alloc_conf)
    partial = partial_offload_candidate(inputs)
    if partial is None:
        return []
    own = estimate_candidate(inputs, strategy)
    faster, slower = partial.timing.expected_seconds, own.timing.expected_seconds
    if slower < PARTIAL_OFFLOAD_WIN * faster:
        return []
    return [
        Finding(
            "warning",
            OFFLOAD_OPTIMIZER,
            f"a full offload leaves the GPU {fmt_bytes(idle)} idle: ZeRO-3 with offload_optimizer.ratio "
            f"{partial.strategy.offload_ratio:g} and sub_group_size {partial.buckets.sub_group_size} (the ratio "
            f"splits whole sub-groups) fits ({fmt_bytes(partial.memory.gpu_bytes_per_device)} of "
            f"{fmt_bytes(usable)} usable) and is predicted {slower / faster:.2f}x faster ({faster:.3g} vs "
            f"{slower:.3g} s/step)",
        )
    ]
