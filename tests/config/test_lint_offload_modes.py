"""The linter on DeepSpeed's newer offload modes: partial optimizer offload (offload_optimizer.ratio), 16-bit master
weights and optimizer states, SuperOffload and ZenFlow. One test per rule, each named for the DeepSpeed 0.19.8 code
it mirrors (lint.py cites file and function); where DeepSpeed's own config parse would pass the config, the test
says so, since only our finding catches it before a run. Then the full offload that leaves a partial offload's win
unused, the schema's knowledge of every key involved, and `offload-launch check` on configs using each mode well."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.config import dsconfig, lint, lint_partial
from launcher.config.keys import estimate_config
from launcher.inspection.hostspec import load_host_spec
from launcher.plan.candidates import Inputs, estimate_candidate
from launcher.plan.capacity import usable_gpu_bytes
from launcher.plan.modes import partial_offload_candidate
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from launcher.units import fmt_bytes
from tests.helpers import errors, host_path, only

RATIO = "zero_optimization.offload_optimizer.ratio"
SUPER = "zero_optimization.offload_optimizer.super_offload"
CORES = "zero_optimization.offload_optimizer.cpuadam_cores_perc"
MASTER = "bf16.bf16_master_weights_and_grads"
STATES = "bf16.bf16_optimizer_states"
ZENFLOW = "zero_optimization.zenflow"


@pytest.fixture(scope="module")
def full3_plan(llama7b, a100):
    """ZeRO-3 with the whole optimizer on the CPU (ratio pinned to 1: left alone the planner keeps part on the GPU)."""
    return make_plan(
        llama7b, a100, Workload(zero_stage="3", offload_optimizer="cpu", offload_ratio=1.0), resolve_rates(a100)
    )


@pytest.fixture
def stage3(full3_plan):
    config = dsconfig.render(full3_plan)
    assert config["zero_optimization"]["stage"] == 3 and "ratio" not in config["zero_optimization"]["offload_optimizer"]
    return config


@pytest.fixture
def cpu_host_plan(tiny_llama_dir):
    from launcher.inspection.model import inspect_model

    return make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := load_host_spec(host_path("cpu-only"))),
        Workload(),
        resolve_rates(h),
    )


def without_offload(config):
    del config["zero_optimization"]["offload_optimizer"]
    return config


# ------------------------------------------------------------------------------------------ partial offload


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("device", ["cpu", "none", "nvme"])
def test_partial_offload_below_stage_3_is_refused_at_the_ratio(good, stage, device):
    # runtime/zero/config.py offload_ratio_check asserts whatever the device
    good["zero_optimization"]["stage"] = stage
    good["zero_optimization"]["offload_optimizer"] |= {"device": device, "ratio": 0.5, "nvme_path": "/nvme/run"}
    findings = lint.lint(good, None, 1)
    finding = only(findings, RATIO)
    assert finding.level == "error"
    assert finding.message == (
        "0.5 < 1 is a partial offload, which DeepSpeed supports with ZeRO stage 3 only: it refuses it at stage "
        f"{stage} ('Partial offloading only supported for ZeRO Stage 3'); set zero_optimization.stage to 3, or remove "
        "ratio"
    )
    assert not [f for f in findings if f.path == "zero_optimization.stage"]  # the schema's rule is not said again
    [deepspeed] = lint._deepspeed_findings(good)  # and DeepSpeed agrees
    assert "Partial offloading only supported for ZeRO Stage 3" in deepspeed.message


def test_a_ratio_of_1_is_the_default_anywhere(good):
    good["zero_optimization"]["offload_optimizer"]["ratio"] = 1
    assert lint.lint(good, None, 1) == []


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("none", "does nothing without optimizer offload: DeepSpeed splits the optimizer's sub-groups"),
        ("nvme", "with device nvme the ratio keeps nothing on the GPU: ZeRO-3 still swaps its sub-groups to NVMe"),
    ],
)
def test_a_ratio_without_a_cpu_offload_warns(stage3, device, message):
    stage3["zero_optimization"]["offload_optimizer"] |= {"device": device, "ratio": 0.5, "nvme_path": "/nvme/run"}
    findings = lint.lint(stage3, None, 1, deepspeed=False)
    finding = only(findings, RATIO)
    assert finding.level == "warning" and finding.message.startswith(message) and errors(findings) == []
    assert lint._deepspeed_findings(stage3) == []  # DeepSpeed's parse lets it through


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            lambda c: c["optimizer"]["params"].update(torch_adam=True),
            "optimizer.params.torch_adam builds torch's AdamW",
        ),
        (lambda c: c["optimizer"].update(type="Lamb"), "optimizer.type Lamb builds another optimizer"),
        (lambda c: c["zero_optimization"].update(zenflow={}), "zero_optimization.zenflow builds ZenFlowCPUAdam"),
    ],
)
def test_a_partial_offload_needs_deepspeed_cpu_adam(stage3, mutate, reason):
    # stage3.py DeepSpeedZeroOptimizer_Stage3.__init__: 'Hybrid Optimizer Only Supports DeepSpeedCPUAdam'
    stage3["zero_optimization"]["offload_optimizer"]["ratio"] = 0.5
    mutate(stage3)
    finding = only(lint.lint(stage3, None, 1, deepspeed=False), RATIO)
    assert finding.level == "error"
    assert "('Hybrid Optimizer Only Supports DeepSpeedCPUAdam')" in finding.message and reason in finding.message


def test_a_ratio_that_keeps_no_sub_group_on_the_gpu(stage3, full3_plan):
    # stage3.py _create_fp32_partitions: sub-group i stays on the GPU when i < int((1 - ratio) x sub-groups)
    del stage3["zero_optimization"]["sub_group_size"]  # DeepSpeed's 1e9: Llama-2-7B's partition in 7 sub-groups
    stage3["zero_optimization"]["offload_optimizer"]["ratio"] = 0.9
    finding = only(lint.lint(stage3, full3_plan, 1), RATIO)
    assert finding.level == "warning" and finding.message.startswith(
        "0.9 keeps nothing on the GPU: meta-llama/Llama-2-7b-hf's partition at world size 1 forms 7 sub-group(s) of "
        "sub_group_size 1000000000, and DeepSpeed keeps the first int((1 - ratio) x 7) = 0 of them there; lower "
        "zero_optimization.sub_group_size (e.g. "
    )
    stage3["zero_optimization"]["offload_optimizer"]["ratio"] = 0.8  # int(0.2 x 7) = 1
    assert not [f for f in lint.lint(stage3, full3_plan, 1) if f.path == RATIO]


def test_the_planners_partial_offload_lints_clean(llama7b, a100):
    plan = make_plan(llama7b, a100, Workload(), resolve_rates(a100))
    assert plan.chosen.strategy.partial
    assert lint.lint(dsconfig.render(plan), plan, 1) == []


# ------------------------------------------------------------------------------------------ bf16 states


def test_bf16_optimizer_states_need_bf16_master_weights(good):
    # runtime/config.py _do_error_check asserts it; the schema's rule is not reported a second time
    good["bf16"]["bf16_optimizer_states"] = True
    findings = lint.lint(good, None, 1)
    finding = only(findings, STATES)
    assert finding.message.startswith("needs bf16_master_weights_and_grads true: DeepSpeed refuses it alone")
    assert errors(findings) == [str(finding)]


def test_bf16_master_weights_need_a_zero_stage(good):
    # runtime/config.py _do_error_check: "Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3."
    good["zero_optimization"] = {"stage": 0}
    good["bf16"] |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    findings = lint.lint(good, None, 1)
    assert only(findings, MASTER).message.startswith("is supported with ZeRO stage 1, 2 or 3 only")
    assert errors(findings) == [str(only(findings, MASTER))]  # one fix, one line
    good["bf16"]["bf16_master_weights_and_grads"] = False
    message = only(lint.lint(good, None, 1), STATES).message
    assert message.startswith("needs bf16_master_weights_and_grads true and ZeRO stage 1-3")


# What runtime/base_optimizer.py _configure_master_weights refuses, with the validators of stage_1_and_2.py and
# stage3.py: each row was also run through deepspeed.initialize and one step on the CPU accelerator (DeepSpeed
# 0.19.8, a tiny model), which refused exactly the rows marked refused.
@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize(
    ("states", "offload", "torch_adam", "refused"),
    [
        (False, False, False, "with fp32 optimizer states DeepSpeed needs the optimizer offloaded"),
        (True, False, False, None),  # 16-bit states on the GPU
        (False, True, False, None),
        (True, True, False, None),
        (False, True, True, "with the optimizer offloaded DeepSpeed needs DeepSpeedCPUAdam"),
        (True, True, True, "with the optimizer offloaded DeepSpeed needs DeepSpeedCPUAdam"),
    ],
)
def test_bf16_master_weights_with_and_without_offload(good, stage, states, offload, torch_adam, refused):
    good["zero_optimization"]["stage"] = stage
    if stage == 3:  # the stage-2 config's allgather bucket does nothing at ZeRO-3 (a warning of its own)
        del good["zero_optimization"]["allgather_bucket_size"]
    good["bf16"] |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": states}
    if not offload:
        without_offload(good)
    if torch_adam:
        good["optimizer"]["params"]["torch_adam"] = True
        good["zero_force_ds_cpu_optimizer"] = False
    findings = lint.lint(good, None, 1, deepspeed=False)
    if refused:
        assert only(findings, MASTER).message.startswith(refused) and len(errors(findings)) == 1
    else:
        assert findings == []
        assert lint._deepspeed_findings(good) == []


def test_bf16_master_weights_without_bf16_warn(good):
    good["bf16"] = {"enabled": False, "bf16_master_weights_and_grads": True}
    finding = only(lint.lint(good, None, 1), MASTER)
    assert finding.level == "warning" and finding.message.startswith(
        "bf16 is not enabled: DeepSpeed does not check it and keeps the master weights and gradients of this fp32 "
        "model in bf16"
    )
    good["bf16"]["enabled"] = "auto"  # the HF Trainer decides
    assert lint.lint(good, None, 1) == []


# ------------------------------------------------------------------------------------------ SuperOffload


def test_super_offload_below_stage_3_does_nothing(good):
    # engine.py _configure_zero_optimizer builds SuperOffloadOptimizer_Stage3 in its ZeRO-3 branch only
    good["zero_optimization"]["offload_optimizer"]["super_offload"] = True
    finding = only(lint.lint(good, None, 1), SUPER)
    assert finding.level == "warning" and finding.message.startswith("does nothing below ZeRO-3")


def test_super_offload_at_stage_3_with_the_optimizer_on_the_cpu_is_clean(stage3, full3_plan):
    stage3["zero_optimization"]["offload_optimizer"] |= {"super_offload": True, "cpuadam_cores_perc": 0.5}
    assert lint.lint(stage3, full3_plan, 1) == []


@pytest.mark.parametrize(("device", "why"), [("none", "its first backward fails"), ("nvme", "never swaps")])
def test_super_offload_needs_the_optimizer_in_cpu_memory(stage3, device, why):
    stage3["zero_optimization"]["offload_optimizer"] |= {"super_offload": True, "device": device, "nvme_path": "/n"}
    finding = only(lint.lint(stage3, None, 1, deepspeed=False), SUPER)
    assert (
        finding.level == "error"
        and finding.message.startswith("needs offload_optimizer.device cpu")
        and why in (finding.message)
    )


def test_super_offload_needs_cuda(cpu_host_plan):
    # superoffload_stage3.py _validate_superoffload_accelerator
    config = dsconfig.render(cpu_host_plan)
    config["zero_optimization"] = {"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": True}}
    finding = only(lint.lint(config, cpu_host_plan, 1, deepspeed=False), SUPER)
    assert finding.message.startswith("needs a CUDA GPU: DeepSpeed refuses it on its CPU accelerator")


def test_cpuadam_cores_perc_is_read_only_with_super_offload(stage3, good):
    for config in (stage3, good):  # ZeRO-3 without super_offload, ZeRO-2 at all
        config["zero_optimization"]["offload_optimizer"]["cpuadam_cores_perc"] = 0.5
        finding = only(lint.lint(config, None, 1, deepspeed=False), CORES)
        assert finding.level == "warning" and finding.message.startswith(
            "does nothing without super_offload at ZeRO-3: only DeepSpeed's SuperOffload optimizer reads it"
        )


def test_no_cpu_adam_core_for_super_offload(stage3):
    # superoffload_utils.py SuperOffloadCPUOptimizer: 0 < cpuadam_cores_perc <= 1, though the config accepts 0
    stage3["zero_optimization"]["offload_optimizer"] |= {"super_offload": True, "cpuadam_cores_perc": 0}
    assert lint._deepspeed_findings(stage3) == []
    finding = only(lint.lint(stage3, None, 1), CORES)
    assert finding.level == "error" and "'cpuadam_cores_perc must be between 0 and 1'" in finding.message


# ------------------------------------------------------------------------------------------ ZenFlow


@pytest.fixture
def zenflow(good):
    """ZeRO-2 with the optimizer on the CPU and ZenFlow as DeepSpeed's defaults ({} turns it on)."""
    good["zero_optimization"]["zenflow"] = {}
    assert lint.lint(good, None, 1) == []
    return good


