"""DeepSpeed's newer offload modes as refinements of the decision framework's strategies (planner.py): a partial
optimizer offload (subgroups.py [Twin-Flow]), SuperOffload on superchips ([SuperOffload]), the activations in CPU memory
([act-offload]). Each is gated on the installed DeepSpeed by the planner (features.py); their one-line reasons are in
reasons.py.

Pure, like the planner.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.plan import subgroups
from launcher.plan.candidates import Candidate, Inputs, estimate_candidate
from launcher.plan.capacity import model_shape, size_buckets
from launcher.plan.strategy import Strategy

FULL_OFFLOAD = Strategy(3, "cpu")  # the candidate a partial offload and SuperOffload refine


def super_offload_candidate(inputs: Inputs) -> Candidate | None:
    """[SuperOffload] (host_buffers.py) ZeRO-3 with the optimizer on the CPU through DeepSpeed's SuperOffload, where it
    was built for: a GPU joined to its CPU by a coherent link (a described host's `link: {kind: nvlink-c2c}`). Not with
    16-bit states, ZenFlow or a split optimizer, which it does not document."""
    host, workload = inputs.host, inputs.workload
    if not host.has_gpu or host.link_kind != "nvlink-c2c":
        return None
    if workload.optimizer_states != "fp32" or workload.zenflow or (workload.offload_ratio or 1) < 1:
        return None
    strategy = replace(workload.shaped(FULL_OFFLOAD), super_offload=True)
    if not workload.allows(strategy):
        return None
    return estimate_candidate(inputs, strategy)


def activation_offload_variants(inputs: Inputs, candidates) -> list[tuple[int, Candidate]]:
    """[act-offload] (host_buffers.py) (index, the same strategy with its checkpointed activations in CPU memory) for
    each candidate that misses the GPU and only the GPU, where that variant fits: what the activations cost is then PCIe
    time, not the next offload tier. Only with activation checkpointing, on a GPU, unless pinned either way."""
    workload = inputs.workload
    if workload.offload_activations != "auto" or not workload.activation_checkpointing or not inputs.host.has_gpu:
        return []
    variants = []
    for index, candidate in enumerate(candidates):
        if candidate.fits or not all(p.startswith("GPU needs") for p in candidate.problems):
            continue
        variant = estimate_candidate(inputs, replace(candidate.strategy, offload_activations="cpu"))
        if variant.fits:
            variants.append((index, variant))
    return variants


def partial_offload_candidate(inputs: Inputs) -> Candidate | None:
    """[Twin-Flow] (subgroups.py) ZeRO-3 with part of the optimizer on the GPU: the share that minimizes the
    predicted step among those that fit, one sub-group at a time (capacity.PARTIAL_OFFLOAD_SUB_GROUPS: steps
    of ~5 %), or the one --offload-ratio pins (whether it fits or not, so the table says). None when no share
    fits, when the optimizer or the stage are pinned elsewhere, and on the CPU accelerator unless pinned: there
    DeepSpeed steps the "GPU" share on the CPU too, nothing to gain."""
    model, host, workload, world = inputs.model, inputs.host, inputs.workload, inputs.world
    pinned = workload.offload_ratio
    if workload.zenflow:  # ZenFlow with a split optimizer is not a combination DeepSpeed documents: not proposed
        return None
    if pinned is not None:
        strategies = [Strategy(3, "cpu", offload_ratio=pinned)] if pinned < 1 else []
    elif host.has_gpu:
        sizing = size_buckets(model, host, Strategy(3, "cpu", offload_ratio=0.5), world, inputs.ranks)
        groups = len(subgroups.stage3_subgroups(model_shape(model, sizing), world, sizing.sub_group_size))
        strategies = [Strategy(3, "cpu", offload_ratio=subgroups.ratio_keeping(k, groups)) for k in range(1, groups)]
    else:
        strategies = []
    strategies = [workload.shaped(strategy) for strategy in strategies]
    evaluated = [estimate_candidate(inputs, strategy) for strategy in strategies if workload.allows(strategy)]
    if pinned is not None:
        return evaluated[0] if evaluated else None
    fitting = [c for c in evaluated if c.fits]
    return min(fitting, key=lambda c: c.timing.expected_seconds) if fitting else None
