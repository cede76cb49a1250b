"""A user's own ds_config (--ds-config) merged over the generated one, and the plan choices it pins.

`merge_user_config` fills the user's "auto" values from the generated config and keeps everything the user
set; `pins_from_config` reads the choices the plan must size (stage, offload, batch, precision);
`apply_user_config` merges and lints the result against the plan (lint.py).
"""

from __future__ import annotations

import copy

from launcher.config.keys import _MISSING, BATCH_KEYS, _dict, _int, _is_auto, strategy_of
from launcher.config.lint import Finding, lint
from launcher.config.reads import as_deepspeed_reads
from launcher.errors import UserInputError
from launcher.plan.planner import Plan

# Where "auto" is DeepSpeed's own value, not Hugging Face's placeholder: kept as the user wrote it.
# ZenFlowConfig's select_strategy / select_interval / update_interval take "auto" (zenflow/zenflow_config.py).
DEEPSPEED_AUTO_PATHS = ("zero_optimization.zenflow",)


def _fill_auto(value: object, generated: object, path: str, missing: list[str]) -> object:
    if path in DEEPSPEED_AUTO_PATHS:
        return copy.deepcopy(value)
    if isinstance(value, dict):
        source = generated if isinstance(generated, dict) else {}
        return {
            key: _fill_auto(item, source.get(key, _MISSING), f"{path}.{key}" if path else str(key), missing)
            for key, item in value.items()
        }
    if isinstance(value, list):
        source = generated if isinstance(generated, list) and len(generated) == len(value) else None
        return [
            _fill_auto(item, source[i] if source else _MISSING, f"{path}.{i}", missing) for i, item in enumerate(value)
        ]
    if not _is_auto(value):
        return copy.deepcopy(value)
    if generated is not _MISSING and not _is_auto(generated):
        return copy.deepcopy(generated)
    if path.rsplit(".", 1)[-1] == "enabled":
        return False  # a section the generated config leaves out is one the plan did not enable (fp16 on bf16)
    missing.append(path)
    return value


def _plan_precision(merged: dict, user: dict, generated: dict) -> dict:
    """The merged config with the plan's precision section added when the user's config left its precision to
    "auto" (an "auto" fp16/bf16 `enabled`) and, filled, enables neither: "auto" asks for the run's precision, and
    without a section that enables it DeepSpeed trains in fp32 (runtime/config.py get_bfloat16_config and
    get_float16_config default to disabled), which the plan neither sizes nor loads the model in."""
    sections = [name for name in ("fp16", "bf16", "bfloat16") if isinstance(user.get(name), dict)]
    if not any(_is_auto(user[name].get("enabled")) for name in sections):
        return merged
    if any(_dict(merged.get(name)).get("enabled") is True for name in sections):
        return merged
    for name in ("bf16", "fp16"):
        if name not in merged and _dict(generated.get(name)).get("enabled") is True:
            merged[name] = copy.deepcopy(generated[name])
    return merged


def _exact(total: int | None, divisor: int | None) -> int | None:
    return total // divisor if total and divisor and total % divisor == 0 else None


def merge_user_config(user: dict, generated: dict) -> dict:
    """The user's ds_config with the generated one's numbers where the user asked for them.

    Decisions: the user's config is the base and every value the user set wins, written as DeepSpeed reads it
    (reads.py: a config model's 1e9 becomes the integer 1000000000, which the schema and the launcher's own
    readers take). A Hugging-Face-style
    "auto" at any depth (lists by index) is replaced by the generated config's value at the same path;
    an "auto" `enabled` flag whose section the generated config lacks becomes false (the plan did not
    enable it, as HF turns off the precision a run does not use); any other "auto" with no generated
    counterpart is a UserInputError naming every such path. Keys only the generated config has are not
    added - the user's choices (stage, offload, buckets) stay theirs and `lint` reports what they lack -
    except the batch keys, which the launcher needs: absent ones are filled so that train_batch_size =
    micro x accumulation x world holds, keeping the user's values and taking the plan's micro-batch and
    accumulation for the rest (the world size is the generated config's own quotient); and the plan's
    precision section, when the user left the precision to "auto" and enables none: the Hugging Face docs'
    configs set only `fp16.enabled: "auto"`, which a bf16 plan turns off, and without a `bf16` section
    DeepSpeed would train in fp32, a precision the plan does not size (see _plan_precision).
    """
    if not isinstance(user, dict) or not isinstance(generated, dict):
        raise UserInputError("a ds_config must be a JSON object")
    missing: list[str] = []
    user, _ = as_deepspeed_reads(user)
    merged = _plan_precision(_fill_auto(user, generated, "", missing), user, generated)
    if missing:
        raise UserInputError(
            f"'auto' at {', '.join(missing)} has no generated value to fill it; set a number there, or remove the key"
        )
    plan_total, plan_micro, plan_accum = (_int(generated.get(key)) for key in BATCH_KEYS)
    world = _exact(plan_total, plan_micro * plan_accum if plan_micro and plan_accum else None)
    if world is None or all(key in merged for key in BATCH_KEYS):
        return merged
    total, micro, accum = (_int(merged.get(key)) for key in BATCH_KEYS)
    if BATCH_KEYS[1] not in merged:
        micro = _exact(total, accum * world) if total and accum else plan_micro
    if BATCH_KEYS[2] not in merged:
        accum = _exact(total, micro * world) if total and micro else plan_accum
    if BATCH_KEYS[0] not in merged and micro and accum:
        total = micro * accum * world
    for key, value in zip(BATCH_KEYS, (total, micro, accum), strict=True):
        if key not in merged and value is not None:
            merged[key] = value
    return merged


