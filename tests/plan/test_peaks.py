"""Memory at each moment of a run (plan/peaks.py) and the host RAM a run may use (capacity.usable_cpu_bytes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import capacity, peaks
from launcher.plan.candidates import Inputs, estimate_candidate, weights_copied
from launcher.plan.host_buffers import (
    FIRST_STEP_MOMENTS,
    PINNED_ROUND_LIMIT_BYTES,
    init_partition_cache_bytes,
    pinned_bytes,
)
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.strategy import Strategy
from launcher.plan.workload import Workload
from launcher.units import GiB
from tests.helpers import host_path


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b-hf")


def candidate(model, host_name: str, strategy: Strategy, **workload):
    host = load_host_spec(host_path(host_name))
    plan = make_plan(model, host, Workload(**workload), resolve_rates(host))
    return estimate_candidate(Inputs(model, host, plan.workload, plan.rates, 1, 1), strategy)


def test_zero2_offload_peaks_when_the_checkpoint_copies_the_flat_weights_off_the_gpu(llama7b):
    """[torch-save]: ZeRO-1/2's module state is a view of the flat 16-bit buffer on the GPU; data-parallel rank 0
    writes it, so torch.save copies all of it to host RAM: 2 B/param over the steady state. The offloaded optimizer's
    storages are host RAM already: nothing else is copied."""
    c = candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(2, "cpu"))
    m = c.memory
    assert m.cpu_moments[peaks.SAVE] - m.steady_cpu_bytes == 2 * llama7b.params
    assert m.cpu_peak_moment == peaks.SAVE and m.cpu_bytes == m.cpu_moments[peaks.SAVE]
    # [DS-lazy-adam] before the first step there are no moments (8 of the states' 12 B/param); the master partition's
    # pageable source is alive beside its pinned copy ([DS-pin-copy], 4 B/param)
    states = m.cpu_terms[c.strategy.states_term]
    assert m.cpu_moments[peaks.INIT] == m.steady_cpu_bytes - int(states * 2 / 3) + 4 * llama7b.params
    assert m.cpu_moments[peaks.LOAD] < m.cpu_moments[peaks.INIT] < m.cpu_moments[peaks.STEP]


def test_zero3_gathers_the_export_on_rank_0_after_adams_moments_are_freed(llama7b):
    """[DS-export]: the consolidated 16-bit state dict (2 B/param) on rank 0's host, once rank/export.py freed
    Adam's moments: the export stays under the optimizer step with one node's whole optimizer in RAM. With the
    optimizer on NVMe only the first step's moments, waiting for their swap buffers, are freed."""
    cpu = candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(3, "cpu")).memory
    states = cpu.cpu_terms["fp32 optimizer states"]
    assert cpu.cpu_moments[peaks.EXPORT] == cpu.steady_cpu_bytes - int(states * 2 / 3) + 2 * llama7b.params
    assert cpu.cpu_moments[peaks.EXPORT] < cpu.cpu_moments[peaks.STEP]
    nvme = candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(3, "nvme"), nvme_path="/mnt/nvme").memory
    waiting = nvme.cpu_terms[FIRST_STEP_MOMENTS]
    assert nvme.cpu_moments[peaks.EXPORT] == nvme.steady_cpu_bytes - waiting + 2 * llama7b.params


def test_zero3_without_parameter_offload_stages_the_partitions_in_host_ram_at_init(llama7b):
    """[DS-defrag]: defragment() copies every partition through one pageable host buffer (2 B/param / N) before
    any optimizer buffer exists. Its peak is the checkpoint save, though: [torch-save] every rank copies its fp32
    master partition off the GPU (4 B/param / N), one storage at a time."""
    m = candidate(llama7b, "1x-a100-80g", Strategy(3)).memory
    assert m.cpu_moments[peaks.INIT] == m.cpu_moments[peaks.LOAD] + 2 * llama7b.params
    assert m.cpu_moments[peaks.SAVE] == m.steady_cpu_bytes + 4 * llama7b.params
    assert m.cpu_peak_moment == peaks.SAVE


