"""The ds_config linter: one test per check (path and message), generated configs lint clean, and a fuzz test
that no JSON-like input makes it (or the merge) raise."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config import dsconfig, lint, lint_partial, merge
from launcher.config.keys import BATCH_KEYS, estimate_config, strategy_of
from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan.capacity import aligned_partition_numel, usable_cpu_bytes
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.strategy import Strategy
from launcher.plan.workload import Workload
from launcher.units import fmt_bytes
from tests.helpers import errors, host_path, only


def forced_plan(model, host, strategy: Strategy, **workload):
    pinned = dict(
        zero_stage=str(strategy.zero_stage),
        offload_optimizer=strategy.offload_optimizer,
        offload_param=strategy.offload_param,
    )
    return make_plan(model, host, Workload(**pinned, **workload), resolve_rates(host))


# ------------------------------------------------------------------------------------------ unknown keys


# An error where DeepSpeed refuses the key (its pydantic models: extra="forbid"), a warning where it ignores it (the
# top level, and the sections DeepSpeedConfig reads key by key): test_deepspeed_refuses_exactly_the_unknown_keys_
# the_lint_calls_errors checks each level against DeepSpeedConfig itself.
@pytest.mark.parametrize(
    ("section", "typo", "path", "hint", "level"),
    [
        ("", "zero_optimisation", "zero_optimisation", "zero_optimization", "warning"),
        (
            "zero_optimization",
            "stage3_prefetch_bucket",
            "zero_optimization.stage3_prefetch_bucket",
            "stage3_prefetch_bucket_size",
            "error",
        ),
        (
            "zero_optimization.offload_optimizer",
            "pin_memroy",
            "zero_optimization.offload_optimizer.pin_memroy",
            "pin_memory",
            "error",
        ),
        ("bf16", "enable", "bf16.enable", "enabled", "error"),
        ("optimizer", "parms", "optimizer.parms", "params", "warning"),
        ("scheduler", "typ", "scheduler.typ", "type", "warning"),
        ("tensorboard", "enabeld", "tensorboard.enabeld", "enabled", "error"),
        (
            "activation_checkpointing",
            "partition_activation",
            "activation_checkpointing.partition_activation",
            "partition_activations",
            "warning",
        ),  # schema's list
    ],
)
def test_unknown_keys_at_every_level_name_the_nearest(good, section, typo, path, hint, level):
    node = good
    for part in section.split(".") if section else ():
        node = node.setdefault(part, {})
    node[typo] = 1
    finding = only(lint.lint(good, None, 1, deepspeed=False), path)
    assert finding.level == level and f"did you mean '{hint}'?" in finding.message
    if level == "warning":
        assert finding.message.startswith(f"does nothing: DeepSpeed ignores the unknown key '{typo}' in ")


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("comms_config", "the key it reads is comms_logger"),
        ("monitor_config", "the key it reads is tensorboard, wandb, csv_monitor or comet"),
    ],
)
def test_deepspeeds_internal_section_names_are_ignored_keys_with_the_real_one(good, key, hint):
    # runtime/config.py DeepSpeedConfig: self.comms_config = DeepSpeedCommsConfig(param_dict) reads comms_logger,
    # self.monitor_config = get_monitor_config(param_dict) the four monitors; a top-level "comms_config" is ignored
    good[key] = {"enabled": True}
    findings = lint.lint(good, None, 1)
    finding = only(findings, key)
    assert finding.level == "warning" and finding.message.endswith(hint) and errors(findings) == []


def test_a_top_level_section_nested_in_zero_optimization_is_refused(good):
    # the Hugging Face docs' NVMe example nests aio in zero_optimization, which DeepSpeedZeroConfig refuses
    good["zero_optimization"]["aio"] = {"block_size": 262144}
    finding = only(lint.lint(good, None, 1, deepspeed=False), "zero_optimization.aio")
    assert finding.level == "error" and finding.message.endswith(
        "'aio' is a top-level section, not a key of 'zero_optimization': move it to the top level"
    )
    assert "Extra inputs are not permitted" in lint._deepspeed_findings(good)[0].message


def test_unknown_nested_offload_and_aio_keys(plan7b):
    config = forced_render(plan7b, Strategy(3, "nvme", "nvme"))
    config["zero_optimization"]["offload_param"]["buffer_sise"] = 10**9
    config["aio"]["queue_dpeth"] = 8
    findings = lint.lint(config, None, 1, deepspeed=False)
    assert "did you mean 'buffer_size'?" in only(findings, "zero_optimization.offload_param.buffer_sise").message
    assert "did you mean 'queue_depth'?" in only(findings, "aio.queue_dpeth").message


def test_aliases_are_valid_and_deprecated_names_warn(good):
    good["zero_optimization"]["prefetch_bucket_size"] = 1000
    good["zero_optimization"]["cpu_offload"] = True
    findings = lint.lint(good, None, 1, deepspeed=False)
    # a valid key (the alias of stage3_prefetch_bucket_size), which this stage-2 config's optimizer never reads
    prefetch = only(findings, "zero_optimization.prefetch_bucket_size")
    assert prefetch.level == "warning" and prefetch.message.startswith("does nothing at ZeRO stage 2")
    warning = only(findings, "zero_optimization.cpu_offload")
    assert warning.level == "warning" and warning.message == "deprecated in DeepSpeed; use offload_optimizer"


def test_removed_keys_say_deepspeed_refuses_them(good):
    good["nebula"] = {"enabled": True}
    finding = only(lint.lint(good, None, 1, deepspeed=False), "nebula")
    assert finding.message.startswith("removed from DeepSpeed, which refuses it: Nebula checkpointing has been removed")


# ------------------------------------------------------------------------------------------ types


def test_an_integral_float_in_a_config_model_is_a_note(good):
    # DeepSpeedZeroConfig(reduce_bucket_size=5e8) reads it as the integer 500000000 (pydantic lax int_from_float)
    good["zero_optimization"]["reduce_bucket_size"] = 5e8
    findings = lint.lint(good, None, 1)
    assert [str(f) for f in findings] == [
        "note: zero_optimization.reduce_bucket_size: DeepSpeed reads 500000000.0 as 500000000 (DeepSpeedZeroConfig: "
        "a float with no fractional part is that integer)"
    ]
    assert lint._deepspeed_findings(good) == []


def test_a_fractional_float_where_deepspeed_needs_an_int_is_an_error(good):
    # the Hugging Face Trainer's old "auto" for stage3_prefetch_bucket_size, 0.9 x hidden^2, was fractional
    good["zero_optimization"] |= {"stage": 3, "stage3_prefetch_bucket_size": 15099494.4}
    del good["zero_optimization"]["allgather_bucket_size"]
    findings = lint.lint(good, None, 1)
    assert errors(findings) == [
        "error: zero_optimization.stage3_prefetch_bucket_size: 15099494.4 is not a whole number: DeepSpeed's "
        "DeepSpeedZeroConfig refuses it ('got a number with a fractional part'); write 15099494"
    ]
    assert "int_from_float" in lint._deepspeed_findings(good)[0].message


def test_a_float_in_a_key_deepspeed_reads_as_written_is_an_error(good):
    # runtime/config.py get_train_micro_batch_size_per_gpu is a plain dict read: DeepSpeed keeps the float, and
    # its dataloader (torch's DataLoader) refuses it
    good.update(train_batch_size=1.0)
    finding = only(lint.lint(good, None, 1, deepspeed=False), "train_batch_size")
    assert finding.message == (
        "1.0 is a float, and DeepSpeed reads train_batch_size as written (no config model converts it), so it gets "
        "a float where it needs an integer; write 1"
    )
    assert dsconfig.deepspeed_errors({"train_micro_batch_size_per_gpu": 2.0}) == []  # DeepSpeedConfig keeps it
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        import torch.utils.data

        torch.utils.data.DataLoader(list(range(4)), batch_size=2.0)


def test_type_errors_carry_the_json_path(good):
    good["zero_optimization"]["offload_optimizer"]["pin_memory"] = "sometimes"
    finding = only(lint.lint(good, None, 1, deepspeed=False), "zero_optimization.offload_optimizer.pin_memory")
    assert finding.message == "'sometimes' is not of type 'boolean'"


# ------------------------------------------------------------------------------------------ NVMe and aio


def forced_render(plan, strategy: Strategy) -> dict:
    forced = forced_plan(plan.model, plan.host, strategy)
    return dsconfig.render(replace(forced, chosen=replace(forced.candidates[0], problems=())))


@pytest.fixture(scope="module")
def mixtral_plan(a100):
    return forced_plan(inspect_model("mistralai/Mixtral-8x7B-v0.1"), a100, Strategy(3, "nvme", "nvme"))


@pytest.mark.parametrize("world", [1, 2])
def test_param_buffer_below_the_largest_swapped_partition(mixtral_plan, world):
    config = dsconfig.render(mixtral_plan)
    need = aligned_partition_numel(939_524_096, world)  # Mixtral's fused experts (FIELD-NOTES)
    assert config["zero_optimization"]["offload_param"]["buffer_size"] >= need
    config["zero_optimization"]["offload_param"]["buffer_size"] = 100_000_000
    finding = only(lint.lint(config, mixtral_plan, world), "zero_optimization.offload_param.buffer_size")
    assert finding.level == "error"
    assert finding.message.startswith("100000000 is smaller than the largest parameter partition DeepSpeed swaps")
    assert f"{need:,} per rank at world size {world}" in finding.message
    assert finding.message.endswith(f"set it to at least {need}")
    del config["zero_optimization"]["offload_param"]["buffer_size"]
    finding = only(lint.lint(config, mixtral_plan, world), "zero_optimization.offload_param.buffer_size")
    assert finding.message.startswith("unset, so DeepSpeed's default 100000000 is smaller")
    config["zero_optimization"]["offload_param"]["buffer_size"] = need
    assert not [f for f in lint.lint(config, mixtral_plan, world) if "buffer_size" in f.path]


def test_aio_thread_count_is_the_old_name(mixtral_plan):
    config = dsconfig.render(mixtral_plan)
    threads = config["aio"].pop("intra_op_parallelism")
    config["aio"]["thread_count"] = threads
    finding = only(lint.lint(config, None, 1), "aio.thread_count")
    assert finding.message == (
        "old name of intra_op_parallelism (renamed in DeepSpeed 0.16.4; newer versions ignore it); "
        f'write "intra_op_parallelism": {threads}'
    )
    config["aio"]["intra_op_parallelism"] = threads
    finding = only(lint.lint(config, None, 1), "aio.thread_count")
    assert finding.message.endswith("remove it, intra_op_parallelism is set")


@pytest.mark.parametrize("section", ["offload_optimizer", "offload_param"])
def test_nvme_offload_without_nvme_path(mixtral_plan, section):
    config = dsconfig.render(mixtral_plan)
    del config["zero_optimization"][section]["nvme_path"]
    finding = only(lint.lint(config, mixtral_plan, 1), f"zero_optimization.{section}.nvme_path")
    assert finding.message.startswith(f"{section}.device is nvme but nvme_path is not set, so DeepSpeed fails at init")
    assert "/local_nvme/offload/<run>" in finding.message


def test_short_optimizer_swap_buffer_count_warns(mixtral_plan):
    config = dsconfig.render(mixtral_plan)
    # serial swaps (the plan pipelines them: tests/config/test_lint_offload_modes.py has the pipelined counts)
    config["zero_optimization"]["offload_optimizer"] |= {
        "buffer_count": 2,
        "pipeline_read": False,
        "pipeline_write": False,
    }
    finding = only(lint.lint(config, mixtral_plan, 1), "zero_optimization.offload_optimizer.buffer_count")
    assert finding.level == "warning" and "use at least 4" in finding.message


# ------------------------------------------------------------------------------------------ cross-field


def test_offload_param_below_stage_3(good):
    good["zero_optimization"]["offload_param"] = {"device": "cpu"}
    finding = only(lint.lint(good, None, 1), "zero_optimization.offload_param.device")
    assert finding.level == "warning"  # DeepSpeed accepts it and runs without it
    assert finding.message.startswith(
        "offload_param needs ZeRO stage 3 (only stage 3 partitions parameters); at stage 2"
    )
    assert strategy_of(good) == Strategy(2, "cpu")  # what DeepSpeed will really run


def test_nvme_optimizer_below_stage_3_runs_on_cpu(good):
    good["zero_optimization"]["offload_optimizer"] |= {"device": "nvme", "nvme_path": "/nvme/run"}
    finding = only(lint.lint(good, None, 1, deepspeed=False), "zero_optimization.offload_optimizer.device")
    assert finding.level == "warning" and "DeepSpeed keeps the optimizer states in CPU RAM" in finding.message
    assert strategy_of(good) == Strategy(2, "cpu")


def test_offload_without_an_optimizer_section_warns(good):
    del good["optimizer"]
    finding = only(lint.lint(good, None, 1, deepspeed=False), "optimizer")
    assert finding.level == "warning" and "zero_force_ds_cpu_optimizer" in finding.message


def test_fp16_and_bf16_both_enabled(good):
    good["fp16"] = {"enabled": True}
    findings = lint.lint(good, None, 1)
    assert only(findings, "fp16.enabled").message.startswith("fp16 and bf16 are both enabled; DeepSpeed allows one")
    assert len(errors(findings)) == 1  # the schema's own rule is not reported a second time


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [
        (
            lambda c: c.update(bfloat16={"enabled": True}),
            "bfloat16",
            "does nothing: DeepSpeed ignores 'bfloat16' (the old name of bf16)",
        ),
        (
            lambda c: c.update(gradient_allreduce_op="sum", zero_optimization={"stage": 3}),
            "gradient_allreduce_op",
            "'sum' is not supported with ZeRO-3",
        ),
    ],
)
def test_other_cross_field_rules(good, mutate, path, message):
    mutate(good)
    findings = lint.lint(good, None, 1, deepspeed=False)
    finding = only(findings, path)
    assert finding.message.startswith(message)
    # precision_config.get_bfloat16_config reads bfloat16 only without bf16: ignored, not refused
    assert len(errors(findings)) == (finding.level == "error")


def test_schema_cross_field_rules_are_all_ported():
    # lint drops the schema's top-level allOf errors in favour of its own messages: a new rule needs porting.
    rules = [rule["description"] for rule in dsconfig._schema_validator().schema["allOf"]]
    assert len(rules) == 3 and rules[0].startswith("fp16 and bf16") and "bfloat16" in rules[1] and "sum" in rules[2]


# ------------------------------------------------------------------------------------------ batch


@pytest.mark.parametrize(
    ("batch", "world", "message"),
    [
        ((32, 4, 2), 2, "32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 2 = 16; "),
        ((10, 4, None), 2, "(DeepSpeed derives gradient_accumulation_steps 1)"),
        ((None, None, 4), 1, "DeepSpeed needs it or train_batch_size; set it"),
    ],
)
def test_batch_arithmetic(good, batch, world, message):
    for key, value in zip(BATCH_KEYS, batch, strict=True):
        good.pop(key)
        if value is not None:
            good[key] = value
    findings = lint.lint(good, None, world, deepspeed=False)
    assert [message in f.message for f in findings if f.path.startswith(("train_", "gradient_"))] == [True]


def test_batch_arithmetic_holds_and_auto_is_tolerated(good):
    good.update(train_batch_size=16, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    assert lint.lint(good, None, 2) == []
    good.update(train_batch_size="auto")
    assert lint.lint(good, None, 7) == []  # also through DeepSpeed's own parse


# ------------------------------------------------------------------------------------------ fit


def test_offload_that_does_not_fit_the_host_gives_the_numbers(a100):
    llama70b = inspect_model("meta-llama/Llama-2-70b-hf")
    plan = make_plan(llama70b, a100, Workload(), resolve_rates(a100))
    config = forced_render(plan, Strategy(3, "cpu", "cpu"))
    _, estimate = estimate_config(config, plan, 1)
    finding = only(lint.lint(config, plan, 1), "zero_optimization")
    assert finding.message == (
        "ZeRO-3 + opt->cpu + param->cpu for meta-llama/Llama-2-70b-hf at world size 1 does not fit this host: "
        f"CPU RAM needs {fmt_bytes(estimate.cpu_bytes)} at the {estimate.cpu_peak_moment} > "
        f"{fmt_bytes(usable_cpu_bytes(a100))} usable; "
        f"the planner picks {plan.chosen.strategy.label} for this model and host"
    )
    assert estimate.cpu_bytes > usable_cpu_bytes(a100)


def test_config_estimate_is_the_planners_for_every_rendered_strategy(plan7b):
    for candidate in plan7b.candidates:
        config = dsconfig.render(replace(plan7b, chosen=replace(candidate, problems=())))
        strategy, estimate = estimate_config(config, plan7b, plan7b.world_size)
        assert strategy == candidate.strategy and estimate == candidate.memory
        fit = [
            f for f in lint.lint(config, plan7b, plan7b.world_size, deepspeed=False) if f.path == "zero_optimization"
        ]
        assert bool(fit) == (not candidate.fits)


# ------------------------------------------------------------------------------------------ clean configs


@pytest.mark.parametrize("host", ["1x-a100-80g", "8x-h100-80g", "2x-rtx4090-24g"])
def test_generated_configs_lint_clean(llama7b, host):
    described = load_host_spec(host_path(host))
    plan = make_plan(llama7b, described, Workload(micro_batch=2, grad_accum=4), resolve_rates(described))
    fitting = [c for c in plan.candidates if c.fits]
    assert len({c.strategy.zero_stage for c in fitting}) >= 1 and len(fitting) >= 3
    for candidate in fitting:
        config = dsconfig.render(replace(plan, chosen=candidate))
        findings = lint.lint(config, plan, plan.world_size)
        if candidate is plan.chosen:
            assert findings == [], candidate.strategy.label
        else:  # the planner's runner-ups: a full optimizer offload may leave its partial offload's win unused
            assert all(f.path == lint_partial.OFFLOAD_OPTIMIZER and f.level == "warning" for f in findings), findings
            assert not findings or (candidate.strategy.offload_optimizer == "cpu" and not candidate.strategy.partial)


def test_generated_configs_lint_clean_with_nvme_and_on_the_cpu_accelerator(mixtral_plan, tiny_llama_dir):
    assert lint.lint(dsconfig.render(mixtral_plan), mixtral_plan, 1) == []
    cpu = make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := load_host_spec(host_path("cpu-only"))),
        Workload(),
        resolve_rates(h),
    )
    assert lint.lint(dsconfig.render(cpu), cpu, cpu.world_size) == []


def test_schema_if_then_rules_say_why(good):
    good["zero_optimization"] |= {"stage": 3, "compute_grad_norm": False}
    finding = only(lint.lint(good, None, 1), "zero_optimization.stage")
    assert finding.message == "compute_grad_norm=false is supported only with ZeRO stage 1 or 2. (got 3)"


def test_ported_schema_rules_are_the_schemas():
    # lint reports these if/then rules itself (test_lint_offload_modes.py): a renamed rule must be ported again
    def descriptions(node):
        if isinstance(node, dict):
            yield from ([node["description"]] if "if" in node and "description" in node else [])
            for value in node.values():
                yield from descriptions(value)
        elif isinstance(node, list):
            for value in node:
                yield from descriptions(value)

    assert lint.PORTED_SCHEMA_RULES.issubset(descriptions(dsconfig._schema_validator().schema))


def test_deepspeed_parse_runs_last_and_only_on_an_otherwise_clean_config(good, plan7b, monkeypatch):
    seen = []
    monkeypatch.setattr(dsconfig, "deepspeed_errors", lambda config: seen.append(config) or ["DeepSpeed rejects it: x"])
    good.update(train_batch_size="auto", train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto")
    good["optimizer"]["params"]["lr"] = "auto"
    finding = only(lint.lint(good, plan7b, 1), "")
    assert str(finding) == "error: DeepSpeed rejects it: x"
    # "auto" is what the HF Trainer fills before DeepSpeed sees the config: DeepSpeed gets it without them
    assert "train_batch_size" not in seen[0] and "lr" not in seen[0]["optimizer"]["params"]
    assert seen[0]["train_micro_batch_size_per_gpu"] == 1
    assert errors(lint.lint(good, plan7b, 1, deepspeed=False)) == []  # plan7b's full offload: a warning, no error
    good["fp16"] = {"enabled": True}
    assert len(errors(lint.lint(good, plan7b, 1))) == 1 and len(seen) == 1  # not run when something else is wrong


def test_deepspeed_own_parse_becomes_a_finding(good):
    # DeepSpeedZeroConfig.compute_grad_norm_valid raises (the schema has the rule too; lint's own partial-offload
    # and bf16 checks run before DeepSpeed's parse, test_lint_offload_modes.py)
    good["zero_optimization"] |= {"stage": 3, "compute_grad_norm": False}
    [finding] = lint._deepspeed_findings(good)
    assert finding.path == "" and "compute_grad_norm=false is supported only with ZeRO Stage 1 or 2" in finding.message


def test_finding_reads_as_one_line():
    finding = lint.Finding("error", "aio.block_size", "too small")
    assert str(finding) == "error: aio.block_size: too small"
    assert finding.to_json() == {"level": "error", "path": "aio.block_size", "message": "too small"}


def test_not_a_mapping_and_bad_world_size():
    assert [str(f) for f in lint.lint([1], None, 1)] == ["error: a ds_config is a JSON object, got list"]
    with pytest.raises(UserInputError, match="world size must be at least 1, got 0"):
        lint.lint({}, None, 0)


# ------------------------------------------------------------------------------------------ fuzz

REAL_KEYS = [
    "zero_optimization",
    "zero_optimisation",
    "stage",
    "offload_param",
    "offload_optimizer",
    "device",
    "nvme_path",
    "buffer_size",
    "buffer_count",
    "sub_group_size",
    "reduce_bucket_size",
    "stage3_prefetch_bucket_size",
    "cpu_offload",
    "aio",
    "thread_count",
    "intra_op_parallelism",
    "bf16",
    "fp16",
    "bfloat16",
    "enabled",
    "optimizer",
    "scheduler",
    "type",
    "params",
    "nebula",
    "tensorboard",
    "gradient_allreduce_op",
    "ratio",
    "super_offload",
    "cpuadam_cores_perc",
    "bf16_master_weights_and_grads",
    "bf16_optimizer_states",
    "zenflow",
    "select_strategy",
    "select_interval",
    "update_interval",
    "compute_grad_norm",
    "overlap_comm",
    *BATCH_KEYS,
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**63),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["auto", "cpu", "nvme", "none", "sum", "true"]),
)
keys = st.one_of(st.sampled_from(REAL_KEYS), st.text(max_size=10))
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=5), max_leaves=25
)
offload = st.fixed_dictionaries(
    {},
    optional={
        "device": st.sampled_from(["cpu", "nvme", "gpu", 3]),
        "nvme_path": values,
        "buffer_size": values,
        "ratio": st.sampled_from([0, 0.5, 1, 1.5, -1, True, "0.5", None]),
        "super_offload": st.sampled_from([True, False, "true"]),
        "cpuadam_cores_perc": st.sampled_from([0, 0.5, 2, "x"]),
    },
)
zenflow = st.one_of(
    st.none(),
    values,
    st.fixed_dictionaries(
        {},
        optional={
            "select_strategy": st.sampled_from(["auto", "step", "epoch", "x", 1]),
            "select_interval": st.sampled_from(["auto", 0, 1, 4, -1, "x", True]),
            "update_interval": st.sampled_from(["auto", 0, 1, 4, "x", 2.5]),
            "offload": st.sampled_from([True, False, 1]),
        },
    ),
)
shaped = st.fixed_dictionaries(
    {},
    optional={
        "zero_optimization": st.fixed_dictionaries(
            {},
            optional={
                "stage": st.sampled_from([0, 1, 2, 3, 4, "3", None, True, 3.0]),
                "offload_param": offload,
                "offload_optimizer": offload,
                "sub_group_size": values,
                "overlap_comm": values,
                "zenflow": zenflow,
                "compute_grad_norm": st.sampled_from([True, False, "no"]),
            },
        ),
        "bf16": st.fixed_dictionaries(
            {},
            optional={
                "enabled": st.sampled_from([True, False, "auto", 1]),
                "bf16_master_weights_and_grads": st.sampled_from([True, False, "yes"]),
                "bf16_optimizer_states": st.sampled_from([True, False, None]),
            },
        ),
        "optimizer": values,
        "aio": st.dictionaries(keys, values, max_size=3),
        "train_batch_size": values,
        "train_micro_batch_size_per_gpu": values,
        "gradient_accumulation_steps": values,
    },
)
configs = st.one_of(st.dictionaries(keys, values, max_size=8), shaped)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, world=st.integers(min_value=1, max_value=16), with_plan=st.booleans(), ds=st.booleans())
def test_any_json_like_config_gives_findings_never_a_traceback(mixtral_plan, config, world, with_plan, ds):
    before = copy.deepcopy(config)
    findings = lint.lint(config, mixtral_plan if with_plan else None, world, deepspeed=ds)
    assert all(isinstance(f, lint.Finding) and f.level in ("error", "warning", "note") for f in findings)
    assert all(isinstance(f.path, str) and f.message for f in findings)
    assert config == before  # lint never mutates its input
    with contextlib.suppress(UserInputError):  # an "auto" with nothing to fill it
        merge.merge_user_config(config, {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1})


# ------------------------------------------------------------------------------------------ stage no-ops


@pytest.mark.parametrize(
    ("stage", "key", "value", "message"),
    [
        (2, "stage3_max_live_parameters", 30_000_000, "does nothing at ZeRO stage 2: DeepSpeed reads it at stage 3"),
        (2, "sub_group_size", 100_000_000, "does nothing at ZeRO stage 2"),
        (3, "round_robin_gradients", True, "does nothing at ZeRO stage 3: DeepSpeed reads it at stages 1 and 2 only"),
        (3, "allgather_bucket_size", 2e8, "does nothing at ZeRO stage 3: DeepSpeed reads it at stages 0, 1 and 2"),
        (0, "reduce_bucket_size", 50_000_000, "does nothing at ZeRO stage 0: DeepSpeed reads it at stages 1, 2 and 3"),
        (0, "overlap_comm", True, "does nothing at ZeRO stage 0"),
        (1, "allgather_partitions", False, "does nothing: DeepSpeed never reads it"),
        # DeepSpeed's own default (overlap_comm unset is off below stage 3): asks for nothing, says nothing
        (0, "overlap_comm", False, None),
        (2, "stage3_max_live_parameters", 1e9, None),
        (2, "stage3_prefetch_bucket_size", "auto", None),
    ],
)
def test_a_key_the_stage_never_reads_is_a_warning(stage, key, value, message):
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage, key: value}}
    at = [f for f in lint.lint(config, None, 1) if f.path == f"zero_optimization.{key}" and f.level != "note"]
    if message is None:
        assert at == []
    else:
        assert [f.level for f in at] == ["warning"] and at[0].message.startswith(message), at


@pytest.mark.parametrize(
    ("key", "value"),
    [("allgather_bucket_size", "many"), ("cpu_offload", "sometimes"), ("stage3_max_live_parameters", -1)],
)
def test_a_warning_at_a_key_does_not_hide_a_value_deepspeed_refuses(key, value):
    # stage 3 does not read allgather_bucket_size, stage 2 stage3_max_live_parameters, and cpu_offload is
    # deprecated: warnings; but DeepSpeedZeroConfig refuses these values, which is the error
    stage = 3 if key == "allgather_bucket_size" else 2
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage, key: value}}
    finding = only(lint.lint(config, None, 1), f"zero_optimization.{key}")
    assert finding.level == "error"
    assert dsconfig.deepspeed_errors(config)
