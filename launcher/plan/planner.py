"""The decision framework: enumerate strategies fastest-first, size and time each, pick the fastest
predicted that fits (ties keep the framework's order).

Pure: same (model, host, workload) in, same Plan out; no processes, no files, no environment.

The order is the seeds' decision framework ("CPU & NVMe Offloading", §5) refined by ZeRO stage:
no offload (ZeRO-1, -2, -3) -> optimizer on CPU (ZeRO-Offload) -> parameters on CPU too -> optimizer on
NVMe -> everything on NVMe (ZeRO-Infinity). Each step down trades step time for capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.errors import UserInputError
from launcher.inspection.hostprofile import HostProfile
from launcher.inspection.model import ModelProfile
from launcher.plan import features, network
from launcher.plan.candidates import Candidate, estimate_candidate, pins_host_memory, step_shape
from launcher.plan.memory import Strategy
from launcher.plan.modes import (
    FULL_OFFLOAD,
    activation_offload_variants,
    nvme_tuning_reason,
    partial_offload_candidate,
    partial_offload_reason,
    super_offload_candidate,
    zenflow_reason,
)
from launcher.plan.timing import Rates
from launcher.plan.workload import Workload
from launcher.units import fmt_bytes

__all__ = [
    "CANDIDATE_ORDER",
    "DEFAULT_SEQ_LEN",
    "MAX_ADVISED_ACCUMULATION",
    "OVERHEAD_TARGET",
    "Candidate",
    "Plan",
    "Workload",
    "batch_advice",
    "decide_pin_memory",
    "estimate_candidate",
    "partial_offload_candidate",
    "locked_swap_bytes_per_rank",
    "make_plan",
    "pins_host_memory",
    "pinned_bytes_per_rank",
    "resolve_precision",
    "resolve_ranks",
    "resolve_seq_len",
    "step_shape",
]

DEFAULT_SEQ_LEN = 2048

# Fastest to slowest ([seeds] decision framework). ZeRO-1 + CPU offload is reachable only when pinned.
CANDIDATE_ORDER: tuple[Strategy, ...] = (
    Strategy(1),
    Strategy(2),
    Strategy(3),
    Strategy(3, "none", "cpu"),  # parameters offloaded, the optimizer stays on the GPU: valid, rarely the fastest
    Strategy(1, "cpu"),
    Strategy(2, "cpu"),
    Strategy(3, "cpu"),
    Strategy(3, "cpu", "cpu"),
    Strategy(3, "nvme"),
    Strategy(3, "nvme", "cpu"),
    Strategy(3, "cpu", "nvme"),
    Strategy(3, "nvme", "nvme"),
)

OVERHEAD_TARGET = 0.10  # batch advice aims to bring the offload overhead under this share of the step
MAX_ADVISED_ACCUMULATION = 4096


@dataclass(frozen=True)
class Plan:
    model: ModelProfile
    host: HostProfile
    workload: Workload  # resolved: seq_len filled in
    precision: str  # "bf16" | "fp16"
    ranks_per_node: int
    candidates: tuple[Candidate, ...]
    chosen: Candidate | None
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    pin_memory: bool
    rates: Rates
    advice: dict | None = None  # batch advice when offload dominates the step
    aio: dict | None = None  # the aio settings a probe found best on this host (None: template defaults)
    # PYTORCH_ALLOC_CONF the ranks get (memory.pinned_alloc_conf; None: none): the estimates count torch's
    # pinned-buffer rounding as it sets it, and the launch command sets it (prepare.launch_spec)
    alloc_conf: str | None = None
    # what 16-bit optimizer states would allow when the fp32 ones fit only on NVMe or not at all (states_hint)
    states_hint: str | None = None

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.host.nodes

    @property
    def train_batch_size(self) -> int:
        """DeepSpeed's invariant: train_batch_size = micro x accumulation x world."""
        return self.workload.micro_batch * self.workload.grad_accum * self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.train_batch_size * (self.workload.seq_len or 0)


# ------------------------------------------------------------------------------------------ plan


