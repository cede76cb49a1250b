"""DeepSpeed's newer offload modes beside the partial offload (tests/plan/test_partial_offload.py): 16-bit optimizer
states, ZenFlow, NVMe pipelining, activation offload and SuperOffload on superchips - what each costs and saves,
the config written for each, and the features gate on the installed DeepSpeed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from launcher.config import dsconfig
from launcher.config.keys import strategy_of
from launcher.config.merge import pins_from_config
from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import features, timing
from launcher.plan.candidates import Inputs, estimate_candidate
from launcher.plan.compute import cpu_adam_seconds, device_optimizer_seconds
from launcher.plan.framework import STEP_FIXED_SECONDS
from launcher.plan.planner import make_plan
from launcher.plan.rates import Rates, resolve_rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import Strategy
from launcher.plan.workload import Workload
from tests.helpers import host_path


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def plan_for(model, name, **workload):
    path = str(name) if isinstance(name, Path) else host_path(name)
    return make_plan(model, (h := load_host_spec(path)), Workload(**workload), resolve_rates(h))


@pytest.fixture(scope="module")
def workstation_96g(tmp_path_factory) -> Path:
    """The 1x RTX 4090 workstation with 96 GiB of RAM: 7B's fp32 optimizer states (ZeRO-3 + opt->cpu peaks at 119 GiB)
    fit only on NVMe; its 128 GiB hold them (peaks.py, capacity.usable_cpu_bytes)."""
    text = Path(host_path("1x-rtx4090-24g")).read_text().replace("cpu_memory: 128GiB", "cpu_memory: 96GiB")
    path = tmp_path_factory.mktemp("hosts") / "1x-rtx4090-24g-96g.yaml"
    path.write_text(text)
    return path


def candidate(model, name, strategy, **workload):
    plan = plan_for(model, name, **workload)
    return estimate_candidate(Inputs(model, plan.host, plan.workload, plan.rates, 1, 1), strategy)


# ------------------------------------------------------------------------------------------ bf16 states


def test_bf16_states_hold_6_plus_2_bytes_per_param_on_the_cpu(llama7b):
    fp32 = candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(2, "cpu"))
    bf16 = candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(2, "cpu", optimizer_states="bf16"))
    p = llama7b.params
    assert fp32.memory.cpu_terms["fp32 optimizer states"] == 12 * p
    assert bf16.memory.cpu_terms["bf16 optimizer states"] == 6 * p  # master, m, v: 2 B each
    assert bf16.memory.cpu_terms["bf16 gradient partition"] == 2 * p
    assert fp32.memory.cpu_bytes - bf16.memory.cpu_bytes >= 8 * p
    assert bf16.memory.gpu_bytes_per_device == fp32.memory.gpu_bytes_per_device  # nothing changes on the GPU
    # CPU-Adam streams half the bytes (timing [bf16-states]); measured here with DeepSpeedCPUAdam: 0.82 ns/param
    # with bf16 states against 1.93 with fp32 ones
    assert bf16.timing.cpu_adam_seconds_per_step == pytest.approx(fp32.timing.cpu_adam_seconds_per_step / 2)
    assert bf16.timing.host_copy_seconds_per_step < fp32.timing.host_copy_seconds_per_step
    assert bf16.strategy.label == "ZeRO-2 + opt->cpu (bf16 states)"


def test_bf16_states_are_opt_in_and_the_plan_says_when_only_they_fit(llama7b, workstation_96g):
    plan = plan_for(llama7b, workstation_96g)  # 96 GiB of RAM: fp32 states only fit on NVMe
    assert plan.chosen.strategy.offload_optimizer == "nvme" and plan.chosen.strategy.optimizer_states == "fp32"
    hint = next(r for r in plan.reasons if r.startswith("with --optimizer-states bf16"))
    assert "ZeRO-2 + opt->cpu would fit" in hint and "x faster" in hint
    assert plan.states_hint == hint
    asked = plan_for(llama7b, workstation_96g, optimizer_states="bf16")
    assert asked.chosen.strategy == Strategy(2, "cpu", optimizer_states="bf16")
    assert all(c.strategy.optimizer_states == "bf16" for c in asked.candidates)
    config = dsconfig.render(asked)
    assert config["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    dsconfig.validate(config, 1)  # the JSON Schema and DeepSpeed's own models
    assert strategy_of(config) == asked.chosen.strategy
    assert pins_from_config(config)["optimizer_states"] == "bf16"
    roomy = plan_for(llama7b, "1x-rtx4090-24g-192g")  # fp32 states fit in RAM: nothing to say
    assert roomy.states_hint is None


def test_nothing_fits_names_what_bf16_states_would_fit(llama7b, workstation_96g):
    from launcher.plan.fit import does_not_fit

    plan = plan_for(llama7b, workstation_96g, offload_optimizer="cpu")
    assert plan.chosen is None
    message = str(does_not_fit(plan))
    assert "with --optimizer-states bf16" in message and "would fit in" in message


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (dict(optimizer_states="bf16", offload_optimizer="nvme"), "needs the optimizer on the CPU"),
        (dict(optimizer_states="bf16", offload_optimizer="none"), "needs the optimizer on the CPU"),
        (dict(optimizer_states="bf16", precision="fp16"), "needs bf16 training"),
        (dict(zenflow=True, offload_optimizer="nvme"), "--zenflow needs the optimizer on the CPU"),
        (dict(zenflow=True, grad_accum=4), "--zenflow replaces gradient accumulation"),
        (dict(zenflow=True, offload_ratio=0.5), "exclude each other"),
    ],
)
def test_modes_that_deepspeed_would_refuse_are_one_line(workload, message):
    with pytest.raises(UserInputError, match=message):
        Workload(**workload)


def test_bf16_states_need_a_gpu_with_bf16(llama7b, write_host):
    v100 = write_host('gpus: {count: 1, memory: 32GiB, name: V100, compute_capability: "7.0"}\ncpu_memory: 256GiB\n')
    with pytest.raises(UserInputError, match="V100 has no bf16"):
        make_plan(llama7b, (h := load_host_spec(v100)), Workload(optimizer_states="bf16"), resolve_rates(h))


# ------------------------------------------------------------------------------------------ ZenFlow


def test_zenflow_hides_the_cpu_update_behind_the_next_steps_on_a_gpu(llama7b):
    plain = candidate(llama7b, "1x-a100-80g", Strategy(2, "cpu"), seq_len=2048)
    zen = candidate(llama7b, "1x-a100-80g", Strategy(2, "cpu", zenflow_interval=4), seq_len=2048)
    assert zen.strategy.label == "ZeRO-2 + opt->cpu + ZenFlow/4"
    # the host's update (CPU-Adam, copies, the upload) once per 4 steps, hidden behind 4 steps' passes
    full_update = plain.timing.update_seconds - STEP_FIXED_SECONDS
    assert full_update < 4 * zen.timing.passes_seconds
    selective = 0.1 * device_optimizer_seconds(llama7b.params, 1, plan_for(llama7b, "1x-a100-80g").rates)
    assert zen.timing.update_seconds == pytest.approx(selective + STEP_FIXED_SECONDS)
    assert zen.timing.step_seconds < 0.5 * plain.timing.step_seconds
    # and what it costs: the optimizer process and its double-buffered moments, a stale copy, overlap gradients
    extra = zen.memory.cpu_bytes - plain.memory.cpu_bytes
    assert extra == pytest.approx(20 * llama7b.params + 2**29, rel=0.01)
    assert zen.memory.gpu_terms["ZenFlow selective optimizer states"] == pytest.approx(0.1 * 10 * llama7b.params, 1e-6)


def test_zenflow_on_the_cpu_accelerator_hides_nothing():
    shape = Shape(10**8, 10**8, layers=8, hidden=1024, param_tensors=80, seq_len=64, micro_batch=4)
    rates = Rates(1e11, 32e9, 3e8, 2e9, 1e9, {}, cpu_memory_bytes_per_s=2e10, cpu_cores=2)
    args = dict(world=1, ranks_per_node=1, has_gpu=False)
    plain = timing.estimate_step(shape, Strategy(2, "cpu"), rates, **args)
    zen = timing.estimate_step(shape, Strategy(2, "cpu", zenflow_interval=4), rates, **args)
    host_update = plain.update_seconds - STEP_FIXED_SECONDS
    selective = 0.1 * cpu_adam_seconds(10**8, 1, 1, rates, torch_adam=True)
    assert zen.update_seconds == pytest.approx(selective + host_update / 4 + STEP_FIXED_SECONDS)


def test_zenflow_config_satisfies_deepspeeds_rules(llama7b):
    from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig

    plan = plan_for(llama7b, "1x-a100-80g", zenflow=True, zenflow_interval=8)
    assert plan.chosen.strategy.zenflow_interval == 8
    config = dsconfig.render(plan)
    section = config["zero_optimization"]["zenflow"]
    parsed = ZenFlowConfig(**section)  # DeepSpeed's own model
    # zenflow/engine.py configure_zenflow: "Select interval must be greater or equal to update interval"
    assert parsed.select_strategy == "step" and parsed.select_interval >= parsed.update_interval == 8
    assert config["gradient_accumulation_steps"] == 1
    dsconfig.validate(config, 1)
    assert strategy_of(config) == plan.chosen.strategy
    assert pins_from_config(config) | {"zenflow": True, "zenflow_interval": 8} == pins_from_config(config)
    reason = next(r for r in plan.reasons if r.startswith("ZenFlow (asked for)"))
    assert "more CPU RAM per node" in reason and "8 steps old" in reason


# ------------------------------------------------------------------------------------------ features


def test_modes_are_gated_on_the_installed_deepspeed(llama7b):
    old = (0, 12, 0)  # before Twin-Flow, bf16 states with offload and ZenFlow
    host = load_host_spec(host_path("1x-a100-80g"))
    plan = make_plan(llama7b, host, Workload(), resolve_rates(host), deepspeed_version=old)
    assert not any(c.strategy.partial for c in plan.candidates)
    small = make_plan(
        llama7b,
        (h := load_host_spec(host_path("1x-rtx4090-24g"))),
        Workload(),
        resolve_rates(h),
        deepspeed_version=old,
    )
    assert small.states_hint is None
    for feature, flag in (
        ("offload_ratio", "--offload-ratio"),
        ("bf16_optimizer_states", "--optimizer-states bf16"),
        ("zenflow", "--zenflow"),
    ):
        with pytest.raises(UserInputError, match=f"{flag} needs DeepSpeed >= .* this one is 0.12.0"):
            features.require(feature, old, flag)
        features.require(feature, (0, 19, 8), flag)  # the tested release has all of them
    assert features.parse_version("0.19.8+cu128") == (0, 19, 8) and features.parse_version("dev") is None
    assert replace(plan.workload, zenflow=True).zenflow_steps == 4


# ------------------------------------------------------------------------------------------ NVMe tuning


def test_nvme_swaps_are_pipelined_where_ram_holds_the_buffers(llama7b, write_host, workstation_96g):
    from launcher.plan import capacity

    plan = plan_for(llama7b, workstation_96g)  # 96 GiB of RAM: the optimizer goes to NVMe
    buckets = plan.chosen.buckets
    assert plan.chosen.strategy.offload_optimizer == "nvme" and buckets.pipeline
    assert buckets.optimizer_buffer_count == capacity.PIPELINED_BUFFER_COUNT == 12
    swap = plan.chosen.memory.cpu_terms["optimizer swap buffers (pinned)"]
    assert swap <= 0.1 * plan.host.cpu_memory_bytes and buckets.sub_group_size >= capacity.MIN_SUB_GROUP
    reason = next(r for r in plan.reasons if r.startswith("optimizer on NVMe"))
    assert "pipelined" in reason and f"{buckets.sub_group_size:,}" in reason
    assert any(r.startswith("aio") for r in plan.reasons)
    config = dsconfig.render(plan)
    offload = config["zero_optimization"]["offload_optimizer"]
    assert offload["pipeline_read"] is offload["pipeline_write"] is True and offload["buffer_count"] == 12
    dsconfig.validate(config, 1)
    # pipelined, the update pays the longer of CPU-Adam and the swaps and one sub-group's swap; serial, both
    groups = -(-llama7b.params // buckets.sub_group_size)
    shape = Shape(llama7b.params, llama7b.compute_params, seq_len=2048)
    args = dict(world=1, ranks_per_node=1, has_gpu=True)
    serial = timing.estimate_step(shape, plan.chosen.strategy, plan.rates, **args)
    piped = timing.estimate_step(shape, plan.chosen.strategy, plan.rates, **args, pipelined_groups=groups)
    on_host = serial.cpu_adam_seconds_per_step + serial.host_copy_seconds_per_step
    swaps = serial.nvme_seconds_per_step
    assert groups > 1 and serial.update_seconds - piped.update_seconds == pytest.approx(
        on_host + swaps - max(on_host, swaps) - swaps / groups
    )
    # little RAM: the buffers of 12 sub-groups of 10 M elements do not fit a tenth of it, the swapper stays serial
    # (40 GiB: with 32 the export's 16-bit copy of the model on rank 0 no longer fits, peaks.py [DS-export])
    text = "gpus: {count: 1, memory: 24GiB}\ncpu_memory: 40GiB\nnvme: {path: /nvme, free: 2TiB}\n"
    small = make_plan(llama7b, (h := load_host_spec(write_host(text))), Workload(), resolve_rates(h))
    assert small.chosen is not None and small.chosen.strategy.offload_optimizer == "nvme"
    assert not small.chosen.buckets.pipeline and small.chosen.buckets.optimizer_buffer_count == 4


def test_the_first_steps_adam_moments_count_in_ram_whole_when_pipelined_one_sub_group_when_serial(llama7b, write_host):
    """host_buffers.py [DS-lazy]: DeepSpeedCPUAdam creates m and v unpinned at the first step; the pipelined swapper
    keeps every sub-group's pair until the next step's swap-in, the serial one frees each at its swap-out."""
    from launcher.plan.subgroups import optimizer_subgroup_numel

    def plan_with_ram(gib: int):
        text = f"gpus: {{count: 1, memory: 24GiB}}\ncpu_memory: {gib}GiB\nnvme: {{path: /nvme, free: 2TiB}}\n"
        return make_plan(llama7b, (h := load_host_spec(write_host(text))), Workload(), resolve_rates(h)).chosen

    term = "first step's new Adam moments (unpinned)"
    piped = plan_with_ram(96)
    assert piped.buckets.pipeline and piped.memory.cpu_terms[term] == 2 * 4 * llama7b.params  # 50.2 GiB
    serial = plan_with_ram(40)
    buckets = serial.buckets
    assert serial.strategy.offload_optimizer == "nvme" and not buckets.pipeline
    subgroup = optimizer_subgroup_numel(llama7b.params, 1, buckets.sub_group_size, llama7b.largest_param_numel)
    assert serial.memory.cpu_terms[term] == 2 * 4 * subgroup < 2 * 4 * llama7b.params
    # 72 GiB: a tenth holds the pipelined swap buffers, and without this term the plan pipelined the swaps (24.8 GiB
    # predicted, 75 GiB at the first step's end); with it, the serial swapper is the one that fits
    tight = plan_with_ram(72)
    assert tight.strategy.offload_optimizer == "nvme" and not tight.buckets.pipeline
    assert tight.memory.cpu_bytes < 72 * 2**30 < piped.memory.cpu_bytes


# ------------------------------------------------------------------------------------------ activation offload

PUBLISHED = Path(__file__).parent / "published_models"


def test_the_zero_offload_tutorials_gpt2_10b_fits_one_v100_with_its_activations_on_the_cpu(write_host):
    """DeepSpeed's ZeRO-Offload tutorial trains GPT-2 10B at batch 10 x 1024 tokens on one 32 GB V100 with ZeRO-2
    and the optimizer on the CPU, measured 26.07 s/step (tests/plan/published_runs.yaml). Its activations do not
    fit beside the weights on the GPU; in CPU memory (host_buffers.py [act-offload]) they do."""
    model = inspect_model(str(PUBLISHED / "gpt2-10b-megatron"))
    v100 = load_host_spec(
        write_host(
            'gpus: {count: 1, memory: 32GiB, name: Tesla V100-SXM3-32GB, compute_capability: "7.0"}\n'
            "cpu_memory: 1505GiB\ncpu_cores: 48\npcie: {generation: 3, width: 16}\n"
        )
    )
    asked = dict(zero_stage="2", offload_optimizer="cpu", micro_batch=10, seq_len=1024, precision="fp16")
    plan = make_plan(model, v100, Workload(**asked), resolve_rates(v100))
    plain = next(c for c in plan.candidates if c.strategy == Strategy(2, "cpu"))
    assert not plain.fits and all(p.startswith("GPU needs") for p in plain.problems)
    assert plan.chosen.strategy == Strategy(2, "cpu", offload_activations="cpu")
    assert plan.chosen.strategy.label == "ZeRO-2 + opt->cpu + act->cpu"
    moved = plan.chosen.memory.cpu_terms["offloaded activations (pinned)"]
    hidden_states = 2 * 1024 * 10 * model.hidden_size * (model.num_layers + 2)
    assert moved >= hidden_states + 4 * 1024 * 10 * model.vocab_size  # layer inputs + the fp32 logits, rounded up
    # the copies cost PCIe time in the passes: the step is slower than the plain one would be, and within the
    # published-runs band of the tutorial's measured 26.07 s
    assert plan.chosen.timing.passes_seconds > plain.timing.passes_seconds
    assert 0.67 <= 26.07 / plan.chosen.timing.step_seconds <= 1.5
    none = make_plan(model, v100, Workload(**asked, offload_activations="none"), resolve_rates(v100))
    assert none.chosen is None
    with pytest.raises(UserInputError, match="keeps the checkpointed activations"):
        Workload(offload_activations="cpu", activation_checkpointing=False)


# ------------------------------------------------------------------------------------------ superchips


def test_a_superchip_link_replaces_pcie_and_brings_super_offload(llama7b, write_host):
    gh200 = load_host_spec(host_path("1x-gh200-96g"))
    assert gh200.link_kind == "nvlink-c2c"
    assert resolve_rates(gh200).pcie_bytes_per_s == 450e9  # the link, not a PCIe generation
    plan = make_plan(llama7b, gh200, Workload(), resolve_rates(gh200))
    superchip = next(c for c in plan.candidates if c.strategy.super_offload)
    assert superchip.strategy.label == "ZeRO-3 + opt->cpu + SuperOffload"
    full = next(c for c in plan.candidates if c.strategy == Strategy(3, "cpu"))
    # [SuperOffload]: the update waits only for what outlasts the backward; a worker process more on the CPU
    assert superchip.timing.update_seconds < full.timing.update_seconds
    assert superchip.memory.cpu_terms["SuperOffload CPU-Adam process"] > 0
    config = dsconfig.render(replace(plan, chosen=superchip))
    offload = config["zero_optimization"]["offload_optimizer"]
    assert offload["super_offload"] is True and offload["cpuadam_cores_perc"] == 0.8
    dsconfig.validate(config, 1)
    assert strategy_of(config) == superchip.strategy
    # PCIe hosts and the CPU accelerator: not proposed (DeepSpeed built it for superchips; it asserts CUDA)
    for name in ("1x-h100-80g", "cpu-only"):
        assert not any(c.strategy.super_offload for c in plan_for(llama7b, name).candidates)
    with pytest.raises(UserInputError, match="link.kind: must be one of pcie, nvlink-c2c"):
        load_host_spec(write_host("gpus: {count: 1, memory: 96GiB}\ncpu_memory: 480GB\nlink: {kind: c2c}\n"))
