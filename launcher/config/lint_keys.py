"""The lint's rules about keys (lint.py runs them): unknown, removed, renamed and deprecated keys, and the
zero_optimization keys the configured ZeRO stage never reads.

An unknown key is an error where DeepSpeed refuses it (a section its pydantic models parse: extra="forbid") and a
warning where it ignores it (the top level and the sections DeepSpeedConfig reads key by key): the run goes on
without it, and the user hears that it does nothing and what the nearest real key is (keys.refuses_unknown_keys).
"""

from __future__ import annotations

from launcher.config.finding import Finding
from launcher.config.keys import (
    RENAMED_KEYS,
    _dict,
    _get,
    _int,
    _is_auto,
    deprecated_keys,
    known_keys,
    refuses_unknown_keys,
    removed_keys,
    section_models,
)
from launcher.errors import nearest, unknown_key_message

# DeepSpeedConfig's attribute names for sections, which configs copy as top-level keys that DeepSpeed then ignores
# (runtime/config.py DeepSpeedConfig._initialize_params: self.comms_config = DeepSpeedCommsConfig(param_dict) reads
# "comms_logger" (comm/config.py), self.monitor_config = get_monitor_config(param_dict) reads the four monitors
# (monitor/config.py) ...): the key each one reads, for the hint. Names a spelling hint finds are not listed.
ATTRIBUTE_NAMES = {
    "zero_config": "zero_optimization",
    "comms_config": "comms_logger",
    "monitor_config": "tensorboard, wandb, csv_monitor or comet",
    "float16_config": "fp16",
    "bfloat16_config": "bf16",
    "datastates_config": "datastates_ckpt",
}

# The ZeRO stages whose code reads each zero_optimization field (by field name; aliases map to it). A field set to
# something other than DeepSpeed's default at another stage does nothing. engine.py `_configure_zero_optimizer`
# passes the first group to DeepSpeedZeroOptimizer (stages 1-2) only, allgather_bucket_size also to the stage-0
# BF16_Optimizer (`_configure_bf16_optimizer`) but not to ZeRO-3; the ZeRO optimizer of every stage takes the
# second group, and stage 0 builds none (engine.py allreduce_gradients uses its own bucket); the third group goes
# to DeepSpeedZeroOptimizer_Stage3 / DeepSpeedZeRoOffload or is read by zero.Init (zero/partition_parameters.py),
# and save_16bit_model consolidates the 16-bit weights only under ZeRO-3. Fields not listed are not judged.
STAGES_READING = {
    **dict.fromkeys(
        ("round_robin_gradients", "use_multi_rank_bucket_allreduce", "ignore_unused_parameters", "parameter_alignment"),
        (1, 2),
    ),
    "allgather_bucket_size": (0, 1, 2),
    **dict.fromkeys(("reduce_bucket_size", "reduce_scatter", "contiguous_gradients", "overlap_comm"), (1, 2, 3)),
    **dict.fromkeys(
        (
            "prefetch_bucket_size",
            "param_persistence_threshold",
            "model_persistence_threshold",
            "max_live_parameters",
            "max_reuse_distance",
            "sub_group_size",
            "module_granularity_threshold",
            "zero_hpz_partition_size",
            "zero_quantized_weights",
            "zero_quantized_nontrainable_weights",
            "memory_efficient_linear",
            "use_all_reduce_for_fetch_params",
            "allgather_sequential",
            "gather_16bit_weights_on_model_save",
        ),
        (3,),
    ),
    "allgather_partitions": (),  # engine.py defines zero_allgather_partitions(); nothing calls it
}
WHY_READ = {
    (1, 2): "only DeepSpeedZeroOptimizer, the ZeRO-1/2 optimizer, takes it: engine.py _configure_zero_optimizer",
    (0, 1, 2): "the ZeRO-1/2 optimizer and the stage-0 BF16 optimizer take it, the ZeRO-3 optimizer does not: "
    "engine.py _configure_zero_optimizer",
    (1, 2, 3): "it configures the ZeRO optimizer, which DeepSpeed does not build at stage 0",
    (3,): "it configures ZeRO-3's parameter partitioning: engine.py passes it to DeepSpeedZeroOptimizer_Stage3, "
    "zero.Init reads it",
}


def _unknown(section: str, key: str, valid) -> Finding:
    """An error where DeepSpeed's model refuses the key (pydantic "Extra inputs are not permitted"), a warning where
    it reads the section key by key and never looks at it (runtime/config.py DeepSpeedConfig._initialize_params and
    its get_* helpers read named keys only)."""
    path = f"{section}.{key}" if section else key
    where = f"'{section}'" if section else "the top level"
    shown = f"'{key}'" if key.isprintable() else repr(key)
    if section and key in known_keys()[""]:
        # the Hugging Face docs' NVMe example nests "aio" in zero_optimization, which DeepSpeedZeroConfig refuses
        hint = f"'{key}' is a top-level section, not a key of '{section}': move it to the top level"
    elif not section and key in ATTRIBUTE_NAMES:
        hint = f"'{key}' is DeepSpeed's internal name; the key it reads is {ATTRIBUTE_NAMES[key]}"
    else:
        hint = None
    if refuses_unknown_keys(section):
        message = f"unknown key {shown} in {where}; {hint}" if hint else unknown_key_message(key, valid, where)
        return Finding("error", path, message)
    return Finding("warning", path, ignored_key_message(key, valid, where, hint))