def resolve_precision(requested: str, host: HostProfile) -> str:
    if requested == "auto":
        return "bf16" if (not host.has_gpu or host.gpus.bf16) else "fp16"
    if requested == "bf16" and host.has_gpu and not host.gpus.bf16:
        cc = ".".join(map(str, host.gpus.compute_capability))
        raise UserInputError(f"--precision bf16: {host.gpus.name} (compute capability {cc}) has no bf16; use fp16")
    if requested == "fp16" and not host.has_gpu:
        raise UserInputError("--precision fp16 is not supported by DeepSpeed's CPU accelerator; use bf16")
    return requested


def resolve_seq_len(workload: Workload, model: ModelProfile) -> int:
    limit = model.max_position_embeddings or DEFAULT_SEQ_LEN
    if workload.seq_len is None:
        return min(DEFAULT_SEQ_LEN, limit)
    if workload.seq_len > limit and not workload.allow_long_seq:
        raise UserInputError(
            f"--seq-len {workload.seq_len} exceeds {model.name}'s max_position_embeddings {limit}; "
            f"use at most {limit}, or add --allow-long-seq if you extended the context yourself"
        )
    return workload.seq_len


def resolve_ranks(workload: Workload, host: HostProfile) -> int:
    if workload.num_gpus is None:
        return host.ranks_per_node
    if host.has_gpu and workload.num_gpus > host.gpus.count:
        raise UserInputError(f"--num-gpus {workload.num_gpus}, but the host has {host.gpus.count} GPU(s) per node")
    return workload.num_gpus


