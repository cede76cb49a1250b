"""The lint's offload-mode rules for SuperOffload and ZenFlow, and the one pass over every offload mode (lint.py
runs it; the partial-offload and 16-bit-state rules it runs too are lint_partial.py's). Each rule cites where
DeepSpeed 0.19.8 refuses the combination (error) or ignores it (warning).
"""

from __future__ import annotations

from launcher.config.finding import Finding
from launcher.config.keys import _configured_device, _dict, _int, _is_auto
from launcher.config.lint_partial import OFFLOAD_OPTIMIZER, _bf16_state_findings, _number, _ratio_findings
from launcher.plan.planner import Plan

ZENFLOW = "zero_optimization.zenflow"

# ------------------------------------------------------------------------------------------ offload modes
# SuperOffload, ZenFlow: each rule cites where DeepSpeed 0.19.8 refuses the combination (error) or ignores it
# (warning). Only values the schema accepts are judged here, so a wrong type stays the schema's one finding.


def _declared_stage(config: dict) -> int | None:
    """The ZeRO stage DeepSpeed reads (0 when unset); None when the value is malformed (the schema reports it)."""
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    return stage if _int(stage) in (0, 1, 2, 3) else None


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


def _super_offload_findings(zero: dict, stage: int | None, device: str, plan: Plan | None) -> list[Finding]:
    """offload_optimizer.super_offload (SuperOffload, runtime/superoffload/) and its cpuadam_cores_perc."""
    offload = _dict(zero.get("offload_optimizer"))
    on = offload.get("super_offload") is True
    return _super_offload_flag_findings(on, stage, device, plan) + _cpuadam_cores_findings(offload, on, stage)


def _super_offload_flag_findings(on: bool, stage: int | None, device: str, plan: Plan | None) -> list[Finding]:
    """super_offload true below ZeRO-3, without a CPU offload, or without a CUDA GPU."""
    path = f"{OFFLOAD_OPTIMIZER}.super_offload"
    if on and stage in (0, 1, 2):
        # engine.py `_configure_zero_optimizer` picks SuperOffloadOptimizer_Stage3 in its ZeRO-3 branch only; the
        # stage-1/2 optimizer never reads the flag
        return [
            Finding(
                "warning",
                path,
                "does nothing below ZeRO-3: DeepSpeed builds its SuperOffload optimizer for stage 3 only, and at "
                f"stage {stage} runs the plain offload; set zero_optimization.stage to 3, or remove it",
            )
        ]
    if on and stage == 3 and device != "cpu":
        # superoffload_stage3.py partition_grads / _optimizer_step read stage3.py's subgroup_to_device, built only for
        # an offloaded optimizer (AttributeError at the first backward with device none), and hand each CPU
        # sub-group's fp32 tensors to its CPU-Adam worker in memory, with none of stage 3's NVMe swapping
        why = "its first backward fails" if device == "none" else "it never swaps a sub-group in from NVMe"
        return [
            Finding(
                "error",
                path,
                f"needs offload_optimizer.device cpu: SuperOffload steps the offloaded sub-groups in CPU memory with "
                f"its own CPU-Adam worker, and with device {device} {why}; set device cpu",
            )
        ]
    if on and stage == 3 and plan is not None and not plan.host.has_gpu:
        # superoffload_stage3.py `_validate_superoffload_accelerator`: accelerator.device_name() == 'cuda'
        return [
            Finding(
                "error",
                path,
                "needs a CUDA GPU: DeepSpeed refuses it on its CPU accelerator ('SuperOffload only supports NVIDIA "
                "CUDA GPUs'); remove it on this host",
            )
        ]
    return []


def _cpuadam_cores_findings(offload: dict, on: bool, stage: int | None) -> list[Finding]:
    """offload_optimizer.cpuadam_cores_perc, which only SuperOffload at ZeRO-3 reads."""
    cores = offload.get("cpuadam_cores_perc")
    if not _number(cores) or not 0 <= cores <= 1:
        return []
    if not (on and stage == 3):
        # engine.py passes cpuadam_cores_perc to the ZeRO-3 optimizer; only SuperOffloadOptimizer_Stage3 reads it
        # (DeepSpeedZeroOptimizer_Stage3 takes and ignores it; stage 1/2 never see it)
        return [
            Finding(
                "warning",
                f"{OFFLOAD_OPTIMIZER}.cpuadam_cores_perc",
                "does nothing without super_offload at ZeRO-3: only DeepSpeed's SuperOffload optimizer reads it "
                "(its CPU-Adam worker's share of the cores); remove it, or set super_offload true at stage 3",
            )
        ]
    if cores == 0:
        # superoffload_utils.py SuperOffloadCPUOptimizer.__init__: if not 0 < cpuadam_cores_perc <= 1: raise ValueError
        # (the config model itself accepts 0: Field(ge=0.0, le=1.0))
        return [
            Finding(
                "error",
                f"{OFFLOAD_OPTIMIZER}.cpuadam_cores_perc",
                "0 leaves SuperOffload's CPU-Adam worker no core: DeepSpeed accepts the config and then refuses it "
                "at init ('cpuadam_cores_perc must be between 0 and 1', exclusive of 0); use a share above 0 "
                "(default 0.8)",
            )
        ]
    return []


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
    return (
        _zenflow_select_findings(zenflow)
        + _zenflow_overlap_findings(zero, zenflow, stage)
        + _zenflow_accumulation_findings(config, zenflow, stage)
    )


