"""Merging a user's ds_config over the generated one: "auto" filled from the plan, the user's values win,
missing batch keys added consistently."""

from __future__ import annotations

import pytest

from launcher.config import dsconfig, lint, merge
from launcher.config.keys import BATCH_KEYS
from launcher.errors import UserInputError
from launcher.plan.planner import Workload, make_plan

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
    plan = make_plan(llama7b, a100, Workload(**pinned, micro_batch=2, grad_accum=4))
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
    generated = dsconfig.render(make_plan(llama7b, a100, Workload(micro_batch=2, grad_accum=4)))
    merged = merge.merge_user_config(user, generated)
    assert tuple(merged[key] for key in BATCH_KEYS) == expected