def test_the_planners_zenflow_config_lints_clean(llama7b, a100):
    plan = make_plan(llama7b, a100, Workload(zenflow=True, zenflow_interval=8), resolve_rates(a100))
    assert plan.chosen.strategy.zenflow_interval == 8
    assert lint.lint(dsconfig.render(plan), plan, 1) == []


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        # zenflow/engine.py configure_zenflow turns it on at any stage; the stage-0 optimizer has no ZenFlow hooks
        (0, "ZenFlow needs ZeRO stage 1, 2 or 3: at stage 0 DeepSpeed turns it on anyway"),
        # zenflow_stage_1_and_2.py _configure_zenflow: "Zenflow must be used with cpu offload"
        (2, "ZenFlow needs the optimizer offloaded: DeepSpeed refuses it without ('Zenflow must be used with cpu"),
        # stage 3 does not check it; zenflow_cpu_optimizer_step passes step_id to the GPU optimizer
        (3, "ZenFlow needs the optimizer offloaded: ZeRO-3 does not check it, but its first step passes"),
    ],
)
def test_zenflow_needs_a_zero_stage_and_the_optimizer_offloaded(zenflow, stage, message):
    zenflow["zero_optimization"]["stage"] = stage
    without_offload(zenflow)
    findings = lint.lint(zenflow, None, 1, deepspeed=False)
    assert only(findings, ZENFLOW).message.startswith(message) and len(errors(findings)) == 1


