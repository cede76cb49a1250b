"""Render the ds_config once from `templates/` fragments plus the plan's numbers, then validate it twice:
against the JSON Schema shipped in `launcher/schemas/` and against DeepSpeed's own config models."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
from functools import cache
from pathlib import Path

from launcher.deepspeed_logging import import_deepspeed
from launcher.errors import OffloadLaunchError
from launcher.plan.host_buffers import ZENFLOW_TOPK_RATIO
from launcher.plan.planner import Plan
from launcher.resources import resource_path

SCHEMA_PATH = resource_path("schemas/ds_config.schema.json")


class InvalidDsConfig(OffloadLaunchError):
    """A ds_config failed validation. For a generated config this is a bug in offload-launch."""


# One table from our knobs to DeepSpeed's keys (cf. accelerate's plugin_to_config_mapping).
KNOB_TO_DS_KEY = {
    "micro_batch": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
    "train_batch_size": "train_batch_size",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer": "zero_optimization.offload_optimizer.device",
    "offload_param": "zero_optimization.offload_param.device",
    "pin_memory": "zero_optimization.offload_*.pin_memory",
    "nvme_path": "zero_optimization.offload_*.nvme_path",
    "reduce_bucket_size": "zero_optimization.reduce_bucket_size",
    "allgather_bucket_size": "zero_optimization.allgather_bucket_size",
    "prefetch_bucket_size": "zero_optimization.stage3_prefetch_bucket_size",
    "param_persistence_threshold": "zero_optimization.stage3_param_persistence_threshold",
    "sub_group_size": "zero_optimization.sub_group_size",
    "optimizer_buffer_count": "zero_optimization.offload_optimizer.buffer_count",
    "offload_ratio": "zero_optimization.offload_optimizer.ratio",
    "param_buffer_count": "zero_optimization.offload_param.buffer_count",
    "param_buffer_size": "zero_optimization.offload_param.buffer_size",
    "max_in_cpu": "zero_optimization.offload_param.max_in_cpu",
    "max_live_parameters": "zero_optimization.stage3_max_live_parameters",
    "max_reuse_distance": "zero_optimization.stage3_max_reuse_distance",
}


def load_template(name: str) -> dict:
    return json.loads((resource_path("templates") / f"{name}.json").read_text())


def deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def uses_torch_adam(plan: Plan) -> bool:
    """Whether the optimizer section asks for torch's fused AdamW (`torch_adam` + `fused`): on a GPU without
    optimizer offload. There DeepSpeed would otherwise build its FusedAdam op, a CUDAOpBuilder whose JIT
    build compiles multi_tensor_adam.cu with nvcc matching torch's CUDA (op_builder/fused_adam.py); with
    `torch_adam` engine.py `get_optimizer_configuration` returns torch.optim.AdamW, and the remaining
    params (`fused` among them) go to its constructor. torch defaults to foreach, not fused: `fused` is
    asked for. On the CPU accelerator too: there DeepSpeed's FusedAdam is a C++ build (op_builder/cpu) that
    stepped at ~5 ns/param on the 2-core host of docs/planning.md, against ~0.5 ns/param for torch's fused AdamW
    (`make bench`). With optimizer offload DeepSpeed must build DeepSpeedCPUAdam (pure C++, op_builder/cpu)."""
    return plan.chosen.strategy.offload_optimizer == "none"


# The share of a rank's cores SuperOffload's CPU-Adam worker gets (superoffload_utils.py `_set_cpu_affinity`):
# DeepSpeed's default, written out so the ds_config says it; the rest keep PyTorch's launch thread fed.
SUPEROFFLOAD_CPUADAM_CORES_PERC = 0.8


def zenflow_section(interval: int) -> dict:
    """zero_optimization.zenflow (host_buffers.py [ZenFlow]): DeepSpeed's topk_ratio; the important columns reselected
    by step count as often as the host updates (`select_strategy` "auto" would reselect per epoch of a
    training_dataloader, which this trainer does not hand DeepSpeed: never), which satisfies configure_zenflow's
    select_interval >= update_interval; the host's update overlapped with the next steps (overlap_step); no
    warm-up rounds of full updates."""
    return {
        "topk_ratio": ZENFLOW_TOPK_RATIO,
        "select_strategy": "step",
        "select_interval": interval,
        "update_interval": interval,
        "overlap_step": True,
        "full_warm_up_rounds": 0,
    }


def _zero_section(plan: Plan, nvme_path: str | None) -> dict:
    """zero_optimization's computed values: the planned buckets, and where each offloaded part lives."""
    strategy, buckets = plan.chosen.strategy, plan.chosen.buckets
    zero: dict = {"reduce_bucket_size": buckets.reduce_bucket_size}
    if strategy.zero_stage < 3:
        zero["allgather_bucket_size"] = buckets.allgather_bucket_size
    else:
        zero["stage3_prefetch_bucket_size"] = buckets.prefetch_bucket_size
        zero["stage3_param_persistence_threshold"] = buckets.param_persistence_threshold
        zero["sub_group_size"] = buckets.sub_group_size
        # the live-parameter bound the GPU estimate counts ([DS-live], capacity.size_buckets)
        zero["stage3_max_live_parameters"] = buckets.max_live_parameters
        zero["stage3_max_reuse_distance"] = buckets.max_reuse_distance
    if strategy.offload_optimizer != "none":
        offload = {"pin_memory": plan.pin_memory}
        if strategy.offload_optimizer == "nvme":
            offload |= {
                "nvme_path": nvme_path,
                "buffer_count": buckets.optimizer_buffer_count,
                "pipeline_read": buckets.pipeline,
                "pipeline_write": buckets.pipeline,
            }
        if strategy.partial:  # DeepSpeed's default 1.0 offloads it all (subgroups.py [Twin-Flow])
            offload["ratio"] = strategy.offload_ratio
        # host_buffers.py [SuperOffload]: its worker gets DeepSpeed's 0.8 of the rank's cores
        if strategy.super_offload:
            offload |= {"super_offload": True, "cpuadam_cores_perc": SUPEROFFLOAD_CPUADAM_CORES_PERC}
        zero["offload_optimizer"] = offload
    if strategy.zenflow_interval:
        zero["zenflow"] = zenflow_section(strategy.zenflow_interval)
    if strategy.offload_param != "none":
        offload = {"pin_memory": plan.pin_memory}
        if strategy.offload_param == "nvme":
            offload |= {
                "nvme_path": nvme_path,
                "buffer_count": buckets.param_buffer_count,
                "buffer_size": buckets.param_buffer_size,
                "max_in_cpu": buckets.max_in_cpu,
            }
        zero["offload_param"] = offload
    return zero


