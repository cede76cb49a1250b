"""DeepSpeed's newer offload modes as refinements of the decision framework's strategies (planner.py): a partial
optimizer offload (memory.py [Twin-Flow]), SuperOffload on superchips ([SuperOffload]), the activations in CPU memory
([act-offload]), and the one-line reasons for them and for ZenFlow and the NVMe swap settings. Each is gated on the
installed DeepSpeed by the planner (features.py).

Pure, like the planner.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.plan import memory
from launcher.plan.candidates import Candidate, estimate_candidate
from launcher.plan.capacity import model_shape, size_buckets
from launcher.plan.memory import Strategy
from launcher.plan.timing import Rates
from launcher.plan.workload import Workload
from launcher.units import fmt_bytes

FULL_OFFLOAD = Strategy(3, "cpu")  # the candidate a partial offload and SuperOffload refine


def super_offload_candidate(
    model, host, workload: Workload, rates, world, ranks, alloc_conf=None, calibration=None
) -> Candidate | None:
    """[SuperOffload] (memory.py) ZeRO-3 with the optimizer on the CPU through DeepSpeed's SuperOffload, where it was
    built for: a GPU joined to its CPU by a coherent link (a described host's `link: {kind: nvlink-c2c}`). Not with
    16-bit states, ZenFlow or a split optimizer, which it does not document."""
    if not host.has_gpu or host.link_kind != "nvlink-c2c":
        return None
    if workload.optimizer_states != "fp32" or workload.zenflow or (workload.offload_ratio or 1) < 1:
        return None
    strategy = replace(workload.shaped(FULL_OFFLOAD), super_offload=True)
    if not workload.allows(strategy):
        return None
    return estimate_candidate(
        model, host, workload, strategy, rates, world, ranks, alloc_conf=alloc_conf, calibration=calibration
    )


def activation_offload_variants(
    model, host, workload: Workload, candidates, rates, world, ranks, alloc_conf=None, calibration=None
) -> list[tuple[int, Candidate]]:
    """[act-offload] (memory.py) (index, the same strategy with its checkpointed activations in CPU memory) for each
    candidate that misses the GPU and only the GPU, where that variant fits: what the activations cost is then
    PCIe time, not the next offload tier. Only with activation checkpointing, on a GPU, unless pinned either way."""
    if workload.offload_activations != "auto" or not workload.activation_checkpointing or not host.has_gpu:
        return []
    variants = []
    for index, candidate in enumerate(candidates):
        if candidate.fits or not all(p.startswith("GPU needs") for p in candidate.problems):
            continue
        variant = estimate_candidate(
            model,
            host,
            workload,
            replace(candidate.strategy, offload_activations="cpu"),
            rates,
            world,
            ranks,
            alloc_conf=alloc_conf,
            calibration=calibration,
        )
        if variant.fits:
            variants.append((index, variant))
    return variants


def partial_offload_candidate(
    model,
    host,
    workload: Workload,
    rates: Rates,
    world: int,
    ranks: int,
    alloc_conf: str | None = None,
    calibration: dict | None = None,
) -> Candidate | None:
    """[Twin-Flow] (memory.py) ZeRO-3 with part of the optimizer on the GPU: the share that minimizes the
    predicted step among those that fit, one sub-group at a time (capacity.PARTIAL_OFFLOAD_SUB_GROUPS: steps
    of ~5 %), or the one --offload-ratio pins (whether it fits or not, so the table says). None when no share
    fits, when the optimizer or the stage are pinned elsewhere, and on the CPU accelerator unless pinned: there
    DeepSpeed steps the "GPU" share on the CPU too, nothing to gain."""
    pinned = workload.offload_ratio
    if workload.zenflow:  # ZenFlow with a split optimizer is not a combination DeepSpeed documents: not proposed
        return None
    if pinned is not None:
        strategies = [Strategy(3, "cpu", offload_ratio=pinned)] if pinned < 1 else []
    elif host.has_gpu:
        sizing = size_buckets(model, host, Strategy(3, "cpu", offload_ratio=0.5), world, ranks)
        groups = len(memory.stage3_subgroups(model_shape(model, sizing), world, sizing.sub_group_size))
        strategies = [Strategy(3, "cpu", offload_ratio=memory.ratio_keeping(k, groups)) for k in range(1, groups)]
    else:
        strategies = []
    strategies = [workload.shaped(strategy) for strategy in strategies]
    evaluated = [
        estimate_candidate(
            model, host, workload, strategy, rates, world, ranks, alloc_conf=alloc_conf, calibration=calibration
        )
        for strategy in strategies
        if workload.allows(strategy)
    ]
    if pinned is not None:
        return evaluated[0] if evaluated else None
    fitting = [c for c in evaluated if c.fits]
    return min(fitting, key=lambda c: c.timing.expected_seconds) if fitting else None


def zenflow_reason(chosen: Candidate, plain: Candidate) -> str:
    """What ZenFlow ([ZenFlow] in memory.py and timing.py) buys and costs, against the same strategy without it."""
    interval = chosen.strategy.zenflow_interval
    return (
        f"ZenFlow (asked for): {memory.ZENFLOW_TOPK_RATIO:.0%} of the gradient columns update on the device every "
        f"step, the rest on the CPU every {interval} steps in its own process, behind the next steps' passes: "
        f"{chosen.timing.expected_seconds:.3g} s/step against {plain.timing.expected_seconds:.3g} without it, for "
        f"{fmt_bytes(chosen.memory.cpu_bytes - plain.memory.cpu_bytes)} more CPU RAM per node (double-buffered "
        "moments, a stale copy, overlap gradients) and parameters updated from gradients up to "
        f"{interval} steps old"
    )


def nvme_tuning_reason(chosen: Candidate, host) -> str:
    """The optimizer's NVMe swap settings and why (capacity.nvme_optimizer_sizing), in one line."""
    buckets = chosen.buckets
    swap = fmt_bytes(chosen.memory.cpu_terms.get("optimizer swap buffers (pinned)", 0))
    if buckets.pipeline:
        how = (
            f"pipelined (pipeline_read/pipeline_write: the next sub-group read and the last written while one "
            f"steps), {buckets.optimizer_buffer_count} swap buffers"
        )
    else:
        how = (
            f"not pipelined: a tenth of RAM holds {buckets.optimizer_buffer_count} swap buffers of large enough "
            "sub-groups, or the partition is one sub-group"
        )
    return (
        f"optimizer on NVMe: sub_group_size {buckets.sub_group_size:,}, {how} ({swap} pinned per node, at most a "
        f"tenth of {fmt_bytes(host.cpu_memory_bytes)} RAM)"
    )


def partial_offload_reason(chosen: Candidate, candidates, has_gpu: bool) -> str:
    """Why a partial offload ([Twin-Flow]), in numbers: the share kept on the GPU and the step against the full
    offload's."""
    if not has_gpu:
        return (
            "partial optimizer offload (DeepSpeed Twin-Flow, offload_optimizer.ratio "
            f"{chosen.strategy.offload_ratio:g}) as pinned: on the CPU accelerator the device's share is CPU memory "
            "too and DeepSpeed steps it with CPU-Adam, so it runs and checkpoints like on a GPU but is timed as a "
            "full offload"
        )
    states = chosen.strategy.states_term
    on_gpu = chosen.memory.gpu_terms.get(f"{states} (GPU share)", 0)
    on_cpu = chosen.memory.cpu_terms.get(states, 0)
    full = [c for c in candidates if c.strategy == replace(chosen.strategy, offload_ratio=1.0)]
    versus = ""
    if full:
        ratio = full[0].timing.expected_seconds / chosen.timing.expected_seconds
        versus = f"; the full offload would take {full[0].timing.expected_seconds:.3g} s/step ({ratio:.2f}x)"
    return (
        f"partial optimizer offload (DeepSpeed Twin-Flow, offload_optimizer.ratio {chosen.strategy.offload_ratio:g}): "
        f"{fmt_bytes(on_gpu)} of {states} per GPU and their Adam step stay on the GPU, the rest on "
        f"the CPU ({fmt_bytes(on_cpu)} per node){versus}"
    )
