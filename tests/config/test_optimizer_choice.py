"""Which optimizer DeepSpeed builds from the rendered ds_config: on a GPU without optimizer offload, torch's
fused AdamW (`torch_adam` + `fused`), so no CUDA toolkit is needed to compile FusedAdam (issue 13, item 2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from launcher.config import dsconfig
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from tests.helpers import host_path


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def rendered(model, host: str, **workload) -> dict:
    plan = make_plan(model, (h := load_host_spec(host_path(host))), Workload(**workload), resolve_rates(h))
    config = dsconfig.render(plan)
    dsconfig.validate(config, plan.world_size)
    return config


def test_gpu_without_optimizer_offload_asks_for_torch_fused_adamw(llama7b):
    params = rendered(llama7b, "8x-a100-80g")["optimizer"]["params"]
    assert params["torch_adam"] is True and params["fused"] is True


@pytest.mark.parametrize(
    ("host", "workload"),
    [("1x-rtx4090-24g", {}), ("8x-a100-80g", {"offload_optimizer": "cpu"}), ("cpu-only", {"offload_optimizer": "cpu"})],
    ids=["gpu-offload", "gpu-forced-offload", "cpu-accelerator-offload"],
)
def test_optimizer_offload_keeps_deepspeeds_cpu_adam(llama7b, host, workload):
    model = llama7b if host != "cpu-only" else inspect_model("gpt2")
    params = rendered(model, host, **workload)["optimizer"]["params"]
    assert "torch_adam" not in params and "fused" not in params


def test_the_cpu_accelerator_without_offload_asks_for_torch_fused_adamw_too():
    """DeepSpeed's FusedAdam there is a C++ build ~10x slower than torch's fused AdamW on the CPU (make bench)."""
    params = rendered(inspect_model("gpt2"), "cpu-only", offload_optimizer="none")["optimizer"]["params"]
    assert params["torch_adam"] is True and params["fused"] is True


def test_deepspeed_builds_torch_adamw_with_fused_from_those_params(llama7b):
    """DeepSpeed's own code path (engine.py get_optimizer_configuration + _configure_basic_optimizer's
    constructor call), run here on CPU tensors (torch's fused AdamW supports CPU too)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    params = dict(rendered(llama7b, "8x-a100-80g")["optimizer"]["params"])
    engine = SimpleNamespace(zero_use_cpu_optimizer=lambda: False)
    cls, kwargs = DeepSpeedEngine.get_optimizer_configuration(engine, params, True)
    assert cls is torch.optim.AdamW and "torch_adam" not in params
    optimizer = cls([torch.nn.Parameter(torch.ones(4))], **params, **kwargs)
    assert optimizer.defaults["fused"] is True


def test_parameters_offloaded_with_the_optimizer_on_the_gpu_is_a_pinnable_valid_config(llama7b):
    """ZeRO-3 with only the parameters on CPU (issue 14): a candidate the planner sizes and times, and a ds_config
    DeepSpeed's own models accept, with the optimizer left on the GPU (torch's fused AdamW)."""
    config = rendered(llama7b, "8x-a100-80g", zero_stage="3", offload_optimizer="none", offload_param="cpu")
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu" and "offload_optimizer" not in zero
    assert config["optimizer"]["params"]["torch_adam"] is True