def test_zenflow_at_stage_3_needs_cuda(stage3, cpu_host_plan):
    # zenflow/engine_stage3.py update_selected_channels allocates on 'cuda'
    stage3["zero_optimization"]["zenflow"] = {}
    assert lint.lint(stage3, None, 1, deepspeed=False) == []
    finding = only(lint.lint(stage3, cpu_host_plan, 1, deepspeed=False), ZENFLOW)
    assert finding.message.startswith("ZenFlow's ZeRO-3 path needs a CUDA GPU")


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        # configure_zenflow: raise Warning("If use auto select strategy, select_interval will be set to 1 ...")
        ({"select_interval": 4}, "select_interval", "select_strategy auto sets the interval itself"),
        # "If don't use auto select strategy, select_interval must be a number."
        ({"select_strategy": "step"}, "select_strategy", "select_strategy step needs a number for select_interval"),
        (
            {"select_strategy": "epoch", "select_interval": "auto"},
            "select_interval",
            "select_strategy epoch needs a number",
        ),
        # "Select interval must be greater or equal to update interval"
        (
            {"select_strategy": "step", "select_interval": 2, "update_interval": 4},
            "select_interval",
            "2 < update_interval 4: DeepSpeed refuses it at init",
        ),
        # zenflow_stage_1_and_2.py: assert overlap_comm, "offload selective optimizer should be used with overlap_comm"
        ({"offload": True}, "offload", "ZenFlow's selective-optimizer offload needs overlap_comm"),
    ],
)
def test_zenflow_settings_deepspeed_refuses_at_init(zenflow, section, path, message):
    zenflow["zero_optimization"]["zenflow"] = section
    zenflow["zero_optimization"].pop("overlap_comm", None)  # DeepSpeed's default: off below ZeRO-3
    assert lint._deepspeed_findings(zenflow) == []  # the config parse lets each through; the engine's init does not
    findings = lint.lint(zenflow, None, 1)
    assert only(findings, f"{ZENFLOW}.{path}").message.startswith(message) and len(errors(findings)) == 1