def render(plan: Plan, nvme_path: str | None = None) -> dict:
    """The ds_config for the plan's chosen strategy. `nvme_path` is the run's own swap folder
    (a subfolder of --nvme-path, so two runs sharing a drive never clobber each other)."""
    chosen = plan.chosen
    if chosen is None:
        raise ValueError("render() needs a plan whose strategy fits")
    strategy, workload = chosen.strategy, plan.workload
    fragments = ["base", plan.precision, f"zero{strategy.zero_stage}"]
    if strategy.offload_optimizer != "none":
        fragments.append(f"offload_optimizer_{strategy.offload_optimizer}")
    if strategy.offload_param != "none":
        fragments.append(f"offload_param_{strategy.offload_param}")
    uses_nvme = "nvme" in (strategy.offload_optimizer, strategy.offload_param)
    if uses_nvme:
        fragments.append("aio")
        nvme_path = nvme_path or workload.nvme_path or plan.host.nvme.path
    config: dict = {}
    for name in fragments:
        config = deep_merge(config, load_template(name))

    computed: dict = {
        "train_batch_size": plan.train_batch_size,
        "train_micro_batch_size_per_gpu": workload.micro_batch,
        "gradient_accumulation_steps": workload.grad_accum,
        "gradient_clipping": workload.gradient_clipping,
        "optimizer": {
            "params": {"lr": workload.lr, "weight_decay": workload.weight_decay}
            | ({"torch_adam": True, "fused": True} if uses_torch_adam(plan) else {})
        },
        "scheduler": {
            "params": {
                "warmup_max_lr": workload.lr,
                # As typed, not cut to --steps: the schedule must not change when a resumed run gets more steps.
                "warmup_num_steps": max(1, workload.warmup_steps),  # DeepSpeed rejects 0
                # WarmupDecayLR reaches 0 at iteration total_num_steps, and step k of a run runs at iteration k
                # (launcher/rank/trainer.py starts the schedule there): the last step's rate is not 0 either.
                "total_num_steps": workload.steps + 1,
            }
        },
    }
    computed["zero_optimization"] = _zero_section(plan, nvme_path)
    if strategy.optimizer_states == "bf16":  # strategy.py [DS-bf16s]: both flags, DeepSpeed asserts the pair
        computed["bf16"] = {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    if uses_nvme:
        # The settings `offload-launch probe` measured best on this host; else one aio thread per core the
        # rank can spare, at most 8 (ds_nvme_tune sweeps 1-8).
        threads = max(1, min(8, plan.host.cpu_cores // plan.ranks_per_node // 2))
        computed["aio"] = dict(plan.aio) if plan.aio else {"intra_op_parallelism": threads}
    return deep_merge(config, computed)


# ------------------------------------------------------------------------------------------ validation


@cache
def _schema_validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    # JSON Schema counts 5e8 as an integer; DeepSpeed reads some int keys as raw dict values and keeps the
    # float (FIELD-NOTES: "Integer fields reject floats"), so only real integers pass here. Its config models
    # read 5e8 as the integer: the lint converts those first (reads.py), and the merge writes the integer.
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


def schema_errors(config: dict) -> list[str]:
    """Every schema violation, each as 'path.to.key: message'."""
    errors = []
    for error in sorted(_schema_validator().iter_errors(config), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        errors.append(f"{where}: {error.message}")
    return errors


def deepspeed_errors(config: dict) -> list[str]:
    """Parse with DeepSpeed's own DeepSpeedConfig (pydantic models, batch arithmetic, sanity checks).
    Outside a launched job DeepSpeed assumes world size 1, so with a micro-batch train_batch_size is left for it
    to derive (our own check covers train_batch_size = micro x accumulation x world); without one it is kept, as
    DeepSpeed then derives the micro-batch from it (runtime/config.py _set_batch_related_parameters) and needs one
    of the two."""
    import_deepspeed()
    from deepspeed.runtime.config import DeepSpeedConfig

    probe = copy.deepcopy(config)
    if "train_micro_batch_size_per_gpu" in probe:
        probe.pop("train_batch_size", None)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            DeepSpeedConfig(probe)
    except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, AssertionError, ValueError ...
        return [f"DeepSpeed rejects it: {' '.join(str(exc).split())[:400]}"]
    return []


def batch_errors(config: dict, world_size: int) -> list[str]:
    try:
        micro = config["train_micro_batch_size_per_gpu"]
        accum = config["gradient_accumulation_steps"]
        total = config["train_batch_size"]
    except KeyError as missing:
        return [f"{missing.args[0]} is missing"]
    if not all(isinstance(v, int) for v in (micro, accum, total)):
        return []  # "auto" values: filled in later
    if total != micro * accum * world_size:
        return [f"train_batch_size {total} != micro {micro} x accumulation {accum} x world {world_size}"]
    return []


def _without(config: dict, paths) -> dict:
    """`config` without the keys at `paths` (dotted), for the schema check."""
    probe = copy.deepcopy(config)
    for path in paths:
        *parents, key = path.split(".")
        node = probe
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(key, None)
    return probe


def validate(config: dict, world_size: int, cache_dir: Path | None = None, ignored: tuple[str, ...] = ()) -> None:
    """Schema and batch arithmetic always; then DeepSpeed's own models - skipped when `cache_dir` records
    that this exact config already passed them under this DeepSpeed version (importing DeepSpeed costs
    seconds; a repeated dry run needs none of them). `ignored`: keys of a user's config that DeepSpeed accepts and
    ignores (lint.ignored_paths, each a lint warning), left out of the schema check, which refuses them on purpose;
    DeepSpeed's own parse still sees them."""
    problems = schema_errors(_without(config, ignored) if ignored else config) + batch_errors(config, world_size)
    marker = _validated_marker(config, cache_dir) if cache_dir and not problems else None
    if not problems and not (marker and marker.exists()):
        problems = deepspeed_errors(config)
        if not problems and marker:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
    if problems:
        raise InvalidDsConfig("invalid ds_config: " + "; ".join(problems))


def _validated_marker(config: dict, cache_dir: Path) -> Path:
    from importlib.metadata import version

    payload = json.dumps(config, sort_keys=True) + "|deepspeed " + version("deepspeed")
    return cache_dir / "validated" / hashlib.sha256(payload.encode()).hexdigest()[:32]