def make_plan(
    model: ModelProfile,
    host: HostProfile,
    workload: Workload,
    rates: Rates | None = None,
    aio: dict | None = None,
    alloc_conf: str | None = None,
    calibration: dict | None = None,
    deepspeed_version: tuple[int, int, int] | None = None,
) -> Plan:
    """Every allowed candidate sized and timed; the fastest predicted that fits is chosen (ties keep the
    framework's order). `rates` default to the host's described or nominal figures; `alloc_conf` is the
    PYTORCH_ALLOC_CONF the ranks will get (memory.pinned_alloc_conf decides it; None: torch's defaults);
    `calibration` (strategy label -> calibration.Factors): finished runs on this host, whose measured phases
    scale the candidates of their strategy (the first-principles figures stay beside them); `deepspeed_version`:
    the installed DeepSpeed's, which gates the newer modes (features.py; None: all of them)."""
    if "nvme" in (workload.offload_optimizer, workload.offload_param) and host.nvme is None:
        raise UserInputError("NVMe offload needs --nvme-path DIR (a folder on a fast local NVMe drive)")
    if rates is None:
        from launcher.inspection.rates import resolve_rates

        rates = resolve_rates(host, None)
    precision = resolve_precision(workload.precision, host)
    workload = replace(workload, seq_len=resolve_seq_len(workload, model))
    ranks = resolve_ranks(workload, host)
    rates = network.with_links(rates, host, ranks)  # the collectives' links (plan/network.py)
    world = ranks * host.nodes

    if workload.optimizer_states == "bf16" and precision != "bf16":
        raise UserInputError(
            f"--optimizer-states bf16 needs bf16 training, and {host.gpus.name} has no bf16: drop it"
            if host.has_gpu
            else "--optimizer-states bf16 needs bf16 training: drop --precision fp16"
        )
    candidates = [
        estimate_candidate(
            model, host, workload, strategy, rates, world, ranks, alloc_conf=alloc_conf, calibration=calibration
        )
        for strategy in map(workload.shaped, CANDIDATE_ORDER)
        if workload.allows(strategy) and runs_here(strategy, host)
    ]
    if features.supports("super_offload", deepspeed_version) and (
        superchip := super_offload_candidate(model, host, workload, rates, world, ranks, alloc_conf, calibration)
    ):
        full = [i for i, c in enumerate(candidates) if c.strategy == workload.shaped(FULL_OFFLOAD)]
        candidates.insert(full[0] if full else len(candidates), superchip)
    partial = None
    if features.supports("offload_ratio", deepspeed_version):
        partial = partial_offload_candidate(model, host, workload, rates, world, ranks, alloc_conf, calibration)
    if partial is not None:  # in the framework's order: before the full ZeRO-3 optimizer offload it refines
        full = [i for i, c in enumerate(candidates) if c.strategy == workload.shaped(FULL_OFFLOAD)]
        candidates.insert(full[0] if full else len(candidates), partial)
    for index, variant in reversed(
        activation_offload_variants(model, host, workload, candidates, rates, world, ranks, alloc_conf, calibration)
    ):
        candidates.insert(index + 1, variant)  # right after the candidate it rescues
    if not candidates and workload.zenflow and not host.has_gpu and workload.zero_stage == "3":
        raise UserInputError(
            "--zenflow at ZeRO-3 needs a CUDA GPU (DeepSpeed's ZenFlow allocates its ZeRO-3 buffers on 'cuda'); on "
            "the CPU accelerator use --zero-stage 1 or 2"
        )
    fitting = [c for c in candidates if c.fits]
    ranked = sorted(fitting, key=lambda c: (round(c.timing.expected_seconds, 9), candidates.index(c)))
    chosen = ranked[0] if ranked else None
    reasons, warnings = _explain(candidates, chosen, host, world, model.params)
    if chosen is not None and (line := network.collectives_reason(chosen.timing, rates, world, ranks)):
        reasons.append(line)
    if note := network.nominal_network_note(host):
        warnings.append(note)
    if len(ranked) > 1:
        runner_up = ranked[1]
        slower = runner_up.timing.expected_seconds / chosen.timing.expected_seconds - 1
        reasons.append(
            f"runner-up {runner_up.strategy.label} would take {runner_up.timing.expected_seconds:.3g} s/step "
            f"({slower:+.0%})"
        )
    calibrated = [c.strategy.label for c in candidates if c.timing.calibration]
    if calibrated:
        reasons.append(
            f"calibrated by finished runs on this host (their measured / predicted phases): {', '.join(calibrated)}; "
            "the other candidates are first-principles predictions"
        )
    if chosen is not None and "nvme" in (chosen.strategy.offload_optimizer, chosen.strategy.offload_param):
        reasons.append(
            f"aio {', '.join(f'{k} {v}' for k, v in sorted(aio.items()))}: the fastest of this host's probe sweep"
            if aio
            else "aio: DeepSpeed's block size and queue depth, a thread per core of the rank (no probe sweep of "
            "this drive: `offload-launch probe --nvme-path DIR` measures one)"
        )
    if chosen is not None and chosen.strategy.zenflow_interval:
        plain = estimate_candidate(
            model,
            host,
            replace(workload, zenflow=False),
            replace(chosen.strategy, zenflow_interval=0),
            rates,
            world,
            ranks,
            alloc_conf=alloc_conf,
        )
        reasons.append(zenflow_reason(chosen, plain))
    hint = None
    if features.supports("bf16_optimizer_states", deepspeed_version):
        hint = states_hint(model, host, workload, chosen, rates, world, ranks, alloc_conf)
    if hint:
        reasons.append(hint)
    pin = True
    advice = None
    if chosen is not None:
        pin, pin_warning = decide_pin_memory(chosen, host, ranks)
        warnings += pin_warning
        advice = batch_advice(model, host, workload, chosen, rates, world, ranks, alloc_conf)
    return Plan(
        model,
        host,
        workload,
        precision,
        ranks,
        tuple(candidates),
        chosen,
        tuple(reasons),
        tuple(warnings),
        pin,
        rates,
        advice,
        aio,
        alloc_conf,
        hint,
    )