def test_zenflow_intervals_deepspeed_accepts(zenflow):
    for section in (
        {"select_strategy": "step", "select_interval": 4, "update_interval": 4},
        {"select_strategy": "step", "select_interval": 0, "update_interval": 4},  # 0: never reselect, not compared
        {"select_strategy": "epoch", "select_interval": 1, "update_interval": 8},  # epochs: known at run time only
        {"offload": True},
    ):
        zenflow["zero_optimization"] |= {"zenflow": section, "overlap_comm": True}
        assert lint.lint(zenflow, None, 1) == [], section


def test_zenflow_refuses_a_summed_allreduce(zenflow):
    # runtime/config.py _do_error_check: "gradient_allreduce_op='sum' is not supported with ZenFlow"
    zenflow["gradient_allreduce_op"] = "SUM"
    findings = lint.lint(zenflow, None, 1)
    assert only(findings, "gradient_allreduce_op").message == "'sum' is not supported with ZenFlow; use 'mean'"
    del zenflow["zero_optimization"]["zenflow"]
    assert lint.lint(zenflow, None, 1) == []  # 'sum' is fine at ZeRO-2 without ZenFlow


@pytest.mark.parametrize(
    ("update", "said"), [(2, "zenflow.update_interval 2"), ("auto", "'auto' (0: ZenFlow decides)")]
)
def test_zenflow_replaces_gradient_accumulation(zenflow, update, said):
    # zenflow/engine.py configure_zenflow: engine._config.gradient_accumulation_steps = engine.update_interval
    zenflow["zero_optimization"]["zenflow"] = {"update_interval": update}
    zenflow.update(train_batch_size=4, gradient_accumulation_steps=4)
    finding = only(lint.lint(zenflow, None, 1), "gradient_accumulation_steps")
    assert (
        finding.level == "warning"
        and said in finding.message
        and "4 accumulation steps do not happen" in (finding.message)
    )
    zenflow["zero_optimization"]["zenflow"] = {"update_interval": 4}
    assert lint.lint(zenflow, None, 1) == []


