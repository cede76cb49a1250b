"""Merging a user's ds_config over the generated one: "auto" filled from the plan, the user's values win,
missing batch keys added consistently."""

from __future__ import annotations

import pytest

from launcher.config import dsconfig, lint, merge
from launcher.config.keys import BATCH_KEYS
from launcher.errors import UserInputError
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload

HF_STYLE = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "reduce_bucket_size": 123456,  # the user's number
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
}


def test_merge_fills_auto_and_the_user_wins(llama7b, a100):
    pinned = {"zero_stage": "3", "offload_optimizer": "cpu", "offload_param": "none"}  # ZeRO-3 + opt->cpu
    plan = make_plan(llama7b, a100, Workload(**pinned, micro_batch=2, grad_accum=4), resolve_rates(a100))
    generated = dsconfig.render(plan)
    merged = merge.merge_user_config(HF_STYLE, generated)
    zero = merged["zero_optimization"]
    assert zero["reduce_bucket_size"] == 123456  # user wins
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 4096 * 4096)  # auto filled from the plan
    assert merged["train_batch_size"] == 8 and merged["train_micro_batch_size_per_gpu"] == 2
    assert merged["optimizer"]["params"]["lr"] == plan.workload.lr
    assert merged["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert merged["bf16"] == {"enabled": True} and merged["fp16"] == {"enabled": False}  # plan has no fp16
    assert "scheduler" not in merged and "steps_per_print" not in merged  # nothing else added
    assert "pin_memory" not in zero["offload_optimizer"]
    # no errors; its full ZeRO-3 offload leaves most of the A100 idle, which the lint says (a partial offload)
    findings = lint.lint(merged, plan, plan.world_size)
    assert [f.path for f in findings] == ["zero_optimization.offload_optimizer"]
    assert findings[0].level == "warning" and "offload_optimizer.ratio" in findings[0].message
    assert HF_STYLE["train_batch_size"] == "auto"  # inputs untouched


def test_merge_auto_without_a_generated_value_names_every_path(good):
    user = {"zero_optimization": {"stage": 3, "offload_param": {"buffer_size": "auto"}}, "aio": {"block_size": "auto"}}
    with pytest.raises(UserInputError, match=r"'auto' at zero_optimization.offload_param.buffer_size, aio.block_size"):
        merge.merge_user_config(user, good)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ({}, (8, 2, 4)),  # none set: the plan's three
        ({"train_micro_batch_size_per_gpu": 4}, (16, 4, 4)),  # the plan's accumulation, the user's micro
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}, (32, 2, 16)),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 8}, (32, 4, 8)),
    ],
)
def test_merge_adds_missing_batch_keys_consistently(llama7b, a100, user, expected):
    generated = dsconfig.render(make_plan(llama7b, a100, Workload(micro_batch=2, grad_accum=4), resolve_rates(a100)))
    merged = merge.merge_user_config(user, generated)
    assert tuple(merged[key] for key in BATCH_KEYS) == expected


# ------------------------------------------------------------------------------------------ as DeepSpeed reads it


def test_merge_writes_floats_as_the_integers_deepspeed_reads(good):
    # DeepSpeedZeroConfig reads 1e9 as 1000000000 (reads.py); the merged config says so, and the schema takes it
    user = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8}}
    merged = merge.merge_user_config(user, good)
    zero = merged["zero_optimization"]
    assert zero["reduce_bucket_size"] == 500_000_000 and type(zero["reduce_bucket_size"]) is int
    assert type(zero["allgather_bucket_size"]) is int and dsconfig.schema_errors(merged) == []
    assert type(user["zero_optimization"]["reduce_bucket_size"]) is float  # the user's dict untouched


def test_an_auto_precision_left_off_gets_the_plans_section(good):
    # the Hugging Face docs' configs set only fp16.enabled "auto": on a bf16 plan it is false, and without a bf16
    # section DeepSpeed would train in fp32 (precision_config: both default to disabled)
    merged = merge.merge_user_config({"fp16": {"enabled": "auto", "loss_scale": 0}}, good)
    assert merged["fp16"] == {"enabled": False, "loss_scale": 0} and merged["bf16"] == good["bf16"]
    # set by the user, the precision is theirs
    merged = merge.merge_user_config({"fp16": {"enabled": "auto"}, "bf16": {"enabled": False}}, good)
    assert merged["bf16"] == {"enabled": False}
    assert "bf16" not in merge.merge_user_config({"fp16": {"enabled": False}}, good)


