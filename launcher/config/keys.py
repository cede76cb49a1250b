"""How DeepSpeed reads a ds_config: the keys its config models accept, and what it makes of the values.

Valid keys come from DeepSpeed's pydantic models (field names and aliases, deprecated ones included) and
constants, so they follow the installed DeepSpeed; sections DeepSpeed reads as plain dicts fall back to the
schema's key lists. Removed keys carry DeepSpeed's own message, deprecated ones what replaces them.

From a config's values: the strategy DeepSpeed will really run (`strategy_of`), the bucket and buffer sizes
it will use (`config_buckets`: the config's numbers, the plan's for "auto", else DeepSpeed's defaults, read
from its models), and the memory that takes (`estimate_config`, the planner's own memory model). lint.py
judges a config with these; merge.py merges one over the generated config.
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from dataclasses import replace
from functools import cache

from launcher.config import dsconfig
from launcher.deepspeed_logging import import_deepspeed
from launcher.plan import memory
from launcher.plan.capacity import aligned_partition_numel, model_shape, size_buckets
from launcher.plan.host_buffers import pinned_round_limit, strategy_alloc_conf
from launcher.plan.memory import MemoryEstimate
from launcher.plan.planner import Plan
from launcher.plan.strategy import Buckets, Strategy

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
AUTO = "auto"  # Hugging Face Trainer placeholder (transformers integrations/deepspeed.py)

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
    "timers.throughput": ("deepspeed.utils.config", "DeepSpeedThroughputTimerConfig"),  # get_timers_config
    "": ("deepspeed.monitor.config", "DeepSpeedMonitorConfig"),
}
# Old or foreign names for a key, and why: DeepSpeed ignores them silently (FIELD-NOTES), so they are warnings.
RENAMED_KEYS = {
    ("aio", "thread_count"): ("intra_op_parallelism", "renamed in DeepSpeed 0.16.4; newer versions ignore it"),
    ("aio", "num_threads"): ("intra_op_parallelism", "ds_nvme_tune prints num_threads; DeepSpeed ignores it"),
}


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
def section_models() -> dict[str, type]:
    """The DeepSpeed pydantic model that parses each section path ("" = the monitor config's top-level
    sections), nested models included (offload_param, zenflow, tensorboard ...)."""
    import_deepspeed()
    found: dict[str, type] = {}

    def add_model(path: str, model) -> None:
        found[path] = model
        for name, field in model.model_fields.items():
            nested = _config_model(field.annotation)
            for key in ({name} | ({field.alias} if field.alias else set())) if nested is not None else ():
                add_model(f"{path}.{key}" if path else key, nested)

    for path, (module, name) in SECTION_MODELS.items():
        add_model(path, getattr(importlib.import_module(module), name))
    return found


def refuses_unknown_keys(section: str) -> bool:
    """Whether DeepSpeed refuses an unknown key in this section (else it ignores it). Sections its pydantic
    models parse refuse one (runtime/config_utils.py DeepSpeedConfigModel: extra="forbid"), and so do a
    scheduler's params, which become the scheduler's keyword arguments (engine.py `_scheduler_from_config`:
    TypeError). The top level and the sections DeepSpeedConfig reads key by key with dict.get (aio,
    optimizer, scheduler, activation_checkpointing, flops_profiler, checkpoint ...) ignore it."""
    return bool(section) and (section in section_models() or section == "scheduler.params")


@cache
def known_keys() -> dict[str, frozenset[str]]:
    """Valid keys per section path ("" = top level, "zero_optimization.offload_param", "aio" ...)."""
    import_deepspeed()
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime import constants
    from deepspeed.runtime.swap_tensor import constants as aio

    sections: dict[str, set[str]] = {}
    for path, model in section_models().items():
        keys = sections.setdefault(path, set())
        for name, field in model.model_fields.items():
            keys |= {name} | ({field.alias} if field.alias else set())  # populate_by_name: both are accepted
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
    sections[""] |= _top_level_reads(ds_config) | {"aio", "optimizer", "scheduler"}
    sections[""] |= {path for path in SECTION_MODELS if "." not in path}
    sections[""] |= {key for key, sub in schema_top.items() if "not" not in sub}
    sections[""] -= set(removed_keys().get("", {})) | {""}
    sections["zero_optimization"] -= set(removed_keys().get("zero_optimization", {}))
    return {path: frozenset(sections[path]) for path in sorted(sections)}


@cache
def removed_keys() -> dict[str, dict[str, str]]:
    """Keys DeepSpeed removed and refuses, with its own message, per section path."""
    import_deepspeed()
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


# ------------------------------------------------------------------------------------------ values


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
    ratio = _dict(zero.get("offload_optimizer")).get("ratio", 1.0)
    if optimizer != "cpu" or stage < 3 or not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
        ratio = 1.0  # DeepSpeed's default; it splits only a ZeRO-3 CPU offload (subgroups.py [Twin-Flow])
    bf16 = _dict(_get(config, "bf16"))
    states = "bf16" if optimizer == "cpu" and bf16.get("bf16_optimizer_states") is True else "fp32"
    zenflow = zero.get("zenflow")  # a section, even {}, turns ZenFlow on (DeepSpeedZeroConfig.zenflow is not None)
    on = isinstance(zenflow, dict) and optimizer == "cpu"
    # ZenFlow's "auto" update interval adapts at run time: counted as the 4 steps the tool writes by default
    interval = (_int(zenflow.get("update_interval")) or 4) if on else 0
    super_offload = (
        stage == 3 and optimizer == "cpu" and _dict(zero.get("offload_optimizer")).get("super_offload") is True
    )
    return Strategy(stage, optimizer, param, float(ratio), states, interval, super_offload=super_offload)


# ------------------------------------------------------------------------------------------ sizes


@cache
def _zero_models():
    import_deepspeed()
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
    planned = size_buckets(plan.model, plan.host, strategy, world, ranks)
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
        sub_group_size=_pick(zero, ("sub_group_size",), zero_model, planned.sub_group_size)
        # stage3.py `_create_fp16_sub_groups` closes a sub-group once it holds sub_group_size elements: 0 (axolotl's
        # ZeRO-3 configs) makes every tensor its own sub-group. Sized as groups of the largest tensor's partition,
        # which subgroups.py's sub-group bound can count (it divides by the size, and enumerates partition / size)
        or aligned_partition_numel(plan.model.largest_param_numel, world),
        optimizer_buffer_count=_pick(optimizer, ("buffer_count",), optimizer_model, planned.optimizer_buffer_count),
        param_buffer_count=_pick(param, ("buffer_count",), param_model, planned.param_buffer_count),
        param_buffer_size=_pick(param, ("buffer_size",), param_model, planned.param_buffer_size),
        max_in_cpu=_pick(param, ("max_in_cpu",), param_model, planned.max_in_cpu),
        max_live_parameters=_pick(
            zero, ("stage3_max_live_parameters", "max_live_parameters"), zero_model, planned.max_live_parameters
        ),
        max_reuse_distance=_pick(
            zero, ("stage3_max_reuse_distance", "max_reuse_distance"), zero_model, planned.max_reuse_distance
        ),
        pipeline=optimizer.get("pipeline_read") is True or optimizer.get("pipeline_write") is True,
        # DeepSpeedZeroConfig.overlap_comm_valid: unset means on for stage 3 only
        overlap_comm=overlap if isinstance(overlap, bool) else strategy.zero_stage == 3,
    )


def config_pin_memory(config: dict, strategy: Strategy) -> bool:
    """offload_optimizer.pin_memory as DeepSpeed reads it (the config's bool, else its default): the flag the
    memory model's pinned offload buffers follow ([DS-pin]). Without optimizer offload it pins nothing."""
    if strategy.offload_optimizer == "none":
        return False
    _, optimizer_model, _ = _zero_models()
    value = _dict(_dict(_get(config, "zero_optimization")).get("offload_optimizer")).get("pin_memory")
    return value if isinstance(value, bool) else bool(optimizer_model.model_fields["pin_memory"].default)


def _int_or_auto(value: object, planned: int) -> int:
    """A positive integer from the config, the plan's number for "auto" or nothing."""
    number = _int(value)
    return number if number and number > 0 else planned


def estimate_config(config: dict, plan: Plan, world_size: int) -> tuple[Strategy, MemoryEstimate]:
    """The config's strategy and its memory, sized by the planner's own model (memory.estimate) with the
    config's bucket sizes, micro-batch, gradient accumulation and pin_memory (the plan's where the config
    says "auto" or nothing), and the pinned-buffer rounding the ranks will run with (plan.alloc_conf).
    ZeRO-0 partitions nothing: sized as ZeRO-1 with a world of one, every rank holding everything."""
    strategy = strategy_of(config)
    sized = strategy if strategy.zero_stage else replace(strategy, zero_stage=1)
    world = world_size if strategy.zero_stage else 1
    same_world = world_size == plan.world_size
    ranks = plan.ranks_per_node if same_world else max(1, min(world_size, plan.host.ranks_per_node))
    buckets = config_buckets(config, plan, sized, world, ranks)
    micro = _int(config.get("train_micro_batch_size_per_gpu"))
    estimate = memory.estimate(
        model_shape(plan.model, buckets),
        sized,
        buckets,
        world=world,
        ranks_per_node=ranks,
        seq_len=plan.workload.seq_len,
        micro_batch=micro if micro and micro > 0 else plan.workload.micro_batch,
        checkpointing=plan.workload.activation_checkpointing,
        has_gpu=plan.host.has_gpu,
        pin_memory=config_pin_memory(config, sized),
        # the ranks' allocator setting follows the plan's chosen strategy (job/prepare.py launch_spec)
        pinned_round_limit=pinned_round_limit(
            strategy_alloc_conf(plan.alloc_conf, plan.chosen.strategy if plan.chosen else sized)
        ),
        grad_accum=_int_or_auto(config.get("gradient_accumulation_steps"), plan.workload.grad_accum),
        cuda_context_bytes=plan.rates.cuda_context_bytes,
    )
    return strategy, estimate