@pytest.mark.parametrize("zenflow_on", [False, True])
def test_compute_grad_norm_false_with_offload_or_zenflow(good, zenflow_on):
    # stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ raises for either
    good["zero_optimization"]["compute_grad_norm"] = False
    good["gradient_clipping"] = 0
    if zenflow_on:
        good["zero_optimization"]["zenflow"] = {}
    finding = only(lint.lint(good, None, 1), "zero_optimization.compute_grad_norm")
    assert finding.message.startswith(f"false does not support {'ZenFlow' if zenflow_on else 'optimizer offload'}")
    without_offload(good)
    good["zero_optimization"].pop("zenflow", None)
    assert lint.lint(good, None, 1) == []


# ------------------------------------------------------------------------------------------ the unused GPU


def expected_win(config, plan):
    """The warning's numbers, straight from the planner."""
    _, estimate = estimate_config(config, plan, 1)
    workload = replace(plan.workload, offload_ratio=None, zero_stage="auto", offload_optimizer="auto")
    partial = partial_offload_candidate(Inputs(plan.model, plan.host, workload, plan.rates, 1, 1, plan.alloc_conf))
    own = estimate_candidate(Inputs(plan.model, plan.host, workload, plan.rates, 1, 1), plan.chosen.strategy)
    return estimate, partial, own


