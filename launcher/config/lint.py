"""Lint a user's existing ds_config against a model + host plan, judged as DeepSpeed reads it.

`lint()` collects every problem as a `Finding` (never raises on a bad config). Levels follow DeepSpeed 0.19.8: an
error is something it refuses (at parse or at init) or misreads, a warning something it accepts that silently does
not do what it says, a note a value it reads differently from how it is written (1e9 as the integer 1000000000).
The rules: the keys (lint_keys.py: unknown, removed, renamed and deprecated keys with the nearest valid key, and
zero_optimization keys the configured stage never reads); type errors from the shipped JSON Schema, after the values
DeepSpeed's models convert are converted (reads.py); cross-field rules; the newer offload modes' constraints
(lint_partial.py: partial offload, 16-bit master weights and optimizer states; lint_modes.py: SuperOffload,
ZenFlow); batch
arithmetic; NVMe swap-buffer sizes; whether the offload the config describes fits the host (sized with the
planner's own memory model), and whether a full optimizer offload leaves a partial one's predicted win unused;
and last, DeepSpeed's own parse when nothing else is wrong.

Which keys are valid, and what DeepSpeed makes of a config's values, is keys.py; merging a user's config
over the generated one is merge.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

from launcher.config import dsconfig
from launcher.config.finding import Finding
from launcher.config.keys import (
    _MISSING,
    BATCH_KEYS,
    _configured_device,
    _dict,
    _get,
    _int,
    _is_auto,
    _stage,
    _zero_models,
    estimate_config,
    known_keys,
    refuses_unknown_keys,
    section_models,
    strategy_of,
)
from launcher.config.lint_adapters import adapter_findings
from launcher.config.lint_keys import ignored_key_message, key_findings, stage_findings
from launcher.config.lint_modes import _offload_mode_findings
from launcher.config.lint_partial import _unused_gpu_findings
from launcher.config.reads import as_deepspeed_reads, is_model_field
from launcher.errors import UserInputError, unknown_key_message
from launcher.plan.capacity import (
    aligned_partition_numel,
    fit_problems,
)
from launcher.plan.planner import Plan

MIN_OPTIMIZER_BUFFER_COUNT = 4  # FIELD-NOTES: >= the optimizer's states (Adam: param, grad, m, v)
# Schema if/then rules lint reports itself, with the key at fault and DeepSpeed's reason: their schema errors are
# dropped (the schema keeps them for dsconfig.validate and for editors). test_lint checks they are in the schema.
PORTED_SCHEMA_RULES = frozenset(
    {
        "Partial optimizer offload (offload_optimizer.ratio < 1) is only supported with ZeRO stage 3.",
        "bf16_optimizer_states requires bf16_master_weights_and_grads.",
    }
)


# ------------------------------------------------------------------------------------------ schema


def _schema_findings(config: dict, covered: set[str], named: set[str] = frozenset()) -> list[Finding]:
    """Type, range and enum errors from the shipped schema, each with its JSON path. Unknown keys in sections
    `key_findings` checks are left to it (DeepSpeed's models win where the schema lags), and so is the schema's
    refusal of a key it names (`named`: "thread_count": {"not": {}}, which DeepSpeed ignores: a warning); the
    schema's top-level cross-field rules are ported to `_cross_field_findings` with clearer messages."""
    findings = []
    for error in dsconfig._schema_validator().iter_errors(config):
        where = ".".join(str(p) for p in error.absolute_path)
        rule = _rule_description(error)  # the if/then rule the error comes from, when it has one
        if rule in PORTED_SCHEMA_RULES or (error.validator == "not" and where in named):
            continue  # see _offload_mode_findings, lint_keys.key_findings
        if error.validator == "additionalProperties":
            if where in known_keys():
                continue
            allowed = error.schema.get("properties", {})
            findings += [_schema_unknown(where, str(k), allowed) for k in error.instance if k not in allowed]
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


def _schema_unknown(section: str, key: str, allowed) -> Finding:
    """An unknown key in a section whose keys only the schema lists: an error where DeepSpeed refuses it (a
    scheduler's params become its keyword arguments), else a warning, as DeepSpeed reads these sections key by
    key and ignores the rest (activation_checkpointing, flops_profiler, checkpoint ...: keys.refuses_unknown_keys)."""
    where = f"'{section}'" if section else "the top level"
    if refuses_unknown_keys(section):
        return Finding("error", _join(section, key), unknown_key_message(key, allowed, where))
    return Finding("warning", _join(section, key), ignored_key_message(key, allowed, where))


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


def _model_of(path: str) -> str:
    return section_models()[path.rpartition(".")[0]].__name__


def _type_message(error) -> str:
    value = error.instance
    wants_int = any(
        e.validator == "type"
        and "integer" in (e.validator_value if isinstance(e.validator_value, list) else [e.validator_value])
        for e in (error, *error.context)
    )
    path = ".".join(str(p) for p in error.absolute_path)
    if wants_int and isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        # pydantic's int_from_float (a config model), or the code that gets the plain float, refuses it
        if is_model_field(path):
            why = f"DeepSpeed's {_model_of(path)} refuses it ('got a number with a fractional part')"
        else:
            why = "where DeepSpeed needs an integer"
        return f"{value!r} is not a whole number: {why}; write {int(value)}"
    if wants_int and isinstance(value, float) and math.isfinite(value):
        # 1e9 in a config model's field is the integer (reads.py: a note); DeepSpeed reads this key as written
        # (runtime/config.py get_scalar_param, aio_config.py get_aio_config ...) and keeps the float, which the
        # code that needs an integer refuses (torch's DataLoader for the micro-batch, the aio handle's pybind ints)
        return (
            f"{value!r} is a float, and DeepSpeed reads {path.rsplit('.', 1)[-1]} as written (no config model converts "
            f"it), so it gets a float where it needs an integer; write {int(value)}"
        )
    message = error.message
    if error.context:
        message += " (" + "; ".join(dict.fromkeys(e.message for e in error.context)) + ")"
    return message if len(message) <= 300 else message[:297] + "..."


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
    op = config.get("gradient_allreduce_op")
    zero = _dict(config.get("zero_optimization"))
    if isinstance(op, str) and op.lower() == "sum" and _stage(zero) == 3:
        findings.append(Finding("error", "gradient_allreduce_op", "'sum' is not supported with ZeRO-3; use 'mean'"))
    elif isinstance(op, str) and op.lower() == "sum" and isinstance(zero.get("zenflow"), dict):
        # runtime/config.py DeepSpeedConfig._do_error_check: "gradient_allreduce_op='sum' is not supported with ZenFlow"
        findings.append(Finding("error", "gradient_allreduce_op", "'sum' is not supported with ZenFlow; use 'mean'"))
    return findings


def _offload_findings(config: dict, plan: Plan | None) -> list[Finding]:
    zero = _dict(config.get("zero_optimization"))
    stage = _stage(zero)
    optimizer = _configured_device(zero, "offload_optimizer", "cpu_offload")
    param = _configured_device(zero, "offload_param", "cpu_offload_param")
    return _offload_stage_findings(stage, optimizer, param) + _offload_setup_findings(
        config, zero, optimizer, param, plan
    )


def _offload_stage_findings(stage: int, optimizer: str, param: str) -> list[Finding]:
    """Offload the configured ZeRO stage does not run as asked: DeepSpeed ignores it, or keeps it in CPU RAM
    (engine.py `_configure_zero_optimizer` hands offload_param to the ZeRO-3 optimizer only, offload_optimizer to the
    ZeRO optimizer, which stage 0 does not build): warnings, as DeepSpeed accepts the config."""
    findings = []
    if param != "none" and stage < 3:
        findings.append(
            Finding(
                "warning",
                "zero_optimization.offload_param.device",
                f"offload_param needs ZeRO stage 3 (only stage 3 partitions parameters); at stage {stage} "
                "DeepSpeed ignores it and keeps every parameter on the GPU: set zero_optimization.stage to 3 "
                "or remove offload_param",
            )
        )
    if optimizer != "none" and stage == 0:
        findings.append(
            Finding(
                "warning",
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
    return findings


def _offload_setup_findings(config: dict, zero: dict, optimizer: str, param: str, plan: Plan | None) -> list[Finding]:
    """What configured offload needs besides the device: an NVMe folder, enough swap buffers, an optimizer."""
    findings = []
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
    offload = _dict(zero.get("offload_optimizer"))
    count = _int(offload.get("buffer_count"))
    # capacity.py [DS-pipe]: the pipelined swapper holds 4 buffers per sub-group in flight, one more sub-group for
    # each of pipeline_read and pipeline_write (DeepSpeed's default buffer_count is 4)
    in_flight = 1 + (offload.get("pipeline_read") is True) + (offload.get("pipeline_write") is True)
    needed = MIN_OPTIMIZER_BUFFER_COUNT * in_flight
    if optimizer == "nvme" and in_flight > 1 and (count if count is not None else MIN_OPTIMIZER_BUFFER_COUNT) < needed:
        findings.append(
            Finding(
                "warning",
                "zero_optimization.offload_optimizer.buffer_count",
                f"pipelined swaps keep {in_flight} sub-groups in flight at {MIN_OPTIMIZER_BUFFER_COUNT} buffers each "
                f"(param, m, v, gradient: pipelined_optimizer_swapper.py): {count or MIN_OPTIMIZER_BUFFER_COUNT} "
                f"buffers run out mid-step ('ran out of swap buffers'); use at least {needed}",
            )
        )
    elif optimizer == "nvme" and count is not None and count < MIN_OPTIMIZER_BUFFER_COUNT:
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
    need = aligned_partition_numel(plan.model.largest_param_numel, world)
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
    problems = fit_problems(sized, estimate, plan.host)
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
    """Every problem in a user's ds_config, errors, warnings and notes, in a stable order; never raises for a bad
    config. It is judged as DeepSpeed reads it (reads.py: 1e9 in a model's integer field is the integer, a note).
    `plan` (from make_plan for the same model and host) adds the model- and host-specific checks: NVMe swap
    buffer size, whether the config's offload fits the host, whether its partial-offload ratio keeps any sub-group
    on the GPU, the GPU a full optimizer offload leaves idle, and what needs a CUDA GPU. DeepSpeed's own parse
    (seconds: it imports DeepSpeed) runs last, only when `deepspeed` is true and nothing else is an error."""
    if world_size < 1:
        raise UserInputError(f"world size must be at least 1, got {world_size}")
    if not isinstance(config, dict):
        return [Finding("error", "", f"a ds_config is a JSON object, got {type(config).__name__}")]
    original, (config, notes) = config, as_deepspeed_reads(config)  # judged as DeepSpeed's models read it
    keys = key_findings(config) + stage_findings(config)
    checks = _cross_field_findings(config) + _offload_findings(config, plan)
    checks += _offload_mode_findings(config, plan, world_size) + _batch_findings(config, world_size)
    checks += adapter_findings(config, plan)
    if plan is not None:
        checks += _buffer_size_findings(config, plan, world_size) + _fit_findings(config, plan, world_size)
        checks += _unused_gpu_findings(config, plan, world_size)
    # a schema error the lint's own error at that key says better is dropped; a warning there does not hide one
    covered = {f.path for f in keys + checks if f.level == "error"}
    findings = keys + _schema_findings(config, covered, {f.path for f in keys}) + checks
    errors_at = {f.path for f in findings if f.level == "error"}
    findings = [f for f in findings if f.level == "error" or f.path not in errors_at]  # one line per key
    findings += [f for f in notes if f.path not in {g.path for g in findings}]
    if deepspeed and not any(f.level == "error" for f in findings):
        findings += _deepspeed_findings(original)
    return findings


def ignored_paths(config: dict) -> list[str]:
    """The keys of `config` DeepSpeed accepts and ignores, which the lint warns about (unknown keys outside its
    models, renamed ones, 'bfloat16' beside 'bf16'): the JSON Schema, stricter on purpose, refuses them, so
    dsconfig.validate leaves them out of its schema check of a user's config (final.py)."""
    if not isinstance(config, dict):
        return []
    config, _ = as_deepspeed_reads(config)
    keys = key_findings(config)
    found = keys + _schema_findings(config, {f.path for f in keys if f.level == "error"}, {f.path for f in keys})
    ignored = ("does nothing: DeepSpeed ignores", "old name of")  # lint_keys.py's messages for them
    return sorted({f.path for f in found if f.level == "warning" and f.path and f.message.startswith(ignored)})
