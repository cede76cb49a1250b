"""Lint rules for a LoRA run's ds_config (`check --lora`, or a --ds-config merged for a --lora run), and the one
optimizer trap an offloaded optimizer shares with full fine-tuning: a config that makes DeepSpeed build something
other than DeepSpeedCPUAdam for it.

Sources (DeepSpeed 0.19.8 as installed; plan/adapters.py, plan/memory.py [DS-frozen]):
  [DS-persist] runtime/zero/parameter_offload.py `mark_persistent_parameters`: ZeRO-3 keeps a tensor whole on every
            rank when its numel <= stage3_param_persistence_threshold (zero/config.py default 1e5), and partitions
            the rest, whose state_dict() entries are then empty placeholders: peft's save_pretrained of such an
            adapter writes empty tensors (peft issue 2892, "adapter_model.safetensors file of just 40 bytes").
  [DS-cpu-optimizer] runtime/engine.py `get_optimizer_configuration`: with the optimizer offloaded, "Adam"/"AdamW"
            becomes DeepSpeedCPUAdam unless params.torch_adam asks for torch's AdamW, which then steps the CPU's
            fp32 states with torch's own loop (the probe measures DeepSpeedCPUAdam; bench.py compares both).
"""

from __future__ import annotations

from launcher.config.finding import Finding
from launcher.config.keys import _configured_device, _dict, _stage
from launcher.config.lint_partial import _not_cpu_adam
from launcher.plan.adapters import adapter_numels
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes

DS_PERSISTENCE_THRESHOLD = 100_000  # zero/config.py stage3_param_persistence_threshold's default [DS-persist]
OPTIMIZER_STATE_BYTES = 16  # fp32 master, m, v and the fp32 gradient per trainable parameter (memory.py [DS-fp32g])


def adapter_findings(config: dict, plan: Plan | None) -> list[Finding]:
    """The adapter traps of `config` for `plan`'s LoRA, and [DS-cpu-optimizer] for any offloaded optimizer."""
    zero = _dict(config.get("zero_optimization"))
    stage, optimizer = _stage(zero), _configured_device(zero, "offload_optimizer", "cpu_offload")
    findings = _offloaded_optimizer_findings(config, zero, optimizer)
    if plan is None or plan.lora is None:
        return findings
    if stage == 3:
        findings += _persistence_findings(zero, plan)
    elif stage in (1, 2) and optimizer != "none":
        trainable = plan.model.trainable_params
        base, states = 2 * (plan.model.params - trainable), OPTIMIZER_STATE_BYTES * trainable
        findings.append(
            Finding(
                "note",
                "zero_optimization.offload_optimizer.device",
                f"with a LoRA, offload_optimizer moves only the adapter's states ({fmt_bytes(states)} "
                f"in all), while ZeRO-{stage} keeps the whole frozen base ({fmt_bytes(base)}) on every GPU: ZeRO-3 "
                "partitions the base and its offload_param moves it",
            )
        )
    return findings


def _offloaded_optimizer_findings(config: dict, zero: dict, optimizer: str) -> list[Finding]:
    """[DS-cpu-optimizer] an offloaded optimizer that is not DeepSpeedCPUAdam (a partial offload's ratio reports it as
    an error of its own: lint_partial.py)."""
    ratio = _dict(zero.get("offload_optimizer")).get("ratio")
    if optimizer == "none" or (isinstance(ratio, (int, float)) and ratio < 1):
        return []
    kind = str(_dict(config.get("optimizer")).get("type", "")).lower()
    why = _not_cpu_adam(config, zero)
    if why is None or kind not in ("adam", "adamw") or "torch_adam" not in why[0]:
        return []
    return [
        Finding(
            "warning",
            "optimizer.params.torch_adam",
            "with the optimizer offloaded, torch_adam makes DeepSpeed step the CPU's fp32 states with torch's AdamW "
            "instead of DeepSpeedCPUAdam, its vectorised CPU optimizer: remove torch_adam",
        )
    ]


def _persistence_findings(zero: dict, plan: Plan) -> list[Finding]:
    """[DS-persist] adapter tensors ZeRO-3 partitions: offload-launch's export gathers them, peft alone does not."""
    threshold = zero.get("stage3_param_persistence_threshold", DS_PERSISTENCE_THRESHOLD)
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        return []
    numels = adapter_numels(plan.model, plan.lora)
    partitioned = [n for n in numels if n > threshold]
    if not partitioned:
        return []
    return [
        Finding(
            "warning",
            "zero_optimization.stage3_param_persistence_threshold",
            f"{len(partitioned)} of the adapter's {len(numels)} tensors (up to {max(partitioned):,} elements) are "
            f"above {threshold:,.0f}, so ZeRO-3 partitions them, and a plain peft save_pretrained writes them empty "
            "(peft issue 2892); offload-launch's export gathers them first. Saving with peft yourself: gather under "
            f"deepspeed.zero.GatheredParameters, or set the threshold to at least {max(partitioned):,}",
        )
    ]