@pytest.mark.parametrize("stage", ["2", "3"])
def test_a_full_offload_that_leaves_a_partial_offloads_win_unused(llama7b, a100, stage):
    pins = {"offload_ratio": 1.0} if stage == "3" else {}
    plan = make_plan(llama7b, a100, Workload(zero_stage=stage, offload_optimizer="cpu", **pins), resolve_rates(a100))
    config = dsconfig.render(plan)
    estimate, partial, own = expected_win(config, plan)
    usable = usable_gpu_bytes(a100)
    faster, slower = partial.timing.expected_seconds, own.timing.expected_seconds
    finding = only(lint.lint(config, plan, 1), lint_partial.OFFLOAD_OPTIMIZER)
    assert finding.level == "warning"
    assert finding.message == (
        f"a full offload leaves the GPU {fmt_bytes(usable - estimate.gpu_bytes_per_device)} idle: ZeRO-3 with "
        f"offload_optimizer.ratio {partial.strategy.offload_ratio:g} and sub_group_size "
        f"{partial.buckets.sub_group_size} (the ratio splits whole sub-groups) fits "
        f"({fmt_bytes(partial.memory.gpu_bytes_per_device)} of {fmt_bytes(usable)} usable) and is predicted "
        f"{slower / faster:.2f}x faster ({faster:.3g} vs {slower:.3g} s/step)"
    )
    # Llama-2-7B on one A100 80GB: about half the optimizer fits on the GPU, about 1.4-1.6x faster
    assert 0.3 < partial.strategy.offload_ratio < 0.7 and 1.3 < slower / faster < 1.8
    assert partial.memory.gpu_bytes_per_device <= usable and "GiB idle" in finding.message
    assert lint.lint(config, None, 1) == []  # without a plan: nothing to compare


def test_no_unused_gpu_warning_without_room_or_without_a_gpu(llama7b, cpu_host_plan):
    rtx = load_host_spec(host_path("1x-rtx4090-24g-192g"))
    plan = make_plan(llama7b, rtx, Workload(), resolve_rates(rtx))
    assert plan.chosen.strategy.label == "ZeRO-2 + opt->cpu"  # the planner's own pick: a partial offload is slower
    assert lint.lint(dsconfig.render(plan), plan, 1) == []
    # ZeRO-3: one of 19 sub-groups fits next to it (predicted ~3 % faster): no obvious win
    full3 = make_plan(
        llama7b, rtx, Workload(zero_stage="3", offload_optimizer="cpu", offload_ratio=1.0), resolve_rates(rtx)
    )
    config = dsconfig.render(full3)
    _, partial, own = expected_win(config, full3)
    assert (
        partial is not None
        and own.timing.expected_seconds < lint_partial.PARTIAL_OFFLOAD_WIN * partial.timing.expected_seconds
    )
    assert lint.lint(config, full3, 1) == []
    assert lint.lint(dsconfig.render(cpu_host_plan), cpu_host_plan, 1) == []  # the CPU accelerator


# ------------------------------------------------------------------------------------------ the schema


def every_key(stage3):
    """A ZeRO-3 config with every offload-mode key DeepSpeed accepts together, set to a valid value."""
    config = copy.deepcopy(stage3)
    config["zero_optimization"]["offload_optimizer"] |= {
        "ratio": 0.5,
        "pipeline_read": False,
        "pipeline_write": False,
        "fast_init": False,
        "super_offload": True,
        "cpuadam_cores_perc": 0.8,
    }
    config["bf16"] |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    return config


ZENFLOW_BLOCK = {
    "topk_ratio": 0.1,
    "select_strategy": "step",
    "select_interval": 4,
    "update_interval": 4,
    "overlap_step": True,
    "offload": False,
    "auto_ratio": 0.99,
    "full_warm_up_rounds": 0,
    "pt_reserved_cores_perc": 1,  # an int: pydantic makes it 1.0 before ZenFlowConfig's float check
}


SCHEMA_TYPES = {bool: "boolean", float: "number", int: "integer"}
BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


