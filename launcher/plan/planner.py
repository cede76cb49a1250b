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
from launcher.plan import features, memory, timing
from launcher.plan.calibration import calibrate
from launcher.plan.capacity import (
    fit_problems,
    model_shape,
    size_buckets,
)
from launcher.plan.memory import Buckets, MemoryEstimate, Strategy
from launcher.plan.timing import Rates, StepEstimate
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
class Candidate:
    strategy: Strategy
    buckets: Buckets
    memory: MemoryEstimate
    problems: tuple[str, ...]  # why it does not fit (empty when it fits)
    timing: StepEstimate

    @property
    def fits(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            **self.strategy.to_json(),
            "label": self.strategy.label,
            "fits": self.fits,
            "problems": list(self.problems),
            **self.memory.to_json(),
            "estimates": self.timing.to_json(),
        }


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


def step_shape(model, workload: Workload, micro_batch: int, grad_accum: int) -> timing.Shape:
    """What the step-time model needs of the model and the workload."""
    return timing.Shape(
        params=model.params,
        compute_params=model.compute_params,
        layers=model.num_layers,
        hidden=model.hidden_size,
        param_tensors=len(model.param_numels),
        seq_len=workload.seq_len,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        recompute=workload.activation_checkpointing,
        vocab=model.vocab_size,
    )


def estimate_candidate(
    model,
    host,
    workload: Workload,
    strategy: Strategy,
    rates: Rates,
    world: int,
    ranks: int,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    alloc_conf: str | None = None,
    calibration: dict | None = None,
) -> Candidate:
    """Size and time one strategy (optionally at another micro-batch / accumulation, for advice). `alloc_conf`:
    the ranks' PYTORCH_ALLOC_CONF (Plan.alloc_conf), which decides how torch rounds the pinned buffers;
    `calibration`: strategy label -> calibration.Factors from finished runs on this host."""
    micro_batch = micro_batch or workload.micro_batch
    grad_accum = grad_accum or workload.grad_accum
    buckets = size_buckets(model, host, strategy, world, ranks)
    pinned = pins_host_memory(strategy, host)
    shape = model_shape(model, buckets)
    estimate = memory.estimate(
        shape,
        strategy,
        buckets,
        world=world,
        ranks_per_node=ranks,
        seq_len=workload.seq_len,
        micro_batch=micro_batch,
        checkpointing=workload.activation_checkpointing,
        has_gpu=host.has_gpu,
        pin_memory=pinned,
        pinned_round_limit=memory.pinned_round_limit(alloc_conf),
        grad_accum=grad_accum,
    )
    # [Twin-Flow] on the CPU accelerator the "GPU" share is CPU memory that CPU-Adam steps: timed as a full offload
    gpu_share = memory.optimizer_gpu_share(shape, strategy, buckets, world) if host.has_gpu else 0.0
    step = timing.estimate_step(
        step_shape(model, workload, micro_batch, grad_accum),
        strategy,
        rates,
        world=world,
        ranks_per_node=ranks,
        has_gpu=host.has_gpu,
        pinned=pinned,
        gpu_share=gpu_share,
        pipelined_groups=-(-model.params // world // buckets.sub_group_size) if buckets.pipeline else 0,
    )
    step = calibrate(step, (calibration or {}).get(strategy.label))
    return Candidate(strategy, buckets, estimate, fit_problems(strategy, estimate, host), step)


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
        if workload.allows(strategy)
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
    fitting = [c for c in candidates if c.fits]
    ranked = sorted(fitting, key=lambda c: (round(c.timing.expected_seconds, 9), candidates.index(c)))
    chosen = ranked[0] if ranked else None
    reasons, warnings = _explain(candidates, chosen, host, world, model.params)
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


FULL_OFFLOAD = Strategy(3, "cpu")  # the candidate a partial offload refines


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


def pins_host_memory(strategy: Strategy, host: HostProfile) -> bool:
    """pin_memory for the offloaded buffers: on with a GPU (DeepSpeed's default since 0.19.5), whatever
    RLIMIT_MEMLOCK says. torch pins through its CUDA caching host allocator (cudaHostAlloc, or
    cudaHostRegister with pinned_use_cuda_host_register), and the NVIDIA driver locks those pages itself
    (open-gpu-kernel-modules os-mlock.c `os_lock_user_pages`: get_user_pages, no RLIMIT_MEMLOCK accounting),
    not through mlock(2), so `ulimit -l` does not bound them. Off on the CPU accelerator: nothing to DMA."""
    return host.has_gpu or not strategy.offloads


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
            f"PCIe moves >= 4 B/param per optimizer step ({fmt_bytes(4 * params)}, [seeds])"
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