@pytest.mark.parametrize(
    ("zero", "expected"),
    [
        # DeepSpeed runs no parameter offload below ZeRO-3 (lint: a warning), and "nvme" optimizer states in RAM
        ({"stage": 2, "offload_param": {"device": "cpu"}}, {"offload_optimizer": "none", "offload_param": "none"}),
        (
            {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}},
            {"offload_optimizer": "cpu", "offload_param": "none"},
        ),
        # an absent section is DeepSpeed's default, no offload; "3.0" is stage 3 to DeepSpeedZeroConfig
        ({"stage": 3.0}, {"zero_stage": "3", "offload_optimizer": "none", "offload_param": "none"}),
        ({"stage": 3, "offload_optimizer": {"device": "auto"}}, {"offload_param": "none"}),  # the plan's choice
        (
            {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}},
            {"offload_optimizer": "none", "offload_param": "nvme", "nvme_path": "/nvme"},
        ),
    ],
)
def test_pins_are_what_deepspeed_runs(zero, expected):
    pins = merge.pins_from_config({"zero_optimization": zero})
    assert pins == {"zero_stage": str(int(zero["stage"]))} | expected


def test_the_old_bfloat16_name_pins_bf16():
    # precision_config.get_bfloat16_config reads 'bfloat16' when 'bf16' is absent (DeepSpeed-Chat writes it)
    assert merge.pins_from_config({"bfloat16": {"enabled": True}})["precision"] == "bf16"
    assert "precision" not in merge.pins_from_config({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}})


def test_a_key_deepspeed_ignores_is_a_warning_and_the_run_goes_on(tmp_path):
    from launcher.config.final import UserConfig, final_config
    from launcher.inspection.hostspec import load_host_spec
    from launcher.inspection.model import inspect_model
    from tests.helpers import host_path

    plan = make_plan(
        inspect_model("launcher/demo/tiny-llama"),
        (h := load_host_spec(host_path("1x-rtx4090-24g"))),
        Workload(zero_stage="3"),
        resolve_rates(h),
    )
    user = {
        "zero_optimization": {"stage": 3, "sub_group_size": 1e9},
        "comms_config": {"enabled": True},  # DeepSpeedConfig's attribute name; the key is comms_logger
        "aio": {"thread_count": 2},
    }
    final = final_config(plan, UserConfig("mine.json", user))
    assert final.config["comms_config"] == {"enabled": True}  # kept: the config stays the user's
    assert final.config["zero_optimization"]["sub_group_size"] == 1_000_000_000
    assert [w.split(": ")[1] for w in final.warnings] == ["warning", "warning"]
    assert any("comms_config" in w and "the key it reads is comms_logger" in w for w in final.warnings)
    assert not any("sub_group_size" in w for w in final.warnings)  # a note is check's, not the run's
    with pytest.raises(dsconfig.InvalidDsConfig, match="comms_config"):  # the schema alone refuses it
        dsconfig.validate(final.config, plan.world_size)


def test_a_user_configs_buffer_sizes_are_the_ones_the_plan_sizes_memory_with(tmp_path):
    """bucket_pins: LLaMA-Factory's ds_z2_config.json sets 5e8-element buckets without overlap; the plan's GPU
    estimate counts them (2 x 5e8 x 2 B = 2 GB), not its own h² buckets, and the merged config keeps them."""
    import json

    from launcher import settings
    from launcher.config.merge import bucket_pins
    from launcher.job.planning import build_plan
    from tests.helpers import host_path

    zero = {"stage": 2, "allgather_bucket_size": 5e8, "overlap_comm": False, "reduce_bucket_size": 5e8}
    zero |= {"stage3_prefetch_bucket_size": "auto"}
    assert bucket_pins({"zero_optimization": zero}) == {
        "reduce_bucket_size": 500_000_000,
        "allgather_bucket_size": 500_000_000,
        "overlap_comm": False,
    }
    path = tmp_path / "ds_z2_config.json"
    path.write_text(json.dumps({"zero_optimization": zero}))
    typed = {"model": "meta-llama/Llama-2-7b-hf", "host_spec": host_path("8x-a100-80g"), "zero_stage": "2"}
    own = build_plan(settings.layer(typed)).chosen.memory.gpu_terms["comm buckets"]
    theirs = build_plan(settings.layer({**typed, "ds_config": str(path)}))
    assert theirs.chosen.memory.gpu_terms["comm buckets"] == 2 * 500_000_000 * 2 > own  # own: 4.5 x overlapped h²
    assert theirs.chosen.buckets.reduce_bucket_size == 500_000_000 and not theirs.chosen.buckets.overlap_comm
