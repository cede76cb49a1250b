"""The plan's sentences: why this strategy, the runner-up, the collectives, hints a flag would change.

Pure, like the planner: candidates and rates in, lines of text out.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.inspection.hostprofile import HostProfile
from launcher.plan import network
from launcher.plan.candidates import Candidate, Inputs, estimate_candidate
from launcher.plan.host_buffers import ZENFLOW_TOPK_RATIO
from launcher.plan.rates import Rates
from launcher.plan.timing import StepEstimate
from launcher.units import fmt_bytes


def explain(inputs: Inputs, candidates, ranked, aio: dict | None, hint: str | None) -> tuple[list[str], list[str]]:
    """The plan's reasons and warnings, in the order it lists them: why the chosen candidate (and why not the
    ones before it), the collectives, the runner-up, calibration, the aio settings, ZenFlow, the states hint.
    `ranked`: the fitting candidates, fastest first."""
    chosen = ranked[0] if ranked else None
    reasons, warnings = why_chosen(candidates, chosen, inputs.host, inputs.world, inputs.model.params)
    if chosen is not None and (line := collectives_reason(chosen.timing, inputs.rates, inputs.world, inputs.ranks)):
        reasons.append(line)
    if note := nominal_network_note(inputs.host):
        warnings.append(note)
    if inputs.model.trainable_params:
        reasons.append(adapter_reason(inputs.model.params, inputs.model.trainable_params, inputs.world))
    if len(ranked) > 1:
        reasons.append(runner_up_reason(chosen, ranked[1]))
    calibrated = [c.strategy.label for c in candidates if c.timing.calibration]
    if calibrated:
        reasons.append(
            f"calibrated by finished runs on this host (their measured / predicted phases): {', '.join(calibrated)}; "
            "the other candidates are first-principles predictions"
        )
    if chosen is not None and "nvme" in (chosen.strategy.offload_optimizer, chosen.strategy.offload_param):
        reasons.append(aio_reason(aio))
    if chosen is not None and chosen.strategy.zenflow_interval:
        plain = estimate_candidate(
            inputs.uncalibrated(replace(inputs.workload, zenflow=False)),
            replace(chosen.strategy, zenflow_interval=0),
        )
        reasons.append(zenflow_reason(chosen, plain))
    if hint:
        reasons.append(hint)
    return reasons, warnings


def adapter_reason(params: int, trainable: int, world: int) -> str:
    """With a LoRA, what each tier of the framework buys (memory.py [DS-frozen])."""
    base = 2 * (params - trainable)
    return (
        f"LoRA: the frozen base ({fmt_bytes(base)} in 16-bit) stays whole on every GPU at ZeRO-1/2; ZeRO-3 partitions "
        f"it ({fmt_bytes(base // world)} per rank) and offload_param moves it to the CPU or NVMe, while the adapter's "
        f"gradients and Adam states ({fmt_bytes(16 * trainable)} in all) are all that offload_optimizer can move"
    )


def why_chosen(candidates, chosen, host, world: int, params: int) -> tuple[list[str], list[str]]:
    """Why not each candidate before the chosen one, why the chosen one (its memory, its step, what it
    configures), and what inspecting the host found."""
    reasons: list[str] = []
    warnings: list[str] = list(host.warnings)  # what inspecting the host found (another process on a GPU ...)
    if not host.has_gpu:
        reasons.append("no GPU: planning for DeepSpeed's CPU accelerator; device memory is CPU RAM")
    for candidate in candidates:
        if candidate is chosen:
            break
        if not candidate.fits:
            reasons.append(f"{candidate.strategy.label} does not fit: {'; '.join(candidate.problems)}")
    if chosen is None:
        if not candidates:
            reasons.append("no strategy matches the pinned --zero-stage/--offload-* combination")
        return reasons, warnings
    reasons.append(chosen_reason(chosen, host, world))
    if chosen.strategy.partial:
        reasons.append(partial_offload_reason(chosen, candidates, host.has_gpu))
    if chosen.strategy.offload_optimizer == "nvme":
        reasons.append(nvme_tuning_reason(chosen, host))
    if chosen.strategy.offload_optimizer == "none" and host.has_gpu:
        reasons.append(
            "optimizer on the GPU: ds_config sets torch_adam with fused, so DeepSpeed uses torch's fused AdamW "
            "instead of compiling its FusedAdam op (which needs nvcc matching torch's CUDA)"
        )
    if chosen.strategy.offload_optimizer != "none":
        reasons.append(
            "optimizer offloaded: ds_config uses AdamW so DeepSpeed builds DeepSpeedCPUAdam; "
            f"{'NVLink-C2C' if host.link_kind == 'nvlink-c2c' else 'PCIe'} moves >= 4 B/param per optimizer step "
            f"({fmt_bytes(4 * params)}, [seeds])"
        )
    return reasons, warnings + nvme_warnings(chosen, host)


def chosen_reason(chosen: Candidate, host, world: int) -> str:
    """The chosen candidate in one line: what it needs per tier, its step and its offload overhead."""
    device = "GPU" if host.has_gpu else "CPU-accelerator rank"
    m = chosen.memory
    where = [f"{fmt_bytes(m.gpu_bytes_per_device)} per {device}"]
    if m.cpu_bytes:
        where.append(f"{fmt_bytes(m.cpu_bytes)} CPU RAM per node")
    if m.nvme_bytes:
        where.append(f"{fmt_bytes(m.nvme_bytes)} NVMe per node")
    t = chosen.timing
    calibrated = f" (calibrated: {t.calibrated_step_seconds:.3g} s/step)" if t.calibrated_step_seconds else ""
    return (
        f"chose {chosen.strategy.label}: the fastest predicted that fits ({', '.join(where)}; world size "
        f"{world}; {t.step_seconds:.3g} s/step{calibrated}, {t.tokens_per_s:,.0f} tokens/s, offload overhead "
        f"{t.offload_overhead_fraction:.0%})"
    )


def nvme_warnings(chosen: Candidate, host) -> list[str]:
    """What the NVMe folder's drive means for a chosen strategy that swaps to it."""
    if not host.nvme or "nvme" not in (chosen.strategy.offload_optimizer, chosen.strategy.offload_param):
        return []
    warnings = []
    if host.nvme.is_nvme is False:
        warnings.append(f"{host.nvme.path} is not on an NVMe device: swapping will be slow")
    if host.nvme.aio_usable is False:
        warnings.append(
            "DeepSpeed's async_io op is not usable (libaio missing): install libaio-dev (Debian/Ubuntu) "
            "or libaio-devel (RHEL) before training"
        )
    return warnings