@pytest.mark.parametrize(
    ("module", "model", "definition"),
    [
        ("deepspeed.runtime.zero.offload_config", "DeepSpeedZeroOffloadOptimizerConfig", "offloadOptimizer"),
        ("deepspeed.runtime.zenflow.zenflow_config", "ZenFlowConfig", "zenflow"),
        ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config", "bf16"),
    ],
)
def test_the_schema_has_deepspeeds_fields_types_and_bounds(module, model, definition):
    import importlib

    fields = getattr(importlib.import_module(module), model).model_fields
    schema = dsconfig._schema_validator().schema["$defs"][definition]["properties"]
    assert set(schema) == set(fields)
    for name, field in fields.items():
        node = schema[name]
        if field.annotation in SCHEMA_TYPES:
            branches = node.get("anyOf", [node])
            assert any(b.get("type") == SCHEMA_TYPES[field.annotation] for b in branches), name
        if "default" in node:
            assert node["default"] == field.default, name
        for bound in field.metadata:
            [kind] = [k for k in BOUNDS if hasattr(bound, k)]
            value = getattr(bound, kind)
            assert node[BOUNDS[kind]] == value, (name, kind)


def test_configs_with_every_key_validate(stage3, zenflow):
    config = every_key(stage3)
    dsconfig.validate(config, 1)  # the JSON Schema and DeepSpeed's own models
    assert lint.lint(config, None, 1) == []
    zenflow["zero_optimization"]["zenflow"] = dict(ZENFLOW_BLOCK)
    dsconfig.validate(zenflow, 1)
    assert lint.lint(zenflow, None, 1) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("zero_optimization.offload_optimizer.ratio", "half"),
        ("zero_optimization.offload_optimizer.ratio", 1.5),
        ("zero_optimization.offload_optimizer.ratio", -0.1),
        ("zero_optimization.offload_optimizer.super_offload", "maybe"),
        ("zero_optimization.offload_optimizer.cpuadam_cores_perc", 2),
        ("zero_optimization.offload_optimizer.pipeline_read", 2),
        ("zero_optimization.offload_optimizer.pipeline_write", "often"),
        ("zero_optimization.offload_optimizer.fast_init", None),
        ("bf16.bf16_master_weights_and_grads", "sure"),
        ("bf16.bf16_optimizer_states", 2),
        ("zero_optimization.zenflow", "on"),
        ("zero_optimization.zenflow.topk_ratio", 1),
        ("zero_optimization.zenflow.select_strategy", "steps"),
        ("zero_optimization.zenflow.select_interval", "sometimes"),
        ("zero_optimization.zenflow.update_interval", 0),
        ("zero_optimization.zenflow.overlap_step", "yes please"),
        ("zero_optimization.zenflow.offload", [1]),
        ("zero_optimization.zenflow.auto_ratio", 1.5),
        ("zero_optimization.zenflow.full_warm_up_rounds", 1.5),
        ("zero_optimization.zenflow.pt_reserved_cores_perc", "half"),
    ],
)
def test_a_wrong_type_or_bound_is_one_finding(stage3, zenflow, path, value):
    if path.startswith(ZENFLOW):  # ZenFlow builds ZenFlowCPUAdam: no partial offload, no bf16 master weights
        config = zenflow
        config["zero_optimization"]["zenflow"] = dict(ZENFLOW_BLOCK)
    else:
        config = every_key(stage3)
    assert lint.lint(config, None, 1) == []
    *parents, key = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[key] = value
    findings = lint.lint(config, None, 1)
    assert only(findings, path).level == "error" and len(errors(findings)) == 1, [str(f) for f in findings]


@pytest.mark.parametrize(
    ("path", "value", "read"),
    [
        ("zero_optimization.offload_optimizer.ratio", "0.5", 0.5),
        ("zero_optimization.offload_optimizer.super_offload", "true", True),
        ("zero_optimization.offload_optimizer.pipeline_read", 1, True),
        ("zero_optimization.offload_optimizer.pipeline_write", "yes", True),
        ("bf16.bf16_master_weights_and_grads", "true", True),
        ("bf16.bf16_optimizer_states", 1, True),
        ("zero_optimization.zenflow.overlap_step", "yes", True),
        ("zero_optimization.zenflow.offload", 0, False),
    ],
)
def test_a_value_the_config_model_converts_is_a_note_and_judged_as_read(stage3, zenflow, path, value, read):
    # DeepSpeed's pydantic models parse in lax mode (runtime/config_utils.py DeepSpeedConfigModel): they accept
    # these and read them as `read`, so the lint's rules judge the value DeepSpeed reads (reads.py)
    if path.startswith(ZENFLOW):
        config = zenflow
        config["zero_optimization"]["zenflow"] = dict(ZENFLOW_BLOCK)
    else:
        config = every_key(stage3)
    *parents, key = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[key] = value
    node[key] = read
    expected = lint.lint(config, None, 1)
    node[key] = value
    findings = lint.lint(config, None, 1)
    note = only(findings, path)
    assert note.level == "note"
    assert note.message.startswith(f"DeepSpeed reads {json.dumps(value)} as {json.dumps(read)}")
    assert [f for f in findings if f is not note and f.path != path] == [f for f in expected if f.path != path]