def pins_from_config(config: dict) -> dict:
    """The plan choices a user's ds_config makes, as `run` option values (zero_stage, offload_optimizer,
    offload_param, offload_ratio, optimizer_states, micro_batch, grad_accum, precision, nvme_path): what
    --ds-config pins so the plan sizes the configuration that will really run: at ZeRO stages 1-3 the offload
    DeepSpeed runs (keys.strategy_of: none for an absent section, no parameter offload below stage 3, optimizer
    states in CPU RAM for "nvme" below it), the values read as DeepSpeed reads them (reads.py). "auto" and other
    absent values pin nothing."""
    pins: dict = {}
    config, _ = as_deepspeed_reads(config)  # "stage": 3.0 is stage 3 (reads.py)
    zero = _dict(config.get("zero_optimization"))
    stage = _int(zero.get("stage"))
    if stage in (1, 2, 3):
        pins["zero_stage"] = str(stage)
    running = strategy_of(config)  # at stages 1-2 DeepSpeed ignores offload_param and keeps "nvme" states in RAM
    for option in ("offload_optimizer", "offload_param"):
        device = _dict(zero.get(option)).get("device")
        if _is_auto(device):
            continue  # the plan's to choose (the merge fills it)
        if stage in (1, 2, 3):  # an absent section is DeepSpeed's default: no offload
            pins[option] = getattr(running, option)
        elif device in ("none", "cpu", "nvme"):
            pins[option] = device
        path = _dict(zero.get(option)).get("nvme_path")
        if pins.get(option) == "nvme" and isinstance(path, str) and path:
            pins["nvme_path"] = path
    if stage == 3 and pins.get("offload_optimizer") == "cpu":
        # the share it offloads: its ratio, else DeepSpeed's default, all of it (subgroups.py [Twin-Flow])
        ratio = _dict(zero.get("offload_optimizer")).get("ratio", 1.0)
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 1:
            pins["offload_ratio"] = float(ratio)
    for key, option in (
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
    ):
        value = _int(config.get(key))
        if value and value > 0:
            pins[option] = value
    bf16 = "bf16" if "bf16" in config else "bfloat16"  # precision_config.get_bfloat16_config: the old name without bf16
    for precision, section in (("bf16", bf16), ("fp16", "fp16")):
        if _dict(config.get(section)).get("enabled") is True:
            pins["precision"] = precision
    if _dict(config.get(bf16)).get("bf16_optimizer_states") is True:
        pins["optimizer_states"] = "bf16"  # strategy.py [DS-bf16s]
    zenflow = zero.get("zenflow")
    if isinstance(zenflow, dict):  # host_buffers.py [ZenFlow] ({} turns it on); an "auto" interval does not pin one
        pins["zenflow"] = True
        interval = _int(zenflow.get("update_interval"))
        if interval and interval > 0:
            pins["zenflow_interval"] = interval
    return pins


# The ds_config keys whose values size buffers the memory model counts (plan/strategy.Buckets' fields): a user's
# ds_config that sets them is estimated with its own values, which the merge keeps over the plan's.
BUCKET_KEYS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "sub_group_size": "sub_group_size",
}


def bucket_pins(config: dict) -> dict:
    """The buffer sizes a user's ds_config sets (zero_optimization's BUCKET_KEYS and overlap_comm), as Buckets'
    fields and as DeepSpeed reads them (5e8 is 500000000); "auto" and absent keys pin nothing."""
    config, _ = as_deepspeed_reads(config)
    zero = _dict(config.get("zero_optimization"))
    pins: dict = {}
    for key, field in BUCKET_KEYS.items():
        value = _int(zero.get(key))
        if value is not None and value > 0:
            pins[field] = value
    if isinstance(zero.get("overlap_comm"), bool):
        pins["overlap_comm"] = zero["overlap_comm"]
    return pins


def apply_user_config(user: dict, generated: dict, plan: Plan) -> tuple[dict, list[Finding]]:
    """--ds-config: the user's config merged over the generated one (see merge_user_config; an absent
    optimizer or scheduler section is taken from the plan, as the HF Trainer creates its own), linted against
    this plan. Returns (merged, warnings); the first error is a UserInputError (DeepSpeed's own parse is
    left to dsconfig.validate, which every config goes through)."""
    merged = merge_user_config(user, generated)
    for section in ("optimizer", "scheduler"):  # the training loop needs both; the plan's AdamW is CPU-Adam-ready
        if section not in merged and section in generated:
            merged[section] = copy.deepcopy(generated[section])
    findings = lint(merged, plan, plan.world_size, deepspeed=False)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more: run offload-launch check on it)" if len(errors) > 1 else ""
        where = f"{errors[0].path}: " if errors[0].path else ""
        raise UserInputError(f"--ds-config: {where}{errors[0].message}{more}")
    return merged, findings