def runner_up_reason(chosen: Candidate, runner_up: Candidate) -> str:
    """The second fastest that fits, and how much slower it is predicted."""
    slower = runner_up.timing.expected_seconds / chosen.timing.expected_seconds - 1
    return (
        f"runner-up {runner_up.strategy.label} would take {runner_up.timing.expected_seconds:.3g} s/step "
        f"({slower:+.0%})"
    )


def aio_reason(aio: dict | None) -> str:
    """The aio settings an NVMe offload runs with, and where they come from."""
    return (
        f"aio {', '.join(f'{k} {v}' for k, v in sorted(aio.items()))}: the fastest of this host's probe sweep"
        if aio
        else "aio: DeepSpeed's block size and queue depth, a thread per core of the rank (no probe sweep of "
        "this drive: `offload-launch probe --nvme-path DIR` measures one)"
    )


def zenflow_reason(chosen: Candidate, plain: Candidate) -> str:
    """What ZenFlow ([ZenFlow] in host_buffers.py and timing.py) buys and costs, against the same strategy
    without it."""
    interval = chosen.strategy.zenflow_interval
    return (
        f"ZenFlow (asked for): {ZENFLOW_TOPK_RATIO:.0%} of the gradient columns update on the device every "
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


def nominal_network_note(host: HostProfile) -> str | None:
    """network.py [nominal] the one line a plan for several nodes whose network nobody described carries; None
    otherwise."""
    if host.nodes <= 1 or host.network_bytes_per_s:
        return None
    bits, rate = network.NOMINAL_NETWORK_BITS_PER_S / 1e9, network.NOMINAL_NETWORK_BYTES_PER_S / 1e9
    return (
        f"network nominal: {bits:.0f} Gb/s per node ({rate:.3g} GB/s each way) for the collectives between the "
        f"{host.nodes} nodes; state yours as network.bandwidth (and network.nics) in a described host, --host-spec "
        "(docs/planning.md, 'Several nodes: the network')"
    )


def collectives_reason(timing: StepEstimate, rates: Rates, world: int, ranks_per_node: int) -> str | None:
    """The chosen strategy's collectives in one line (network.py): what they send, on which link, in how long; None
    when they are not charged."""
    rate = network.ring_bytes_per_s(rates, world, ranks_per_node)
    if not timing.collective_seconds_per_step or not rate:
        return None
    across = world > ranks_per_node
    link = "the nodes' network" if across and rate == rates.network_bytes_per_s else "the GPUs' links"
    return (
        f"collectives: each rank sends {fmt_bytes(timing.collective_bytes_per_step)} per step around the ring"
        f"{' and each node as much across the network' if across else ''}, at {rate / 1e9:.3g} GB/s ({link} bound "
        f"it): {timing.collective_seconds_per_step:.3g} s, the gradients' reductions hidden behind the backward as far "
        "as it lasts"
    )


def nominal_note(host, rates: Rates) -> str | None:
    """One line naming the nominal figures a plan of this host used (none for NVMe without an NVMe folder, or for
    PCIe without a GPU: no plan here uses them), and how to measure them; None when there are none."""
    unused = ("nvme_" if host.nvme is None else "-", "pcie_" if not host.has_gpu else "-")
    nominal = sorted(
        name
        for name, source in rates.sources.items()
        if str(source).startswith("nominal") and "not measurable" not in source and not name.startswith(unused)
    )
    if not nominal:
        return None
    return (
        f"step times use nominal rates for {', '.join(nominal)}: `offload-launch probe` measures this host once "
        "(a real run does it first)"
    )
