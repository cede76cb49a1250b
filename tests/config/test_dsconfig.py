"""Every rendered ds_config passes both validators; the validators catch what users get wrong."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from launcher.config import dsconfig
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan.planner import CANDIDATE_ORDER, make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from tests.helpers import host_path


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def forced(strategy) -> dict:
    return dict(
        zero_stage=str(strategy.zero_stage),
        offload_optimizer=strategy.offload_optimizer,
        offload_param=strategy.offload_param,
    )


@pytest.mark.parametrize("strategy", CANDIDATE_ORDER, ids=lambda s: s.label)
@pytest.mark.parametrize("host", ["8x-h100-80g", "2x-rtx4090-24g"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_every_template_combination_passes_both_validators(llama7b, strategy, host, precision):
    workload = Workload(precision=precision, micro_batch=2, grad_accum=4, **forced(strategy))
    # render every strategy, whether or not it fits: a generated config that fails validation is a bug
    plan = make_plan(llama7b, (hw := load_host_spec(host_path(host))), workload, resolve_rates(hw))
    candidate = next(c for c in plan.candidates if c.strategy == strategy)
    plan = replace(plan, chosen=replace(candidate, problems=()))
    config = dsconfig.render(plan)
    dsconfig.validate(config, plan.world_size)
    zero = config["zero_optimization"]
    assert zero["stage"] == strategy.zero_stage
    assert config["train_batch_size"] == 2 * 4 * plan.world_size
    other = "fp16" if precision == "bf16" else "bf16"
    assert config[precision]["enabled"] is True and other not in config
    assert config["optimizer"]["type"] == "AdamW"  # so DeepSpeed builds DeepSpeedCPUAdam when offloading
    assert all(isinstance(v, int) for k, v in zero.items() if k.endswith(("_size", "_threshold")))
    if strategy.offload_optimizer != "none":
        assert zero["offload_optimizer"]["device"] == strategy.offload_optimizer
    if strategy.offload_param == "nvme":
        assert zero["offload_param"]["buffer_size"] >= llama7b.largest_param_numel // plan.world_size
        assert zero["offload_param"]["nvme_path"] == plan.host.nvme.path
    if "nvme" in (strategy.offload_optimizer, strategy.offload_param):
        assert set(config["aio"]) == {
            "block_size",
            "queue_depth",
            "intra_op_parallelism",
            "single_submit",
            "overlap_events",
            "use_gds",
        }
    else:
        assert "aio" not in config


def test_hf_auto_conventions_for_buckets(llama7b):
    plan = make_plan(llama7b, (hw := load_host_spec(host_path("4x-a100-40g"))), Workload(), resolve_rates(hw))
    zero = dsconfig.render(plan)["zero_optimization"]
    h = 4096
    assert zero["reduce_bucket_size"] == h * h
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * h * h)
    assert zero["stage3_param_persistence_threshold"] == 10 * h


def test_cpu_only_host_config_passes(tiny_llama_dir):
    plan = make_plan(
        inspect_model(str(tiny_llama_dir)),
        (hw := load_host_spec(host_path("cpu-only"))),
        Workload(zero_stage="3", offload_optimizer="cpu", offload_param="cpu"),
        resolve_rates(hw),
    )
    config = dsconfig.render(plan)
    dsconfig.validate(config, 1)
    assert config["bf16"]["enabled"] and config["zero_optimization"]["offload_optimizer"]["pin_memory"] is False


@pytest.fixture
def good_config(llama7b):
    """A ZeRO-2 CPU-offload config: 7B on one 24 GB GPU with 192 GB RAM (on 128 GB the optimizer no longer fits
    in CPU RAM and goes to NVMe under ZeRO-3, where the partial-offload `ratio` below would be allowed)."""
    plan = make_plan(llama7b, (hw := load_host_spec(host_path("1x-rtx4090-24g-192g"))), Workload(), resolve_rates(hw))
    assert plan.chosen.strategy.label == "ZeRO-2 + opt->cpu"
    return dsconfig.render(plan)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.update(zero_optimisation=c.pop("zero_optimization")), "zero_optimisation"),
        (lambda c: c["zero_optimization"].update(reduce_bucket_size=5e8), "reduce_bucket_size"),
        (lambda c: c.update(aio={"thread_count": 4}), "thread_count"),
        (lambda c: c["zero_optimization"]["offload_optimizer"].update(device="gpu"), "device"),
        (lambda c: c["zero_optimization"].update(stage=4), "stage"),
        (lambda c: c.update(train_batch_size=3), "train_batch_size 3 != micro 1 x accumulation 1 x world 1"),
    ],
)
def test_validators_reject_common_mistakes(good_config, mutate, message):
    config = copy.deepcopy(good_config)
    mutate(config)
    with pytest.raises(dsconfig.InvalidDsConfig, match=message):
        dsconfig.validate(config, 1)


def test_deepspeed_models_are_the_second_gate(good_config):
    # The schema allows what DeepSpeed's pydantic models then reject: DeepSpeed gets the last word.
    config = copy.deepcopy(good_config)
    config["zero_optimization"]["offload_optimizer"]["ratio"] = 0.5  # partial offload needs ZeRO-3
    errors = dsconfig.schema_errors(config) + dsconfig.deepspeed_errors(config)
    assert errors


def test_knob_table_names_real_deepspeed_keys(good_config):
    top_level = set(dsconfig._schema_validator().schema["properties"])
    for key in dsconfig.KNOB_TO_DS_KEY.values():
        assert key.split(".")[0] in top_level
