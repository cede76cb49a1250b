"""The lint's rules for DeepSpeed's newer offload modes (lint.py runs them): partial offload
(`offload_optimizer.ratio`), 16-bit master weights and optimizer states, SuperOffload, ZenFlow, and whether a full
optimizer offload leaves a partial one's predicted win unused. Each rule cites where DeepSpeed 0.19.8 refuses the
combination (error) or ignores it (warning).
"""

from __future__ import annotations

import math
from dataclasses import replace

from launcher.config.finding import Finding
from launcher.config.keys import (
    BATCH_KEYS,
    _configured_device,
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
from launcher.plan import memory
from launcher.plan.capacity import model_shape, partial_offload_sub_group_size, usable_gpu_bytes
from launcher.plan.planner import Plan, estimate_candidate, partial_offload_candidate
from launcher.units import fmt_bytes

# A full optimizer offload "leaves an obvious win unused" when the planner's best partial offload is predicted at
# least this much faster (the share of the step batch advice aims to win back, planner.OVERHEAD_TARGET)
PARTIAL_OFFLOAD_WIN = 1.10
OFFLOAD_OPTIMIZER = "zero_optimization.offload_optimizer"
ZENFLOW = "zero_optimization.zenflow"

# ------------------------------------------------------------------------------------------ offload modes
# Partial offload (offload_optimizer.ratio), 16-bit master weights and optimizer states, SuperOffload, ZenFlow:
# each rule cites where DeepSpeed 0.19.8 refuses the combination (error) or ignores it (warning). Only values the
# schema accepts are judged here, so a wrong type stays the schema's one finding.


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _declared_stage(config: dict) -> int | None:
    """The ZeRO stage DeepSpeed reads (0 when unset); None when the value is malformed (the schema reports it)."""
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    return stage if _int(stage) in (0, 1, 2, 3) else None


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


def _offload_mode_findings(config: dict, plan: Plan | None, world: int) -> list[Finding]:
    zero = _dict(config.get("zero_optimization"))
    stage = _declared_stage(config)
    device = _configured_device(zero, "offload_optimizer", "cpu_offload")
    return (
        _ratio_findings(config, zero, stage, device, plan, world)
        + _bf16_state_findings(config, zero, stage, device)
        + _super_offload_findings(zero, stage, device, plan)
        + _zenflow_findings(config, zero, stage, device, plan)
        + _compute_grad_norm_findings(zero, stage, device)
    )


def _ratio_findings(
    config: dict, zero: dict, stage: int | None, device: str, plan: Plan | None, world: int
) -> list[Finding]:
    """offload_optimizer.ratio < 1, the partial offload ([Twin-Flow], memory.py)."""
    ratio = _dict(zero.get("offload_optimizer")).get("ratio")
    if not _number(ratio) or not 0 <= ratio < 1 or stage is None:
        return []
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
    return _ratio_quantum_findings(config, ratio, plan, world) if plan is not None and ratio > 0 else []


def _ratio_quantum_findings(config: dict, ratio: float, plan: Plan, world: int) -> list[Finding]:
    """stage3.py `_create_fp32_partitions` keeps sub-group i on the GPU when i < int((1 - ratio) x sub-groups): with
    this model's sub-groups (memory.stage3_subgroups, the config's sub_group_size) a ratio can keep none."""
    strategy = strategy_of(config)
    ranks = plan.ranks_per_node if world == plan.world_size else max(1, min(world, plan.host.ranks_per_node))
    buckets = config_buckets(config, plan, strategy, world, ranks)
    groups = len(memory.stage3_subgroups(model_shape(plan.model, buckets), world, buckets.sub_group_size))
    if memory.gpu_subgroup_count(groups, ratio) > 0:
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
    """bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states ([DS-bf16s], memory.py)."""
    name = "bf16" if "bf16" in config else "bfloat16"  # precision_config.get_bfloat16_config: bf16, else the old name
    section = _dict(config.get(name))
    master = section.get("bf16_master_weights_and_grads") is True
    master_unset = section.get("bf16_master_weights_and_grads", False) is False  # else True, or the schema's type error
    states = section.get("bf16_optimizer_states") is True
    master_path, states_path = f"{name}.bf16_master_weights_and_grads", f"{name}.bf16_optimizer_states"
    findings = []
    if states and master_unset:
        # runtime/config.py DeepSpeedConfig._do_error_check (and base_optimizer.py `_configure_master_weights`):
        # "bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled."
        stage_too = " and ZeRO stage 1-3" if stage == 0 else ""
        findings.append(
            Finding(
                "error",
                states_path,
                f"needs bf16_master_weights_and_grads true{stage_too}: DeepSpeed refuses it alone "
                "('bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled'); set both, or remove "
                "it",
            )
        )
    if not master or stage is None:
        return findings
    if stage == 0:
        # runtime/config.py _do_error_check: "Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2,
        # or 3." (bf16_optimizer_states is asserted the same way, after it)
        return [
            *findings,
            Finding(
                "error",
                master_path,
                "is supported with ZeRO stage 1, 2 or 3 only: DeepSpeed refuses it at stage 0 "
                "('Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3'); set "
                "zero_optimization.stage",
            ),
        ]
    # runtime/base_optimizer.py `_configure_master_weights`, with the validator of stage_1_and_2.py
    # (`_enforce_cpu_offload`) and stage3.py (`_enforce_optimizer_offload`): with bf16 master weights and either fp32
    # optimizer states or an offloaded optimizer, assert <offloaded> and type(optimizer) == DeepSpeedCPUAdam
    # ("Master weights feature requires ZeRO-N Offload with DeepSpeedCPUAdam"). Offloaded: device cpu or nvme.
    # bf16 master weights + bf16 optimizer states without offload pass: 16-bit states on the GPU.
    not_cpu_adam = _not_cpu_adam(config, zero)
    if not states and device == "none":
        findings.append(
            Finding(
                "error",
                master_path,
                "with fp32 optimizer states DeepSpeed needs the optimizer offloaded to DeepSpeedCPUAdam and refuses "
                f"it on the GPU ('Master weights feature requires ZeRO-{stage} Offload with DeepSpeedCPUAdam'); set "
                "zero_optimization.offload_optimizer.device to cpu, or bf16_optimizer_states true to keep 16-bit "
                "states on the GPU",
            )
        )
    elif device != "none" and not_cpu_adam:
        reason, fix = not_cpu_adam
        findings.append(
            Finding(
                "error",
                master_path,
                "with the optimizer offloaded DeepSpeed needs DeepSpeedCPUAdam ('Master weights feature requires "
                f"ZeRO-{stage} Offload with DeepSpeedCPUAdam'), and {reason}; {fix}, or remove it",
            )
        )
    enabled = section.get("enabled")
    if enabled is not True and not _is_auto(enabled):
        # Nothing in DeepSpeed checks it: the ZeRO optimizer keeps the master weights in bf16 whatever the model's
        # dtype (base_optimizer.py `_configure_master_weights` returns torch.bfloat16 for the flag alone)
        model = "fp16" if _get(config, "fp16.enabled") is True else "fp32"
        findings.append(
            Finding(
                "warning",
                master_path,
                f"bf16 is not enabled: DeepSpeed does not check it and keeps the master weights and gradients of this "
                f"{model} model in bf16, coarser than the model itself; set {name}.enabled true, or remove it",
            )
        )
    return findings


def _super_offload_findings(zero: dict, stage: int | None, device: str, plan: Plan | None) -> list[Finding]:
    """offload_optimizer.super_offload (SuperOffload, runtime/superoffload/) and its cpuadam_cores_perc."""
    offload = _dict(zero.get("offload_optimizer"))
    on = offload.get("super_offload") is True
    path = f"{OFFLOAD_OPTIMIZER}.super_offload"
    findings = []
    if on and stage in (0, 1, 2):
        # engine.py `_configure_zero_optimizer` picks SuperOffloadOptimizer_Stage3 in its ZeRO-3 branch only; the
        # stage-1/2 optimizer never reads the flag
        findings.append(
            Finding(
                "warning",
                path,
                "does nothing below ZeRO-3: DeepSpeed builds its SuperOffload optimizer for stage 3 only, and at "
                f"stage {stage} runs the plain offload; set zero_optimization.stage to 3, or remove it",
            )
        )
    elif on and stage == 3 and device != "cpu":
        # superoffload_stage3.py partition_grads / _optimizer_step read stage3.py's subgroup_to_device, built only for
        # an offloaded optimizer (AttributeError at the first backward with device none), and hand each CPU
        # sub-group's fp32 tensors to its CPU-Adam worker in memory, with none of stage 3's NVMe swapping
        why = "its first backward fails" if device == "none" else "it never swaps a sub-group in from NVMe"
        findings.append(
            Finding(
                "error",
                path,
                f"needs offload_optimizer.device cpu: SuperOffload steps the offloaded sub-groups in CPU memory with "
                f"its own CPU-Adam worker, and with device {device} {why}; set device cpu",
            )
        )
    elif on and stage == 3 and plan is not None and not plan.host.has_gpu:
        # superoffload_stage3.py `_validate_superoffload_accelerator`: accelerator.device_name() == 'cuda'
        findings.append(
            Finding(
                "error",
                path,
                "needs a CUDA GPU: DeepSpeed refuses it on its CPU accelerator ('SuperOffload only supports NVIDIA "
                "CUDA GPUs'); remove it on this host",
            )
        )
    cores = offload.get("cpuadam_cores_perc")
    if not _number(cores) or not 0 <= cores <= 1:
        return findings
    if not (on and stage == 3):
        # engine.py passes cpuadam_cores_perc to the ZeRO-3 optimizer; only SuperOffloadOptimizer_Stage3 reads it
        # (DeepSpeedZeroOptimizer_Stage3 takes and ignores it; stage 1/2 never see it)
        findings.append(
            Finding(
                "warning",
                f"{OFFLOAD_OPTIMIZER}.cpuadam_cores_perc",
                "does nothing without super_offload at ZeRO-3: only DeepSpeed's SuperOffload optimizer reads it "
                "(its CPU-Adam worker's share of the cores); remove it, or set super_offload true at stage 3",
            )
        )
    elif cores == 0:
        # superoffload_utils.py SuperOffloadCPUOptimizer.__init__: if not 0 < cpuadam_cores_perc <= 1: raise ValueError
        # (the config model itself accepts 0: Field(ge=0.0, le=1.0))
        findings.append(
            Finding(
                "error",
                f"{OFFLOAD_OPTIMIZER}.cpuadam_cores_perc",
                "0 leaves SuperOffload's CPU-Adam worker no core: DeepSpeed accepts the config and then refuses it "
                "at init ('cpuadam_cores_perc must be between 0 and 1', exclusive of 0); use a share above 0 "
                "(default 0.8)",
            )
        )
    return findings


def _zenflow_findings(config: dict, zero: dict, stage: int | None, device: str, plan: Plan | None) -> list[Finding]:
    """zero_optimization.zenflow (runtime/zenflow/): present as an object, even {}, it turns ZenFlow on
    (runtime/zero/config.py zenflow: Optional[ZenFlowConfig]; zenflow/engine.py configure_zenflow)."""
    zenflow = zero.get("zenflow")
    if not isinstance(zenflow, dict) or stage is None:
        return []
    findings = []
    if stage == 0:
        # zenflow/engine.py configure_zenflow turns engine.zenflow on whatever the stage; the first step calls the
        # ZeRO optimizer's ZenFlow hooks (`_sync_selective_optimizer_lr`, zenflow_need_update), which the stage-0
        # optimizer (BF16/FP16_Optimizer) lacks: AttributeError
        findings.append(
            Finding(
                "error",
                ZENFLOW,
                "ZenFlow needs ZeRO stage 1, 2 or 3: at stage 0 DeepSpeed turns it on anyway and the first step fails "
                "(the stage-0 optimizer has no ZenFlow update); set zero_optimization.stage",
            )
        )
    elif device == "none" and stage < 3:
        # zenflow/zenflow_stage_1_and_2.py ZenFlowZeroOptimizer._configure_zenflow: if not self.cpu_offload:
        # raise ValueError("Zenflow must be used with cpu offload") (cpu_offload: device cpu or nvme)
        findings.append(
            Finding(
                "error",
                ZENFLOW,
                "ZenFlow needs the optimizer offloaded: DeepSpeed refuses it without ('Zenflow must be used with cpu "
                "offload'); set zero_optimization.offload_optimizer.device to cpu",
            )
        )
    elif device == "none":
        # ZeRO-3 does not check it: engine.py builds ZenFlowCPUAdam only for an offloaded optimizer
        # (get_optimizer_configuration), and stage3.py `_optimizer_step` -> zenflow/engine_stage3.py
        # zenflow_cpu_optimizer_step calls optimizer.step(step_id=...), which the GPU optimizers do not take
        findings.append(
            Finding(
                "error",
                ZENFLOW,
                "ZenFlow needs the optimizer offloaded: ZeRO-3 does not check it, but its first step passes ZenFlow's "
                "step_id to the GPU optimizer, which takes none; set zero_optimization.offload_optimizer.device to cpu",
            )
        )
    elif stage == 3 and plan is not None and not plan.host.has_gpu:
        # zenflow/engine_stage3.py update_selected_channels: torch.zeros(..., device='cuda')
        findings.append(
            Finding(
                "error",
                ZENFLOW,
                "ZenFlow's ZeRO-3 path needs a CUDA GPU: it allocates its gradient buffers on 'cuda', so the first "
                "backward fails on DeepSpeed's CPU accelerator; use ZeRO stage 1 or 2 here",
            )
        )
    return findings + _zenflow_interval_findings(config, zero, zenflow, stage)


def _zenflow_interval_findings(config: dict, zero: dict, zenflow: dict, stage: int) -> list[Finding]:
    """ZenFlow's intervals and selective offload, as zenflow/engine.py configure_zenflow (and the same code in
    zenflow_stage_1_and_2.py `_configure_zenflow` and zenflow/engine_stage3.py configure_zenflow) reads them at init."""
    findings = []
    strategy = zenflow.get("select_strategy", "auto")
    select, update = zenflow.get("select_interval", "auto"), zenflow.get("update_interval", "auto")
    select_path = f"{ZENFLOW}.select_interval"
    if strategy == "auto" and _int(select) is not None:
        # raise Warning("If use auto select strategy, select_interval will be set to 1 ...") - an exception
        findings.append(
            Finding(
                "error",
                select_path,
                "select_strategy auto sets the interval itself and DeepSpeed refuses one at init ('If use auto select "
                "strategy, select_interval will be set to 1 ...'); remove it, or set select_strategy to step or epoch",
            )
        )
    elif strategy in ("step", "epoch") and _is_auto(select):
        # raise ValueError("If don't use auto select strategy, select_interval must be a number.")
        findings.append(
            Finding(
                "error",
                select_path if "select_interval" in zenflow else f"{ZENFLOW}.select_strategy",
                f"select_strategy {strategy} needs a number for select_interval (its default is 'auto'), else "
                "DeepSpeed refuses it at init ('If don't use auto select strategy, select_interval must be a number'); "
                "set select_interval",
            )
        )
    elif strategy == "step" and _int(select) and _int(update) and update >= 1 and select < update:
        # not auto_update and select_interval != 0 and select_interval < update_interval:
        # raise ValueError("Select interval must be greater or equal to update interval")
        # (with select_strategy epoch the interval is multiplied by the steps per epoch, known only at run time)
        findings.append(
            Finding(
                "error",
                select_path,
                f"{select} < update_interval {update}: DeepSpeed refuses it at init ('Select interval must be greater "
                f"or equal to update interval'); set select_interval to at least {update}",
            )
        )
    overlap = zero.get("overlap_comm")
    overlapping = overlap if isinstance(overlap, bool) else stage == 3  # config.py overlap_comm_valid
    if zenflow.get("offload") is True and stage in (1, 2, 3) and not overlapping:
        # zenflow_stage_1_and_2.py ZenFlowZeroOptimizer.__init__ and engine_stage3.py
        # `_initialize_zenflow_stage3_epilogue`: assert overlap_comm, "offload selective optimizer should be used
        # with overlap_comm"
        unset = "is false" if overlap is False else "is unset, which is false below ZeRO-3"
        findings.append(
            Finding(
                "error",
                f"{ZENFLOW}.offload",
                "ZenFlow's selective-optimizer offload needs overlap_comm, and zero_optimization.overlap_comm "
                f"{unset}: DeepSpeed refuses it ('offload selective optimizer should be used with overlap_comm'); set "
                "overlap_comm true",
            )
        )
    accumulation = _int(config.get("gradient_accumulation_steps"))
    valid_update = _is_auto(update) or (_int(update) is not None and update >= 1)
    if stage in (1, 2, 3) and accumulation and accumulation > 1 and valid_update and accumulation != update:
        # zenflow/engine.py configure_zenflow: engine._config.gradient_accumulation_steps = engine.update_interval
        # (0 for "auto"); train_batch_size keeps the config's product
        instead = f"update_interval {update}" if _int(update) else "update_interval 'auto' (0: ZenFlow decides)"
        findings.append(
            Finding(
                "warning",
                "gradient_accumulation_steps",
                f"ZenFlow replaces it at init with zenflow.{instead}, so the {accumulation} accumulation steps do "
                f"not happen as written; set zenflow.update_interval to {accumulation}, or gradient_accumulation_steps "
                "to 1",
            )
        )
    return findings


def _compute_grad_norm_findings(zero: dict, stage: int | None, device: str) -> list[Finding]:
    """compute_grad_norm false (ZeRO-1/2 only: the schema's rule) with an offloaded optimizer or ZenFlow."""
    if zero.get("compute_grad_norm") is not False or stage not in (1, 2):
        return []
    # runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__: raise ValueError(
    # "zero_optimization.compute_grad_norm=false does not support ZenFlow" / "... does not support optimizer offload")
    if isinstance(zero.get("zenflow"), dict):
        what = "ZenFlow"
    elif device != "none":
        what = "optimizer offload"
    else:
        return []
    return [
        Finding(
            "error",
            "zero_optimization.compute_grad_norm",
            f"false does not support {what}: DeepSpeed refuses it at init ('compute_grad_norm=false does not support "
            f"{what}'); remove it",
        )
    ]


def _unused_gpu_findings(config: dict, plan: Plan, world: int) -> list[Finding]:
    """A full CPU optimizer offload at ZeRO-2/3 on a GPU with room for part of the optimizer: the planner's best
    partial offload for this model, host and world ([Twin-Flow], planner.partial_offload_candidate), when it is
    predicted at least PARTIAL_OFFLOAD_WIN faster than the config's own strategy (planner.estimate_candidate, at the
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
    partial = partial_offload_candidate(plan.model, plan.host, workload, plan.rates, world, ranks, plan.alloc_conf)
    if partial is None:
        return []
    own = estimate_candidate(
        plan.model, plan.host, workload, strategy, plan.rates, world, ranks, alloc_conf=plan.alloc_conf
    )
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
