"""What DeepSpeed makes of a ds_config's values, so the lint judges, and the merge writes, what DeepSpeed runs.

DeepSpeed parses zero_optimization, bf16/fp16, the monitors and its other model-backed sections with pydantic
models in lax mode (runtime/config_utils.py DeepSpeedConfigModel): an integer field takes 1e9, the float
1000000000.0 once json has read it, as the integer 1000000000 (pydantic's int_from_float; a fractional value
such as 15099494.4 is refused), a bool field takes "true" or 1, the ZeRO stage takes "3". The ecosystem's
ZeRO-3 configs (the Hugging Face docs, LLaMA-Factory) write `"sub_group_size": 1e9` and DeepSpeed accepts it.

`as_deepspeed_reads` returns a config with each such value as the model reads it, with a note for each. Keys
DeepSpeed reads as plain dict values (the batch sizes, aio, steps_per_print ...) are kept as written: DeepSpeed
keeps them so too. "auto" is left for the merge to fill (DeepSpeedConfigModel drops it, runtime/config_utils.py).
"""

from __future__ import annotations

import copy
import enum
import json
from functools import cache

from launcher.config.finding import Finding
from launcher.config.keys import _get, _is_auto, section_models

JSON_SCALARS = (bool, int, float, str, type(None))


@cache
def _field_keys(model) -> dict[str, str]:
    """A model's keys (field names and aliases: populate_by_name) -> field name."""
    keys = {}
    for name, field in model.model_fields.items():
        keys[name] = name
        if field.alias:
            keys[field.alias] = name
    return keys


def field_read(model, key: str, value: object) -> tuple[bool, object]:
    """(accepted, value as read) for `key` of `model`, validated as the model validates an assignment to it (its
    type and constraints in pydantic's lax mode, its field validators: DeepSpeedConfigModel sets
    validate_assignment), the other fields at their defaults; (False, value) when the model refuses it or the key
    is not the model's."""
    from pydantic import ValidationError

    name = _field_keys(model).get(key)
    if name is None:
        return False, value
    try:
        instance = model.model_construct()
        model.__pydantic_validator__.validate_assignment(instance, name, value)
    except (ValidationError, ValueError, TypeError, AttributeError, AssertionError):
        return False, value
    result = instance.__dict__.get(name, value)
    return True, result.value if isinstance(result, enum.Enum) else result


def _converted(value: object, result: object) -> bool:
    """Whether the model reads `value` as another JSON value: a float as an integer, a string or a number as a bool,
    a string as a number. An int read by a float field is the same number (1 for ratio 1.0): not a conversion."""
    if not isinstance(result, JSON_SCALARS) or not isinstance(value, JSON_SCALARS):
        return False  # a Path (nvme_path), an object: kept as written
    if isinstance(value, bool) or isinstance(result, bool):
        return type(value) is not type(result)
    if isinstance(value, str) or isinstance(result, str):
        return type(value) is not type(result)
    return isinstance(value, float) and isinstance(result, int)


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, float) else json.dumps(value)


def as_deepspeed_reads(config: dict) -> tuple[dict, list[Finding]]:
    """A copy of `config` with every value a DeepSpeed config model converts written as it reads it, and a note
    for each ("DeepSpeed reads 1000000000.0 as 1000000000"). Values the model refuses are kept: the schema and the
    lint's checks report them."""
    read = copy.deepcopy(config)
    notes = []
    for section, model in section_models().items():
        node = _get(read, section)
        if not isinstance(node, dict):
            continue
        for key, value in list(node.items()):
            if _is_auto(value) or isinstance(value, (dict, list)) or key not in _field_keys(model):
                continue
            accepted, result = field_read(model, key, value)
            if accepted and _converted(value, result):
                node[key] = result
                path = f"{section}.{key}" if section else key
                why = "a float with no fractional part is that integer" if isinstance(value, float) else "lax mode"
                notes.append(
                    Finding(
                        "note",
                        path,
                        f"DeepSpeed reads {_shown(value)} as {_shown(result)} ({model.__name__}: {why})",
                    )
                )
    return read, notes


def is_model_field(path: str) -> bool:
    """Whether DeepSpeed reads the key at `path` through a config model (else as a plain dict value)."""
    section, _, key = path.rpartition(".")
    model = section_models().get(section) if section else None
    return model is not None and key in _field_keys(model)