def states_hint(model, host, workload: Workload, chosen, rates, world, ranks, alloc_conf=None) -> str | None:
    """When the fp32 optimizer states fit nowhere, or only on NVMe, and 16-bit ones would fit in CPU RAM
    (memory.py [DS-bf16s]): the fastest such candidate, said in one line. Not chosen unasked: it changes the
    numerics (--optimizer-states bf16 opts in)."""
    if workload.optimizer_states != "fp32" or (chosen is not None and chosen.strategy.offload_optimizer != "nvme"):
        return None
    try:  # the user's pins may exclude them (the optimizer pinned off the CPU, fp16): then no hint
        bf16 = replace(workload, optimizer_states="bf16")
    except UserInputError:
        return None
    if resolve_precision(workload.precision, host) != "bf16":
        return None
    fitting = [
        c
        for c in (
            estimate_candidate(model, host, bf16, strategy, rates, world, ranks, alloc_conf=alloc_conf)
            for strategy in map(bf16.shaped, CANDIDATE_ORDER)
            if bf16.allows(strategy) and strategy.offload_optimizer == "cpu"
        )
        if c.fits
    ]
    if not fitting:
        return None
    best = min(fitting, key=lambda c: c.timing.expected_seconds)
    faster = f", {chosen.timing.expected_seconds / best.timing.expected_seconds:.1f}x faster" if chosen else ""
    return (
        f"with --optimizer-states bf16 (16-bit master weights and Adam moments on the CPU, DeepSpeed >= 0.19.1; "
        f"other numerics, so only when asked) {best.strategy.label.removesuffix(' (bf16 states)')} would fit in "
        f"{fmt_bytes(best.memory.cpu_bytes)} of CPU RAM per node: {best.timing.expected_seconds:.3g} s/step{faster}"
    )


def runs_here(strategy: Strategy, host: HostProfile) -> bool:
    """What DeepSpeed cannot run on this host's accelerator is not a candidate: ZenFlow at ZeRO-3 allocates its
    buffers on 'cuda' (zenflow/engine_stage3.py `update_selected_channels`: torch.zeros(..., device='cuda')), so on
    the CPU accelerator ZenFlow is planned at ZeRO-1/2 only."""
    return host.has_gpu or not (strategy.zenflow_interval and strategy.zero_stage >= 3)


def batch_advice(
    model,
    host,
    workload: Workload,
    chosen: Candidate,
    rates: Rates,
    world: int,
    ranks: int,
    alloc_conf: str | None = None,
) -> dict | None:
    """When offload dominates (seeds: "the batch size decides"), the accumulation - and the micro-batch,
    if memory allows - that brings the offload overhead under 10 %, with tokens/s either way."""
    overhead = chosen.timing.offload_overhead_fraction
    if overhead <= OVERHEAD_TARGET:
        return None
    advice: dict = {
        "offload_overhead_fraction": overhead,
        "tokens_per_s": chosen.timing.tokens_per_s,
        "target_overhead_fraction": OVERHEAD_TARGET,
    }

    def first_under_target(name: str, start: int, limit: int) -> dict | None:
        """Double one knob from its current value, up to `limit`, until the overhead is under the target
        (None when it never gets there, or when the batch stops fitting in memory)."""
        value = start * 2
        while value <= limit:
            trial = estimate_candidate(
                model, host, workload, chosen.strategy, rates, world, ranks, alloc_conf=alloc_conf, **{name: value}
            )
            if not trial.fits:
                return None
            if trial.timing.offload_overhead_fraction <= OVERHEAD_TARGET:
                return {
                    "value": value,
                    "tokens_per_s": trial.timing.tokens_per_s,
                    "offload_overhead_fraction": trial.timing.offload_overhead_fraction,
                }
            value *= 2
        return None

    advice["grad_accum"] = first_under_target("grad_accum", workload.grad_accum, MAX_ADVISED_ACCUMULATION)
    advice["micro_batch"] = first_under_target(
        "micro_batch", workload.micro_batch, workload.micro_batch * MAX_ADVISED_ACCUMULATION
    )
    return advice