def _zenflow_select_findings(zenflow: dict) -> list[Finding]:
    """select_strategy against select_interval and update_interval."""
    strategy = zenflow.get("select_strategy", "auto")
    select, update = zenflow.get("select_interval", "auto"), zenflow.get("update_interval", "auto")
    select_path = f"{ZENFLOW}.select_interval"
    if strategy == "auto" and _int(select) is not None:
        # raise Warning("If use auto select strategy, select_interval will be set to 1 ...") - an exception
        return [
            Finding(
                "error",
                select_path,
                "select_strategy auto sets the interval itself and DeepSpeed refuses one at init ('If use auto select "
                "strategy, select_interval will be set to 1 ...'); remove it, or set select_strategy to step or epoch",
            )
        ]
    if strategy in ("step", "epoch") and _is_auto(select):
        # raise ValueError("If don't use auto select strategy, select_interval must be a number.")
        return [
            Finding(
                "error",
                select_path if "select_interval" in zenflow else f"{ZENFLOW}.select_strategy",
                f"select_strategy {strategy} needs a number for select_interval (its default is 'auto'), else "
                "DeepSpeed refuses it at init ('If don't use auto select strategy, select_interval must be a number'); "
                "set select_interval",
            )
        ]
    if strategy == "step" and _int(select) and _int(update) and update >= 1 and select < update:
        # not auto_update and select_interval != 0 and select_interval < update_interval:
        # raise ValueError("Select interval must be greater or equal to update interval")
        # (with select_strategy epoch the interval is multiplied by the steps per epoch, known only at run time)
        return [
            Finding(
                "error",
                select_path,
                f"{select} < update_interval {update}: DeepSpeed refuses it at init ('Select interval must be greater "
                f"or equal to update interval'); set select_interval to at least {update}",
            )
        ]
    return []


def _zenflow_overlap_findings(zero: dict, zenflow: dict, stage: int) -> list[Finding]:
    """ZenFlow's selective-optimizer offload without overlap_comm."""
    overlap = zero.get("overlap_comm")
    overlapping = overlap if isinstance(overlap, bool) else stage == 3  # config.py overlap_comm_valid
    if zenflow.get("offload") is not True or stage not in (1, 2, 3) or overlapping:
        return []
    # zenflow_stage_1_and_2.py ZenFlowZeroOptimizer.__init__ and engine_stage3.py
    # `_initialize_zenflow_stage3_epilogue`: assert overlap_comm, "offload selective optimizer should be used
    # with overlap_comm"
    unset = "is false" if overlap is False else "is unset, which is false below ZeRO-3"
    return [
        Finding(
            "error",
            f"{ZENFLOW}.offload",
            "ZenFlow's selective-optimizer offload needs overlap_comm, and zero_optimization.overlap_comm "
            f"{unset}: DeepSpeed refuses it ('offload selective optimizer should be used with overlap_comm'); set "
            "overlap_comm true",
        )
    ]


def _zenflow_accumulation_findings(config: dict, zenflow: dict, stage: int) -> list[Finding]:
    """gradient_accumulation_steps, which ZenFlow replaces with its update_interval."""
    update = zenflow.get("update_interval", "auto")
    accumulation = _int(config.get("gradient_accumulation_steps"))
    valid_update = _is_auto(update) or (_int(update) is not None and update >= 1)
    if not (stage in (1, 2, 3) and accumulation and accumulation > 1 and valid_update and accumulation != update):
        return []
    # zenflow/engine.py configure_zenflow: engine._config.gradient_accumulation_steps = engine.update_interval
    # (0 for "auto"); train_batch_size keeps the config's product
    instead = f"update_interval {update}" if _int(update) else "update_interval 'auto' (0: ZenFlow decides)"
    return [
        Finding(
            "warning",
            "gradient_accumulation_steps",
            f"ZenFlow replaces it at init with zenflow.{instead}, so the {accumulation} accumulation steps do "
            f"not happen as written; set zenflow.update_interval to {accumulation}, or gradient_accumulation_steps "
            "to 1",
        )
    ]


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
