"""Lint a user's existing ds_config against a model + host plan, and merge it with the generated one.

`lint()` collects every problem as a `Finding` (never raises on a bad config): unknown, removed and renamed
keys with the nearest valid key; type errors from the shipped JSON Schema; cross-field rules; batch
arithmetic; NVMe swap-buffer sizes; whether the offload the config describes fits the host (sized with the
planner's own memory model); and last, DeepSpeed's own parse when nothing else is wrong.

Valid keys come from DeepSpeed's pydantic models (field names and aliases, deprecated ones included) and
constants, so they follow the installed DeepSpeed; sections DeepSpeed reads as plain dicts fall back to the
schema's key lists.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import re
import typing
from dataclasses import asdict, dataclass, replace
from functools import cache

from launcher.config import dsconfig
from launcher.errors import UserInputError, unknown_key_message
from launcher.plan import memory
from launcher.plan import planner as planning
from launcher.plan.memory import Buckets, MemoryEstimate, Strategy
from launcher.plan.planner import Plan

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
AUTO = "auto"  # Hugging Face Trainer placeholder (transformers integrations/deepspeed.py)
MIN_OPTIMIZER_BUFFER_COUNT = 4  # FIELD-NOTES: >= the optimizer's states (Adam: param, grad, m, v)

# Sections DeepSpeed parses with pydantic models; nested models (offload_param, leaf_module, tensorboard ...)
# are found by walking the fields. "" is the top level: the monitor config's fields are top-level sections.
SECTION_MODELS = {
    "zero_optimization": ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    "bf16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "bfloat16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "fp16": ("deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    "comms_logger": ("deepspeed.comm.config", "CommsLoggerConfig"),
    "hybrid_engine": ("deepspeed.runtime.config", "HybridEngineConfig"),
    "compile": ("deepspeed.compile.config", "CompileConfig"),
    "tensor_parallel": ("deepspeed.runtime.tensor_parallel.config", "TPTrainingConfig"),
    "weight_quantization": ("deepspeed.inference.config", "WeightQuantConfig"),
    "": ("deepspeed.monitor.config", "DeepSpeedMonitorConfig"),
}
# Old or foreign names for a key, and why: DeepSpeed ignores them silently (FIELD-NOTES).
RENAMED_KEYS = {
    ("aio", "thread_count"): ("intra_op_parallelism", "renamed in DeepSpeed 0.16.4; newer versions ignore it"),
    ("aio", "num_threads"): ("intra_op_parallelism", "ds_nvme_tune prints num_threads; DeepSpeed ignores it"),
}


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    path: str  # JSON path such as "zero_optimization.offload_param.buffer_size"; "" = the whole config
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.path}: {self.message}" if self.path else f"{self.level}: {self.message}"

    def to_json(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------ key sets


def _config_model(annotation):
    """The DeepSpeed pydantic model inside a field annotation (`Optional[Model]` included), or None."""
    from pydantic import BaseModel

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _top_level_reads(module) -> set[str]:
    """Keys DeepSpeedConfig reads from the top level (`param_dict`), found in the source of runtime/config.py."""
    source = inspect.getsource(module)
    key = r"([A-Z][A-Z0-9_]*|\"[a-z0-9_]+\"|'[a-z0-9_]+')"
    patterns = (
        rf"get_scalar_param\(\s*param_dict\s*,\s*{key}",
        rf"param_dict\.get\(\s*{key}",
        rf"param_dict\[\s*{key}\s*\]",
        rf"{key}\s+(?:not\s+)?in\s+param_dict\b(?!\s*\[)",
    )
    keys = set()
    for name in (m for pattern in patterns for m in re.findall(pattern, source)):
        value = name.strip("\"'") if name[0] in "\"'" else getattr(module, name, None)
        if isinstance(value, str):
            keys.add(value)
    return keys


@cache
def known_keys() -> dict[str, frozenset[str]]:
    """Valid keys per section path ("" = top level, "zero_optimization.offload_param", "aio" ...)."""
    dsconfig.import_deepspeed_quietly()
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime import constants
    from deepspeed.runtime.swap_tensor import constants as aio

    sections: dict[str, set[str]] = {}

    def add_model(path: str, model) -> None:
        keys = sections.setdefault(path, set())
        for name, field in model.model_fields.items():
            names = {name} | ({field.alias} if field.alias else set())  # populate_by_name: both are accepted
            keys |= names
            nested = _config_model(field.annotation)
            if nested is not None:
                for key in names:
                    add_model(f"{path}.{key}" if path else key, nested)

    for path, (module, name) in SECTION_MODELS.items():
        add_model(path, getattr(importlib.import_module(module), name))
    sections["aio"] = {
        value
        for name, value in vars(aio).items()
        if name.startswith("AIO_") and not name.endswith(("_DEFAULT", "_FORMAT")) and isinstance(value, str)
    }
    sections["optimizer"] = {constants.TYPE, constants.OPTIMIZER_PARAMS, constants.LEGACY_FUSION}
    sections["scheduler"] = {constants.TYPE, constants.SCHEDULER_PARAMS}
    # Top level: what DeepSpeedConfig reads, its pydantic sections, and the schema's top level (built from the
    # same source; covers keys read elsewhere, e.g. sequence_parallel_size in deepspeed.initialize).
    schema_top = dsconfig._schema_validator().schema["properties"]
    sections[""] |= _top_level_reads(ds_config) | set(SECTION_MODELS) | {"aio", "optimizer", "scheduler"}
    sections[""] |= {key for key, sub in schema_top.items() if "not" not in sub}
    sections[""] -= set(removed_keys().get("", {})) | {""}
    sections["zero_optimization"] -= set(removed_keys().get("zero_optimization", {}))
    return {path: frozenset(sections[path]) for path in sorted(sections)}


@cache
def removed_keys() -> dict[str, dict[str, str]]:
    """Keys DeepSpeed removed and refuses, with its own message, per section path."""
    dsconfig.import_deepspeed_quietly()
    from deepspeed.runtime import config as ds_config

    return {
        "": dict(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})),
        "zero_optimization": dict(getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})),
    }


@cache
def deprecated_keys() -> dict[str, dict[str, str]]:
    """Deprecated fields per section path -> what replaces them (DeepSpeed's Field(deprecated=True, new_param))."""
    known_keys()
    found: dict[str, dict[str, str]] = {"": {"bfloat16": "bf16"}}
    for path, (module, name) in SECTION_MODELS.items():
        for key, field in getattr(importlib.import_module(module), name).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("deprecated"):
                found.setdefault(path, {})[key] = extra.get("new_param", "")
    return found


def _key_findings(config: dict) -> list[Finding]:
    findings = []
    for section, valid in known_keys().items():
        value = _get(config, section)
        if not isinstance(value, dict):
            continue
        for key in map(str, value):
            path = f"{section}.{key}" if section else key
            where = f"'{section}'" if section else "the top level"
            if (section, key) in RENAMED_KEYS:
                new, why = RENAMED_KEYS[(section, key)]
                if new in value:
                    findings.append(Finding("error", path, f"old name of {new} ({why}); remove it, {new} is set"))
                else:
                    fix = f'write "{new}": {value[key]!r}'
                    findings.append(Finding("error", path, f"old name of {new} ({why}); {fix}"))
            elif key in removed_keys().get(section, {}):
                why = removed_keys()[section][key].strip()
                findings.append(Finding("error", path, f"removed from DeepSpeed, which refuses it: {why}"))
            elif key not in valid:
                findings.append(Finding("error", path, unknown_key_message(key, valid, where)))
            elif key in deprecated_keys().get(section, {}):
                new = deprecated_keys()[section][key]
                findings.append(Finding("warning", path, "deprecated in DeepSpeed" + (f"; use {new}" if new else "")))
    return findings


# ------------------------------------------------------------------------------------------ schema


def _schema_findings(config: dict, covered: set[str]) -> list[Finding]:
    """Type, range and enum errors from the shipped schema, each with its JSON path. Unknown keys in sections
    `_key_findings` checks are left to it (DeepSpeed's models win where the schema lags); the schema's
    top-level cross-field rules are ported to `_cross_field_findings` with clearer messages."""
    findings = []
    for error in dsconfig._schema_validator().iter_errors(config):
        where = ".".join(str(p) for p in error.absolute_path)
        rule = _rule_description(error)  # the if/then rule the error comes from, when it has one
        if error.validator == "additionalProperties":
            if where in known_keys():
                continue
            allowed = error.schema.get("properties", {})
            for key in (str(k) for k in error.instance if k not in allowed):
                section = f"'{where}'" if where else "the top level"
                findings.append(Finding("error", _join(where, key), unknown_key_message(key, allowed, section)))
        elif error.validator == "required":
            missing = next((r for r in error.validator_value if r not in error.instance), "")
            findings.append(Finding("error", _join(where, missing), rule or "is required here"))
        elif error.validator == "not" and not where:
            continue  # fp16+bf16, bf16+bfloat16, allreduce sum + ZeRO-3: see _cross_field_findings
        elif error.validator == "not":
            both = error.schema["not"].get("required", []) if isinstance(error.schema.get("not"), dict) else []
            said = error.schema.get("description") or (f"set only one of {', '.join(both)}" if both else "")
            findings.append(Finding("error", where, said or error.message))
        else:
            findings.append(
                Finding("error", where, f"{rule} (got {error.instance!r})" if rule else _type_message(error))
            )
    return [f for f in findings if f.path not in covered]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _rule_description(error) -> str | None:
    """The description of the innermost if/then rule on the error's schema path (following local $refs)."""
    root = dsconfig._schema_validator().schema
    node, rule = root, None
    for step in error.absolute_schema_path:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#/") and step not in node:
            node = root
            for part in ref[2:].split("/"):
                node = node.get(part, {}) if isinstance(node, dict) else {}
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return rule
        if isinstance(node, dict) and "if" in node and node.get("description"):
            rule = node["description"]
    return rule


def _type_message(error) -> str:
    value = error.instance
    wants_int = any(
        e.validator == "type"
        and "integer" in (e.validator_value if isinstance(e.validator_value, list) else [e.validator_value])
        for e in (error, *error.context)
    )
    if wants_int and isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return f"{value!r} is a float where DeepSpeed needs an integer; write {int(value)}"
    message = error.message
    if error.context:
        message += " (" + "; ".join(dict.fromkeys(e.message for e in error.context)) + ")"
    return message if len(message) <= 300 else message[:297] + "..."


# ------------------------------------------------------------------------------------------ helpers


_MISSING = object()


def _get(config: object, path: str) -> object:
    node = config
    for part in path.split(".") if path else ():
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_auto(value: object) -> bool:
    return isinstance(value, str) and value == AUTO


def _stage(zero: dict) -> int:
    stage = _int(zero.get("stage", 0))
    return stage if stage in (0, 1, 2, 3) else 0


def _configured_device(zero: dict, section: str, legacy_flag: str) -> str:
    """The device a section asks for; DeepSpeed maps the deprecated cpu_offload* flags to device cpu."""
    device = _dict(zero.get(section)).get("device", "none")
    if device in ("cpu", "nvme"):
        return device
    return "cpu" if zero.get(legacy_flag) is True else "none"


def strategy_of(config: dict) -> Strategy:
    """The strategy DeepSpeed will really run for this config: below ZeRO-3 it ignores offload_param, below
    stage 1 any offload, and its stage-1/2 optimizer keeps "nvme" optimizer states in CPU RAM (engine.py
    zero_offload_optimizer treats cpu and nvme alike). Malformed values count as DeepSpeed's defaults."""
    zero = _dict(_get(config, "zero_optimization"))
    stage = _stage(zero)
    optimizer = _configured_device(zero, "offload_optimizer", "cpu_offload") if stage >= 1 else "none"
    param = _configured_device(zero, "offload_param", "cpu_offload_param") if stage == 3 else "none"
    if stage < 3 and optimizer == "nvme":
        optimizer = "cpu"
    return Strategy(stage, optimizer, param)


@cache
def _zero_models():
    dsconfig.import_deepspeed_quietly()
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    return DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig


def _pick(section: dict, keys: tuple[str, ...], model, planned: int) -> int:
    """A size as DeepSpeed will see it: the config's integer, the planner's number for "auto" (what the
    merge fills in), else DeepSpeed's own default (read from its model, so it follows the installed version)."""
    value = next((section[k] for k in keys if k in section), _MISSING)
    if _is_auto(value):
        return planned
    number = _int(value)
    if number is not None and number >= 0:
        return number
    return int(model.model_fields[keys[-1]].default)


def config_buckets(config: dict, plan: Plan, strategy: Strategy, world: int, ranks: int) -> Buckets:
    """The numbers the memory model needs, as this config sets them."""
    zero_model, optimizer_model, param_model = _zero_models()
    zero = _dict(_get(config, "zero_optimization"))
    optimizer, param = _dict(zero.get("offload_optimizer")), _dict(zero.get("offload_param"))
    planned = planning.size_buckets(plan.model, plan.host, strategy, world, ranks)
    overlap = zero.get("overlap_comm")
    return Buckets(
        reduce_bucket_size=_pick(zero, ("reduce_bucket_size",), zero_model, planned.reduce_bucket_size),
        allgather_bucket_size=_pick(zero, ("allgather_bucket_size",), zero_model, planned.allgather_bucket_size),
        prefetch_bucket_size=_pick(
            zero, ("stage3_prefetch_bucket_size", "prefetch_bucket_size"), zero_model, planned.prefetch_bucket_size
        ),
        param_persistence_threshold=_pick(
            zero,
            ("stage3_param_persistence_threshold", "param_persistence_threshold"),
            zero_model,
            planned.param_persistence_threshold,
        ),
        sub_group_size=_pick(zero, ("sub_group_size",), zero_model, planned.sub_group_size),
        optimizer_buffer_count=_pick(optimizer, ("buffer_count",), optimizer_model, planned.optimizer_buffer_count),
        param_buffer_count=_pick(param, ("buffer_count",), param_model, planned.param_buffer_count),
        param_buffer_size=_pick(param, ("buffer_size",), param_model, planned.param_buffer_size),
        max_in_cpu=_pick(param, ("max_in_cpu",), param_model, planned.max_in_cpu),
        # DeepSpeedZeroConfig.overlap_comm_valid: unset means on for stage 3 only
        overlap_comm=overlap if isinstance(overlap, bool) else strategy.zero_stage == 3,
    )


def estimate_config(config: dict, plan: Plan, world_size: int) -> tuple[Strategy, MemoryEstimate]:
    """The config's strategy and its memory, sized by the planner's own model (memory.estimate) with the
    config's bucket sizes and micro-batch (the plan's where the config says "auto" or nothing). ZeRO-0
    partitions nothing: sized as ZeRO-1 with a world of one, every rank holding everything."""
    strategy = strategy_of(config)
    sized = strategy if strategy.zero_stage else replace(strategy, zero_stage=1)
    world = world_size if strategy.zero_stage else 1
    same_world = world_size == plan.world_size
    ranks = plan.ranks_per_node if same_world else max(1, min(world_size, plan.host.ranks_per_node))
    buckets = config_buckets(config, plan, sized, world, ranks)
    micro = _int(config.get("train_micro_batch_size_per_gpu"))
    estimate = memory.estimate(
        planning.model_shape(plan.model, buckets),
        sized,
        buckets,
        world=world,
        ranks_per_node=ranks,
        seq_len=plan.workload.seq_len,
        micro_batch=micro if micro and micro > 0 else plan.workload.micro_batch,
        checkpointing=plan.workload.activation_checkpointing,
        has_gpu=plan.host.has_gpu,
    )
    return strategy, estimate


# ------------------------------------------------------------------------------------------ checks


def _cross_field_findings(config: dict) -> list[Finding]:
    findings = []
    if _get(config, "fp16.enabled") is True and _get(config, "bf16.enabled") is True:
        findings.append(
            Finding(
                "error",
                "fp16.enabled",
                "fp16 and bf16 are both enabled; DeepSpeed allows one: keep bf16 on GPUs with compute "
                "capability 8.0 or newer (and on the CPU accelerator), else fp16",
            )
        )
    if "bf16" in config and "bfloat16" in config:
        findings.append(
            Finding(
                "error", "bfloat16", "DeepSpeed ignores 'bfloat16' (the old name of bf16) when 'bf16' is set; remove it"
            )
        )
    op = config.get("gradient_allreduce_op")
    if isinstance(op, str) and op.lower() == "sum" and _stage(_dict(config.get("zero_optimization"))) == 3:
        findings.append(Finding("error", "gradient_allreduce_op", "'sum' is not supported with ZeRO-3; use 'mean'"))
    return findings


def _offload_findings(config: dict, plan: Plan | None) -> list[Finding]:
    zero = _dict(config.get("zero_optimization"))
    stage = _stage(zero)
    optimizer = _configured_device(zero, "offload_optimizer", "cpu_offload")
    param = _configured_device(zero, "offload_param", "cpu_offload_param")
    findings = []
    if param != "none" and stage < 3:
        findings.append(
            Finding(
                "error",
                "zero_optimization.offload_param.device",
                f"offload_param needs ZeRO stage 3 (only stage 3 partitions parameters); at stage {stage} "
                "DeepSpeed ignores it and keeps every parameter on the GPU: set zero_optimization.stage to 3 "
                "or remove offload_param",
            )
        )
    if optimizer != "none" and stage == 0:
        findings.append(
            Finding(
                "error",
                "zero_optimization.offload_optimizer.device",
                "offload_optimizer needs ZeRO stage 1 or higher; at stage 0 DeepSpeed ignores it: set "
                "zero_optimization.stage",
            )
        )
    if optimizer == "nvme" and stage in (1, 2):
        findings.append(
            Finding(
                "warning",
                "zero_optimization.offload_optimizer.device",
                f"NVMe optimizer offload is supported with ZeRO-3 only; at stage {stage} DeepSpeed keeps the "
                "optimizer states in CPU RAM: use stage 3, or device cpu",
            )
        )
    for name, device in (("offload_optimizer", optimizer), ("offload_param", param)):
        if device == "nvme" and not _dict(zero.get(name)).get("nvme_path"):
            example = f" (e.g. {plan.host.nvme.path}/<run>)" if plan and plan.host.nvme else ""
            findings.append(
                Finding(
                    "error",
                    f"zero_optimization.{name}.nvme_path",
                    f"{name}.device is nvme but nvme_path is not set, so DeepSpeed fails at init: set it to a "
                    f"folder on a local NVMe drive{example}, one per run",
                )
            )
    count = _int(_dict(zero.get("offload_optimizer")).get("buffer_count"))
    if optimizer == "nvme" and count is not None and count < MIN_OPTIMIZER_BUFFER_COUNT:
        findings.append(
            Finding(
                "warning",
                "zero_optimization.offload_optimizer.buffer_count",
                f"{count} swap buffers for Adam's {MIN_OPTIMIZER_BUFFER_COUNT} states (param, grad, m, v) "
                f"serialise the NVMe swaps; use at least {MIN_OPTIMIZER_BUFFER_COUNT}",
            )
        )
    if optimizer != "none" and "optimizer" not in config and config.get("zero_force_ds_cpu_optimizer") is not False:
        findings.append(
            Finding(
                "warning",
                "optimizer",
                "offload_optimizer without an optimizer section: DeepSpeed rejects a client optimizer with "
                'offload unless zero_force_ds_cpu_optimizer is false; add "optimizer": {"type": "AdamW", '
                '"params": {...}} so it builds DeepSpeedCPUAdam',
            )
        )
    return findings


def _batch_findings(config: dict, world: int) -> list[Finding]:
    """train_batch_size = micro x accumulation x world, after DeepSpeed derives the missing ones
    (runtime/config.py _set_batch_related_parameters). "auto" (filled later) skips the check."""
    values = {key: config.get(key, _MISSING) for key in BATCH_KEYS}
    if any(_is_auto(v) for v in values.values()):
        return []
    given = {key: v for key, v in values.items() if v is not _MISSING}
    if not all(_int(v) is not None and v >= 1 for v in given.values()):
        return []  # non-integers and values below 1 are schema errors
    total, micro, accum = (given.get(key) for key in BATCH_KEYS)
    if total is None and micro is None:
        return [Finding("error", "train_micro_batch_size_per_gpu", "DeepSpeed needs it or train_batch_size; set it")]
    derived = []
    if accum is None:
        accum = total // (micro * world) if total is not None and micro is not None else 1
        derived.append(f"gradient_accumulation_steps {accum}")
    if micro is None:
        micro = total // (world * accum)
        derived.append(f"train_micro_batch_size_per_gpu {micro}")
    if total is None:
        return []
    product = micro * accum * world
    if total == product and micro >= 1 and accum >= 1:
        return []
    how = f" (DeepSpeed derives {' and '.join(derived)})" if derived else ""
    fix = max(micro, 1) * max(accum, 1) * world
    return [
        Finding(
            "error",
            "train_batch_size",
            f"{total} != train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {accum} x world "
            f'size {world} = {product}{how}; set train_batch_size to {fix} or to "auto"',
        )
    ]


def _buffer_size_findings(config: dict, plan: Plan, world: int) -> list[Finding]:
    """offload_param.buffer_size must hold the largest per-rank parameter partition DeepSpeed swaps, or it
    dies at init with "More elements N than buffer size" (DeepSpeed issue 3506; FIELD-NOTES)."""
    if strategy_of(config).offload_param != "nvme":
        return []
    section = _dict(_get(config, "zero_optimization.offload_param"))
    if "buffer_size" in section:
        size = _int(section["buffer_size"])
        said = f"{size} is"
    else:
        size = int(_zero_models()[2].model_fields["buffer_size"].default)
        said = f"unset, so DeepSpeed's default {size} is"
    need = planning.aligned_partition_numel(plan.model.largest_param_numel, world)
    if size is None or size >= need:
        return []
    return [
        Finding(
            "error",
            "zero_optimization.offload_param.buffer_size",
            f"{said} smaller than the largest parameter partition DeepSpeed swaps ({plan.model.largest_param_name}: "
            f"{plan.model.largest_param_numel:,} elements; {need:,} per rank at world size {world}, aligned to 512), "
            f"so DeepSpeed fails at init ('More elements ... than buffer size'); set it to at least {need}",
        )
    ]


def _fit_findings(config: dict, plan: Plan, world: int) -> list[Finding]:
    strategy, estimate = estimate_config(config, plan, world)
    sized = strategy if strategy.zero_stage else replace(strategy, zero_stage=1)
    problems = planning.fit_problems(sized, estimate, plan.host)
    if plan.chosen is None:
        hint = "no strategy fits this model on this host (see offload-launch plan)"
    elif plan.chosen.strategy != strategy:
        hint = f"the planner picks {plan.chosen.strategy.label} for this model and host"
    else:
        hint = "lower the micro-batch or the buffer sizes"
    return [
        Finding(
            "error",
            "zero_optimization",
            f"{strategy.label} for {plan.model.name} at world size {world} does not fit this host: {problem}; {hint}",
        )
        for problem in problems
    ]


def _without_auto(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_auto(v) for k, v in value.items() if not _is_auto(v)}
    if isinstance(value, list):
        return [_without_auto(v) for v in value]
    return value


def _deepspeed_findings(config: dict) -> list[Finding]:
    """DeepSpeed's own parse. "auto" values are dropped first: the HF Trainer replaces them before DeepSpeed
    sees the config, and DeepSpeed's models drop them anyway (plain-dict batch keys would keep the string)."""
    probe = _without_auto(config)
    if any(_is_auto(config.get(k)) for k in BATCH_KEYS) and not {BATCH_KEYS[0], BATCH_KEYS[1]} & set(probe):
        probe["train_micro_batch_size_per_gpu"] = 1
    return [Finding("error", "", message) for message in dsconfig.deepspeed_errors(probe)]


def lint(config: dict, plan: Plan | None, world_size: int, *, deepspeed: bool = True) -> list[Finding]:
    """Every problem in a user's ds_config, errors and warnings, in a stable order; never raises for a bad
    config. `plan` (from make_plan for the same model and host) adds the model-specific checks: NVMe swap
    buffer size and whether the config's offload fits the host. DeepSpeed's own parse (seconds: it imports
    DeepSpeed) runs last, only when `deepspeed` is true and nothing else is an error."""
    if world_size < 1:
        raise UserInputError(f"world size must be at least 1, got {world_size}")
    if not isinstance(config, dict):
        return [Finding("error", "", f"a ds_config is a JSON object, got {type(config).__name__}")]
    keys = _key_findings(config)
    checks = _cross_field_findings(config) + _offload_findings(config, plan) + _batch_findings(config, world_size)
    if plan is not None:
        checks += _buffer_size_findings(config, plan, world_size) + _fit_findings(config, plan, world_size)
    findings = keys + _schema_findings(config, {f.path for f in keys + checks}) + checks
    errors_at = {f.path for f in findings if f.level == "error"}
    findings = [f for f in findings if f.level == "error" or f.path not in errors_at]  # one line per key
    if deepspeed and not any(f.level == "error" for f in findings):
        findings += _deepspeed_findings(config)
    return findings


# ------------------------------------------------------------------------------------------ merge


def _fill_auto(value: object, generated: object, path: str, missing: list[str]) -> object:
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


def _exact(total: int | None, divisor: int | None) -> int | None:
    return total // divisor if total and divisor and total % divisor == 0 else None


def merge_user_config(user: dict, generated: dict) -> dict:
    """The user's ds_config with the generated one's numbers where the user asked for them.

    Decisions: the user's config is the base and every value the user set wins. A Hugging-Face-style
    "auto" at any depth (lists by index) is replaced by the generated config's value at the same path;
    an "auto" `enabled` flag whose section the generated config lacks becomes false (the plan did not
    enable it, as HF turns off the precision a run does not use); any other "auto" with no generated
    counterpart is a UserInputError naming every such path. Keys only the generated config has are not
    added - the user's choices (stage, offload, buckets) stay theirs and `lint` reports what they lack -
    except the batch keys, which the launcher needs: absent ones are filled so that train_batch_size =
    micro x accumulation x world holds, keeping the user's values and taking the plan's micro-batch and
    accumulation for the rest (the world size is the generated config's own quotient).
    """
    if not isinstance(user, dict) or not isinstance(generated, dict):
        raise UserInputError("a ds_config must be a JSON object")
    missing: list[str] = []
    merged = _fill_auto(user, generated, "", missing)
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
    offload_param, micro_batch, grad_accum, precision, nvme_path): what --ds-config pins so the plan sizes
    the configuration that will really run. "auto" and absent values pin nothing."""
    pins: dict = {}
    zero = _dict(config.get("zero_optimization"))
    stage = _int(zero.get("stage"))
    if stage in (1, 2, 3):
        pins["zero_stage"] = str(stage)
    for section, option in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_param")):
        device = _dict(zero.get(section)).get("device")
        if device in ("none", "cpu", "nvme"):
            pins[option] = device
        path = _dict(zero.get(section)).get("nvme_path")
        if device == "nvme" and isinstance(path, str) and path:
            pins["nvme_path"] = path
    for key, option in (
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
    ):
        value = _int(config.get(key))
        if value and value > 0:
            pins[option] = value
    for precision in ("bf16", "fp16"):
        if _dict(config.get(precision)).get("enabled") is True:
            pins["precision"] = precision
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