def decide_pin_memory(chosen: Candidate, host: HostProfile, ranks: int) -> tuple[bool, list[str]]:
    """pin_memory for the chosen strategy, and what the host's memlock limit means for it. The limit only
    bounds what DeepSpeed mlock()s itself: the aio swap buffers of NVMe offload (`locked_swap_bytes_per_rank`),
    locked whatever pin_memory says; below them the run would die at start-up, so the plan says so."""
    pin = pins_host_memory(chosen.strategy, host)
    need = locked_swap_bytes_per_rank(chosen, ranks)
    if not need or host.memlock_bytes is None or host.memlock_bytes >= need:
        return pin, []
    return pin, [
        f"memlock limit {fmt_bytes(host.memlock_bytes)} < {fmt_bytes(need)} of NVMe swap buffers DeepSpeed "
        "mlocks per rank: the run would stop at start-up; raise it with `ulimit -l unlimited` "
        "(docker: --ulimit memlock=-1)"
    ]


def locked_swap_bytes_per_rank(candidate: Candidate, ranks: int) -> int:
    """What RLIMIT_MEMLOCK must hold per process: the buffers DeepSpeed's swappers allocate with the aio
    handle's new_cpu_locked_tensor (posix_memalign + mlock, csrc/pin_memory/page_alloc.cpp), whatever
    pin_memory says; 0 without NVMe offload. Of memory.py's optimizer swap term (buffer_count + 1 sub-group
    buffers) the buffer_count swap buffers are locked (swap_tensor/utils.py SwapBufferManager); the +1
    gradient buffer is a plain torch.zeros (stage3.py). The parameter swap buffers are locked whole
    (partitioned_param_swapper.py). Not counted: the fp16 reuse buffer `reserve_partitioned_swap_space`
    locks when some parameter sub-groups live only on NVMe (stage3.py)."""
    terms = candidate.memory.cpu_terms
    count = candidate.buckets.optimizer_buffer_count
    optimizer = terms.get("optimizer swap buffers (pinned)", 0) * count // (count + 1)
    return (optimizer + terms.get("param swap buffers (pinned)", 0)) // ranks


def pinned_bytes_per_rank(candidate: Candidate, ranks: int) -> int:
    """What pin_memory would page-lock per process: the offloaded CPU state and the swap buffers."""
    per_node = sum(
        v
        for k, v in candidate.memory.cpu_terms.items()
        if k not in ("process baseline", "model load peak (transient)", "device memory (CPU accelerator)")
    )
    return per_node // ranks


def _explain(candidates, chosen, host, world: int, params: int) -> tuple[list[str], list[str]]:
    reasons: list[str] = []
    warnings: list[str] = list(host.warnings)  # what inspecting the host found (another process on a GPU ...)
    device = "GPU" if host.has_gpu else "CPU-accelerator rank"
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
    m = chosen.memory
    where = [f"{fmt_bytes(m.gpu_bytes_per_device)} per {device}"]
    if m.cpu_bytes:
        where.append(f"{fmt_bytes(m.cpu_bytes)} CPU RAM per node")
    if m.nvme_bytes:
        where.append(f"{fmt_bytes(m.nvme_bytes)} NVMe per node")
    t = chosen.timing
    calibrated = f" (calibrated: {t.calibrated_step_seconds:.3g} s/step)" if t.calibrated_step_seconds else ""
    reasons.append(
        f"chose {chosen.strategy.label}: the fastest predicted that fits ({', '.join(where)}; world size "
        f"{world}; {t.step_seconds:.3g} s/step{calibrated}, {t.tokens_per_s:,.0f} tokens/s, offload overhead "
        f"{t.offload_overhead_fraction:.0%})"
    )
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
    if (
        host.nvme
        and host.nvme.is_nvme is False
        and "nvme" in (chosen.strategy.offload_optimizer, chosen.strategy.offload_param)
    ):
        warnings.append(f"{host.nvme.path} is not on an NVMe device: swapping will be slow")
    if (
        host.nvme
        and host.nvme.aio_usable is False
        and "nvme" in (chosen.strategy.offload_optimizer, chosen.strategy.offload_param)
    ):
        warnings.append(
            "DeepSpeed's async_io op is not usable (libaio missing): install libaio-dev (Debian/Ubuntu) "
            "or libaio-devel (RHEL) before training"
        )
    return reasons, warnings