# ------------------------------------------------------------------------------------------ offload-launch check


def run_check(tmp_path, config, host="1x-a100-80g", model="meta-llama/Llama-2-7b"):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    args = ["check", str(path), "--model", model, "--host-spec", host_path(host), "--json"]
    result = CliRunner().invoke(cli, args)
    report, _ = json.JSONDecoder().raw_decode(result.output)  # then, with errors, the one-line refusal
    return result.exit_code, report


BASE = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
}


@pytest.mark.parametrize(
    "extra",
    [
        {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
        {
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
        },
        {
            "zero_optimization": {"stage": 2},
            "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
        },
        {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": True}}},
        {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "zenflow": ZENFLOW_BLOCK}},
    ],
    ids=["partial-offload", "bf16-states-offloaded", "bf16-states-on-gpu", "super-offload", "zenflow"],
)
def test_check_passes_each_mode_used_as_deepspeed_allows(tmp_path, extra):
    # DeepSpeed's own parse included; states on the GPU: a model whose ZeRO-2 fits an A100 without offload
    model = "Qwen/Qwen2.5-0.5B" if "offload_optimizer" not in extra["zero_optimization"] else "meta-llama/Llama-2-7b"
    code, report = run_check(tmp_path, BASE | extra, model=model)
    assert code == 0 and report["errors"] == 0, report["findings"]


def test_check_reports_the_modes_deepspeed_refuses(tmp_path):
    config = BASE | {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}, "zenflow": {}},
        "bf16": {"enabled": True, "bf16_optimizer_states": True},
    }
    code, report = run_check(tmp_path, config)
    assert code == 2 and report["errors"] == 2
    assert {f["path"] for f in report["findings"] if f["level"] == "error"} == {RATIO, STATES}


def test_check_says_a_full_offload_leaves_the_gpu_idle(tmp_path):
    config = BASE | {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    code, report = run_check(tmp_path, config)
    assert code == 0 and report["errors"] == 0
    [finding] = report["findings"]
    assert finding["path"] == lint_partial.OFFLOAD_OPTIMIZER and finding["message"].startswith(
        "a full offload leaves the GPU"
    )
    code, report = run_check(tmp_path, config, "1x-rtx4090-24g-192g")
    assert code == 0 and report["findings"] == []


def test_ds_config_refuses_a_mode_deepspeed_refuses_in_one_line(tmp_path):
    path = tmp_path / "ds.json"
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}
    path.write_text(json.dumps(BASE | {"zero_optimization": zero}))
    args = ["--model", "meta-llama/Llama-2-7b", "--host-spec", host_path("1x-a100-80g"), "--ds-config", str(path)]
    result = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert result.exit_code == 2
    assert f"Error: --ds-config: {RATIO}: 0.5 < 1 is a partial offload" in result.output


@pytest.mark.parametrize(
    ("read", "write", "count", "needed"), [(True, True, 4, 12), (True, False, 4, 8), (True, True, 12, 0)]
)
def test_pipelined_nvme_swaps_need_buffers_for_every_sub_group_in_flight(read, write, count, needed):
    config = {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {
                "device": "nvme",
                "nvme_path": "/nvme/run",
                "buffer_count": count,
                "pipeline_read": read,
                "pipeline_write": write,
            },
        },
        "train_micro_batch_size_per_gpu": 1,
    }
    found = [f for f in lint.lint(config, None, 1, deepspeed=False) if f.path.endswith("buffer_count")]
    if needed:
        assert len(found) == 1 and f"use at least {needed}" in found[0].message
    else:
        assert found == []
