"""Fixtures the config tests share: Llama-2-7B planned on one A100 80GB, and the ds_config that plan renders."""

from __future__ import annotations

import pytest

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


@pytest.fixture(scope="module")
def a100():
    return load_host_spec(host_path("1x-a100-80g"))


@pytest.fixture(scope="module")
def plan7b(llama7b, a100):
    # ZeRO-2 + opt->cpu: the config tests' stage-2 shape (left to itself the plan keeps part of the optimizer on
    # the GPU with ZeRO-3, tests/plan/test_partial_offload.py)
    return make_plan(llama7b, a100, Workload(zero_stage="2", offload_optimizer="cpu"), resolve_rates(a100))


@pytest.fixture
def good(plan7b):
    return dsconfig.render(plan7b)