def test_the_load_copies_the_weights_only_when_their_dtype_is_not_the_training_one(llama7b):
    """[HF-load]: weights in the training dtype stay views of the page cache; Llama-2's config says float16, so
    bf16 training converts them on every rank."""
    assert llama7b.weights_dtype == "float16"
    assert weights_copied(llama7b, "bf16") and not weights_copied(llama7b, "fp16")
    mapped = replace(llama7b, weights_dtype="bfloat16")
    assert not weights_copied(mapped, "bf16")
    assert weights_copied(replace(mapped, source="local", has_weights=False), "bf16")  # initialised, not loaded
    copied = candidate(llama7b, "1x-a100-80g", Strategy(2)).memory
    kept = candidate(mapped, "1x-a100-80g", Strategy(2)).memory
    assert copied.cpu_moments[peaks.LOAD] - kept.cpu_moments[peaks.LOAD] == 2 * llama7b.params


def test_zero_init_partitions_stay_cached_by_torchs_pinned_allocator(llama7b):
    """[DS-init-pin]: one pinned block per partitioned tensor, rounded to a power of two, never returned; with the
    allocator's round limit, the blocks above it are freed when dropped."""
    with_param = candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(3, "cpu", "cpu")).memory
    term = "zero.Init partitions (cached pinned blocks)"
    big = [k for k in llama7b.param_numels if k > 100_000]
    assert with_param.cpu_terms[term] == sum(pinned_bytes(2 * k) for k in big)
    assert 2 * sum(big) <= with_param.cpu_terms[term] < 4 * sum(big)
    limited = init_partition_cache_bytes(llama7b, 100_000, world=1, round_limit=PINNED_ROUND_LIMIT_BYTES)
    assert limited == sum(pinned_bytes(2 * k) for k in big if pinned_bytes(2 * k) <= PINNED_ROUND_LIMIT_BYTES)
    assert term not in candidate(llama7b, "1x-rtx4090-24g-192g", Strategy(3, "cpu")).memory.cpu_terms
    assert term not in candidate(llama7b, "cpu-only", Strategy(3, "cpu", "cpu")).memory.cpu_terms  # no pinning


def test_usable_host_ram_is_what_the_kernel_leaves_less_the_processes_beside_the_ranks():
    described = load_host_spec(host_path("1x-rtx4090-24g"))  # 128 GiB installed
    usable = capacity.usable_cpu_bytes(described)
    assert usable == int(128 * GiB * 63 / 64) - GiB - capacity.SIDE_PROCESSES_BYTES
    assert round(usable / GiB, 1) == 124.2
    live = replace(described, source="live", cpu_memory_available_bytes=100 * GiB)
    assert capacity.usable_cpu_bytes(live) == 100 * GiB - capacity.SIDE_PROCESSES_BYTES
    for host in (described, live):  # the inverse the property sweeps turn at
        need = 90 * GiB + 12345
        ram = capacity.cpu_memory_for(need, host)
        low, high = (replace(host, cpu_memory_bytes=v, cpu_memory_available_bytes=v) for v in (ram - 1, ram))
        assert capacity.usable_cpu_bytes(high) >= need > capacity.usable_cpu_bytes(low)


def test_the_plan_names_each_tiers_peak_and_carries_every_moment(llama7b):
    host = load_host_spec(host_path("1x-rtx4090-24g"))
    plan = make_plan(llama7b, host, Workload(), resolve_rates(host))
    memory = plan.to_json(None)["memory"]
    assert set(memory["cpu_moments"]) == set(peaks.MOMENTS) == set(memory["gpu_moments"])
    assert memory["cpu_bytes"] == max(memory["cpu_moments"].values())
    assert memory["cpu_peak_moment"] in peaks.MOMENTS and memory["gpu_peak_moment"] == peaks.STEP
    zero2 = next(c for c in plan.candidates if c.strategy == Strategy(2, "cpu"))
    assert any(p.startswith("CPU RAM needs") and "at the checkpoint save >" in p for p in zero2.problems)
