"""The linter on a LoRA run's ds_config (launcher/config/lint_adapters.py), one test per rule, and the offloaded
optimizer that is not DeepSpeedCPUAdam; the configs offload-launch writes for a LoRA are clean of them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.config import dsconfig, lint
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from tests.helpers import host_path, only

THRESHOLD = "zero_optimization.stage3_param_persistence_threshold"


@pytest.fixture(scope="module")
def lora_plan(llama7b, a100):
    """Llama-2-7B with a rank-16 LoRA on q_proj, v_proj: lora_A 16 x 4096 = 65,536 elements, as is lora_B."""
    return make_plan(llama7b, a100, Workload(lora=True, lora_rank=16, zero_stage="3"), resolve_rates(a100))


def config(stage: int, **zero) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-4}},
        "zero_optimization": {"stage": stage, **zero},
    }


def test_a_threshold_that_partitions_the_adapter_warns_with_peft_s_empty_save(lora_plan):
    finding = only(
        lint.lint(config(3, stage3_param_persistence_threshold=40960), lora_plan, 1, deepspeed=False), THRESHOLD
    )
    assert finding.level == "warning"
    assert "128 of the adapter's 128 tensors (up to 65,536 elements) are above 40,960" in finding.message
    assert "GatheredParameters" in finding.message and "at least 65,536" in finding.message
    # DeepSpeed's default, 1e5, keeps them whole: nothing to say
    assert not [f for f in lint.lint(config(3), lora_plan, 1, deepspeed=False) if f.path == THRESHOLD]


def test_offloading_the_optimizer_at_zero_2_notes_what_it_cannot_move(lora_plan):
    findings = lint.lint(config(2, offload_optimizer={"device": "cpu"}), lora_plan, 1, deepspeed=False)
    note = only(findings, "zero_optimization.offload_optimizer.device")
    assert note.level == "note" and "adapter's states (128.0 MiB" in note.message
    assert "whole frozen base (12.6 GiB) on every GPU" in note.message


def test_torch_adam_with_the_optimizer_offloaded_is_not_cpu_adam(plan7b):
    """engine.py get_optimizer_configuration: torch_adam wins over DeepSpeedCPUAdam, for any method."""
    bad = config(2, offload_optimizer={"device": "cpu"})
    bad["optimizer"]["params"]["torch_adam"] = True
    finding = only(lint.lint(bad, plan7b, 1, deepspeed=False), "optimizer.params.torch_adam")
    assert finding.level == "warning" and "DeepSpeedCPUAdam" in finding.message
    del bad["zero_optimization"]["offload_optimizer"]  # on the GPU, torch's fused AdamW is what the plan asks for
    assert not [f for f in lint.lint(bad, plan7b, 1, deepspeed=False) if f.path == "optimizer.params.torch_adam"]


def test_the_configs_offload_launch_writes_for_a_lora_are_clean(lora_plan, llama7b, a100):
    for workload in (Workload(lora=True, lora_rank=16, zero_stage="3"), Workload(lora=True)):
        plan = make_plan(llama7b, a100, workload, resolve_rates(a100))
        rendered = dsconfig.render(plan)
        assert [f for f in lint.lint(rendered, plan, 1, deepspeed=False) if f.level != "note"] == []


def test_check_takes_lora(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(__import__("json").dumps(config(3, stage3_param_persistence_threshold=1000)))
    args = ["check", str(path), "--model", "meta-llama/Llama-2-7b", "--host-spec", host_path("1x-a100-80g")]
    result = CliRunner().invoke(cli, [*args, "--lora", "--lora-rank", "16"])
    assert result.exit_code == 0 and "stage3_param_persistence_threshold" in result.output, result.output
    assert "stage3_param_persistence_threshold" not in CliRunner().invoke(cli, args).output