def ignored_key_message(key: str, valid, where: str, hint: str | None = None) -> str:
    """An unknown key DeepSpeed ignores: it does nothing, and the nearest real key (or the valid ones)."""
    near = nearest(key, valid)
    hint = hint or (f"did you mean '{near}'?" if near else f"valid keys: {', '.join(sorted(valid))}")
    shown = f"'{key}'" if key.isprintable() else repr(key)
    return f"does nothing: DeepSpeed ignores the unknown key {shown} in {where}; {hint}"


def key_findings(config: dict) -> list[Finding]:
    """Unknown, removed, renamed and deprecated keys in the sections whose keys DeepSpeed's models and constants
    name (keys.known_keys); the other sections' keys are the schema's (lint._schema_findings)."""
    findings = []
    for section, valid in known_keys().items():
        value = _get(config, section)
        if not isinstance(value, dict):
            continue
        for key in map(str, value):
            path = f"{section}.{key}" if section else key
            if (section, key) in RENAMED_KEYS:
                # swap_tensor/aio_config.py get_aio_config reads its six AIO_* keys with dict.get: ignored
                new, why = RENAMED_KEYS[(section, key)]
                if new in value:
                    findings.append(Finding("warning", path, f"old name of {new} ({why}); remove it, {new} is set"))
                else:
                    fix = f'write "{new}": {value[key]!r}'
                    findings.append(Finding("warning", path, f"old name of {new} ({why}); {fix}"))
            elif key in removed_keys().get(section, {}):
                # runtime/config.py _reject_removed_config_keys raises DeepSpeedConfigError
                why = removed_keys()[section][key].strip()
                findings.append(Finding("error", path, f"removed from DeepSpeed, which refuses it: {why}"))
            elif key not in valid:
                findings.append(_unknown(section, key, valid))
            elif not section and key == "bfloat16" and "bf16" in value:
                # runtime/precision_config.py get_bfloat16_config reads 'bfloat16' only when 'bf16' is absent
                message = "does nothing: DeepSpeed ignores 'bfloat16' (the old name of bf16) when 'bf16' is set"
                findings.append(Finding("warning", path, f"{message}; remove it"))
            elif key in deprecated_keys().get(section, {}):
                new = deprecated_keys()[section][key]
                findings.append(Finding("warning", path, "deprecated in DeepSpeed" + (f"; use {new}" if new else "")))
    return findings


def _stages(stages: tuple[int, ...]) -> str:
    if len(stages) == 1:
        return f"stage {stages[0]}"
    return f"stages {', '.join(map(str, stages[:-1]))} and {stages[-1]}"


def stage_findings(config: dict) -> list[Finding]:
    """zero_optimization keys the configured stage never reads (STAGES_READING), set to something other than
    DeepSpeed's default: a warning each, as DeepSpeed accepts and ignores them (a stage-0 config with ZeRO-2's
    round_robin_gradients, a stage-2 config with ZeRO-3's stage3_max_live_parameters)."""
    zero = _dict(config.get("zero_optimization"))
    stage = _int(zero.get("stage", 0))
    if stage not in (0, 1, 2, 3):
        return []
    model = section_models()["zero_optimization"]
    names = {alias or name: name for name, field in model.model_fields.items() for alias in (field.alias, None)}
    deprecated = deprecated_keys().get("zero_optimization", {})
    findings = []
    for key, value in zero.items():
        name = names.get(key)
        if name not in STAGES_READING or stage in STAGES_READING[name] or key in deprecated or _is_auto(value):
            continue
        default = model.model_fields[name].default
        if name == "overlap_comm" and default is None:
            default = stage == 3  # DeepSpeedZeroConfig.overlap_comm_valid: unset is on at stage 3 only
        if value == default and isinstance(value, bool) == isinstance(default, bool):
            continue  # what DeepSpeed does anyway
        path = f"zero_optimization.{key}"
        stages = STAGES_READING[name]
        if not stages:
            message = "does nothing: DeepSpeed never reads it (engine.py defines zero_allgather_partitions, and "
            findings.append(Finding("warning", path, message + "nothing calls it); remove it"))
            continue
        findings.append(
            Finding(
                "warning",
                path,
                f"does nothing at ZeRO stage {stage}: DeepSpeed reads it at {_stages(stages)} only "
                f"({WHY_READ[stages]}); remove it, or set zero_optimization.stage",
            )
        )
    return findings
