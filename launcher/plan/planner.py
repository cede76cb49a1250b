"""The decision framework: enumerate strategies fastest-first, size and time each, pick the fastest
predicted that fits (ties keep the framework's order); the Plan it makes, and its `--json` object.

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
from launcher.plan import capacity, features, methods, network
from launcher.plan.adapters import Lora, adapted
from launcher.plan.candidates import Candidate, Inputs, estimate_candidate, pins_host_memory
from launcher.plan.modes import (
    FULL_OFFLOAD,
    activation_offload_variants,
    partial_offload_candidate,
    super_offload_candidate,
)
from launcher.plan.rates import Rates
from launcher.plan.reasons import explain
from launcher.plan.strategy import Strategy
from launcher.plan.workload import Workload, resolve
from launcher.units import fmt_bytes

__all__ = [
    "CANDIDATE_ORDER",
    "JSON_SCHEMA_VERSION",
    "MAX_ADVISED_ACCUMULATION",
    "OVERHEAD_TARGET",
    "Plan",
    "batch_advice",
    "decide_pin_memory",
    "locked_swap_bytes_per_rank",
    "make_plan",
    "pinned_bytes_per_rank",
    "states_hint",
]

JSON_SCHEMA_VERSION = 1  # Plan.to_json's "version" (docs/json.md)

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

CHOICE_TIE = 1e-4  # predicted steps this close (relative) are a tie: the framework's order decides (choose)
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
    # PYTORCH_ALLOC_CONF the ranks get (host_buffers.pinned_alloc_conf; None: none): the estimates count torch's
    # pinned-buffer rounding as it sets it, and the launch command sets it (prepare.launch_spec)
    alloc_conf: str | None = None
    # what 16-bit optimizer states would allow when the fp32 ones fit only on NVMe or not at all (states_hint)
    states_hint: str | None = None
    lora: Lora | None = None  # the LoRA adapter trained (adapters.py; `model` is then adapters.adapted's profile)
    # the other training method on the same host (_method_advice, methods.py): what a LoRA would cost where full
    # fine-tuning needs offload, or what full fine-tuning would need with --lora
    method_advice: dict | None = None

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

    def to_json(self, ds_config: dict | None) -> dict:
        """The stable `--json` object (docs/json.md). Integers for bytes; strategy fields use DeepSpeed's
        vocabulary."""
        chosen, host, rates = self.chosen, self.host, self.rates
        return {
            "version": JSON_SCHEMA_VERSION,
            "fits": chosen is not None,
            "model": self.model.to_json(),
            "host": host.to_json(),
            "workload": {
                "seq_len": self.workload.seq_len,
                "micro_batch": self.workload.micro_batch,
                "grad_accum": self.workload.grad_accum,
                "world_size": self.world_size,
                "ranks_per_node": self.ranks_per_node,
                "nodes": host.nodes,
                "train_batch_size": self.train_batch_size,
                "tokens_per_step": self.tokens_per_step,
                "precision": self.precision,
                "activation_checkpointing": self.workload.activation_checkpointing,
                "lora": (self.lora.to_json() | {"trainable_params": self.model.trainable_params})
                if self.lora
                else None,
            },
            "strategy": chosen.strategy.to_json() | {"label": chosen.strategy.label} if chosen else None,
            "memory": chosen.memory.to_json() if chosen else None,
            "capacity": {
                "gpu_bytes_per_device": capacity.usable_gpu_bytes(host) if host.has_gpu else None,
                "cpu_bytes": capacity.usable_cpu_bytes(host),
                "nvme_bytes": capacity.usable_nvme_bytes(host) if host.nvme else None,
            },
            "estimates": chosen.timing.to_json() if chosen else None,
            "rates": {
                "compute_flops_per_s": rates.compute_flops_per_s,
                "pcie_bytes_per_s": rates.pcie_bytes_per_s,
                "cpu_adam_params_per_s": rates.cpu_adam_params_per_s,
                "nvme_read_bytes_per_s": rates.nvme_read_bytes_per_s,
                "nvme_write_bytes_per_s": rates.nvme_write_bytes_per_s,
                "network_bytes_per_s": rates.network_bytes_per_s,
                "interconnect_bytes_per_s": rates.interconnect_bytes_per_s,
                "sources": dict(rates.sources),
            },
            "advice": self.advice,
            "method_advice": self.method_advice,
            "candidates": [c.to_json() for c in self.candidates],
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "ds_config": ds_config,
        }


# ------------------------------------------------------------------------------------------ plan


def make_plan(
    model: ModelProfile,
    host: HostProfile,
    workload: Workload,
    rates: Rates,
    aio: dict | None = None,
    alloc_conf: str | None = None,
    calibration: dict | None = None,
    deepspeed_version: tuple[int, int, int] | None = None,
    buckets: dict | None = None,
    advise_methods: bool = True,
) -> Plan:
    """Every allowed candidate sized and timed; the fastest predicted that fits is chosen (ties keep the
    framework's order). `rates`: the host's (job/planning.py: measured, described or nominal figures); `alloc_conf`
    is the PYTORCH_ALLOC_CONF the ranks will get (host_buffers.pinned_alloc_conf decides it; None: torch's defaults);
    `calibration` (strategy label -> calibration.Factors): finished runs on this host, whose measured phases
    scale the candidates of their strategy (the first-principles figures stay beside them); `deepspeed_version`:
    the installed DeepSpeed's, which gates the newer modes (features.py; None: all of them); `buckets`: the buffer
    sizes a user's ds_config sets (config/merge.bucket_pins), which the candidates are sized with;
    `advise_methods`: say what the other training method would cost (methods.py), planned here once more."""
    resolved = resolve(workload, model, host)
    base_model, model = model, adapted(model, resolved.lora)
    ranks = resolved.ranks_per_node
    linked = network.with_links(rates, host, ranks)  # the collectives' links (plan/network.py)
    inputs = Inputs(model, host, resolved.workload, linked, resolved.world, ranks, alloc_conf, calibration, buckets)
    candidates = _candidates(inputs, deepspeed_version)
    ranked = choose(candidates)
    chosen = ranked[0] if ranked else None
    hint = None
    if features.supports("bf16_optimizer_states", deepspeed_version):
        hint = states_hint(inputs, chosen, resolved.precision)
    reasons, warnings = explain(inputs, candidates, ranked, aio, hint)
    pin = True
    advice = None
    if chosen is not None:
        pin, pin_warning = decide_pin_memory(chosen, host, ranks)
        warnings += pin_warning
        advice = batch_advice(inputs, chosen)
    other = None
    if advise_methods:
        other = _method_advice(base_model, host, workload, rates, aio, alloc_conf, deepspeed_version, chosen)
    return Plan(
        model,
        host,
        resolved.workload,
        resolved.precision,
        ranks,
        tuple(candidates),
        chosen,
        tuple(reasons),
        tuple(warnings),
        pin,
        linked,
        advice,
        aio,
        alloc_conf,
        hint,
        resolved.lora,
        other,
    )


def _method_advice(
    model: ModelProfile,
    host: HostProfile,
    workload: Workload,
    rates: Rates,
    aio: dict | None,
    alloc_conf: str | None,
    deepspeed_version: tuple[int, int, int] | None,
    chosen: Candidate | None,
) -> dict | None:
    """methods.py: the other training method planned on the same host (`model` without the adapter), in a few
    figures; None when it is not worth saying."""
    if not methods.worth_advising(workload, chosen is not None and chosen.strategy.offloads, chosen is not None):
        return None
    other = methods.other_method(workload)
    try:
        alternative = make_plan(
            model, host, other, rates, aio, alloc_conf, deepspeed_version=deepspeed_version, advise_methods=False
        )
    except UserInputError:  # the other method does not apply here (a model with no linear layer to adapt)
        return None
    return methods.summary(alternative)


def _candidates(inputs: Inputs, deepspeed_version: tuple[int, int, int] | None) -> list[Candidate]:
    """The framework's strategies this workload allows and this host runs, in its order, with the newer modes
    the installed DeepSpeed has (modes.py) each where it belongs in that order."""
    workload, host = inputs.workload, inputs.host
    candidates = [
        estimate_candidate(inputs, strategy)
        for strategy in map(workload.shaped, CANDIDATE_ORDER)
        if workload.allows(strategy) and runs_here(strategy, host)
    ]
    full = workload.shaped(FULL_OFFLOAD)
    if features.supports("super_offload", deepspeed_version) and (superchip := super_offload_candidate(inputs)):
        candidates.insert(_index_of(candidates, full), superchip)
    partial = None
    if features.supports("offload_ratio", deepspeed_version):
        partial = partial_offload_candidate(inputs)
    if partial is not None:  # in the framework's order: before the full ZeRO-3 optimizer offload it refines
        candidates.insert(_index_of(candidates, full), partial)
    for index, variant in reversed(activation_offload_variants(inputs, candidates)):
        candidates.insert(index + 1, variant)  # right after the candidate it rescues
    if not candidates and workload.zenflow and not host.has_gpu and workload.zero_stage == "3":
        raise UserInputError(
            "--zenflow at ZeRO-3 needs a CUDA GPU (DeepSpeed's ZenFlow allocates its ZeRO-3 buffers on 'cuda'); on "
            "the CPU accelerator use --zero-stage 1 or 2"
        )
    return candidates


def _index_of(candidates: list[Candidate], strategy: Strategy) -> int:
    """Where `strategy`'s candidate stands (the end when there is none)."""
    full = [i for i, c in enumerate(candidates) if c.strategy == strategy]
    return full[0] if full else len(candidates)


def choose(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates that fit, fastest predicted first (ties keep the framework's order): the first is the
    plan's choice, the second its runner-up. Candidates within CHOICE_TIE of the fastest are a tie, which the
    framework's order breaks: a prediction 0.01 % faster is below what the model can tell, and must not buy more
    offload (a 3-parameter-tensor Llama on 4 nodes with its parameters on the CPU: the optimizer there too was
    predicted 1.4e-6 of the step faster, no upload of the updated weights against a GPU Adam step)."""
    fitting = [c for c in candidates if c.fits]
    ranked = sorted(fitting, key=lambda c: (round(c.timing.expected_seconds, 9), candidates.index(c)))
    if not ranked:
        return ranked
    fastest = ranked[0].timing.expected_seconds
    first = min((c for c in ranked if c.timing.expected_seconds <= fastest * (1 + CHOICE_TIE)), key=candidates.index)
    return [first, *(c for c in ranked if c is not first)]


def states_hint(inputs: Inputs, chosen: Candidate | None, precision: str) -> str | None:
    """When the fp32 optimizer states fit nowhere, or only on NVMe, and 16-bit ones would fit in CPU RAM
    (strategy.py [DS-bf16s]): the fastest such candidate, said in one line. Not chosen unasked: it changes the
    numerics (--optimizer-states bf16 opts in)."""
    workload = inputs.workload
    if workload.optimizer_states != "fp32" or (chosen is not None and chosen.strategy.offload_optimizer != "nvme"):
        return None
    try:  # the user's pins may exclude them (the optimizer pinned off the CPU, fp16): then no hint
        bf16 = replace(workload, optimizer_states="bf16")
    except UserInputError:
        return None
    if precision != "bf16":
        return None
    fitting = [
        c
        for c in (
            estimate_candidate(inputs.uncalibrated(bf16), strategy)
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


def batch_advice(inputs: Inputs, chosen: Candidate) -> dict | None:
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
            trial = estimate_candidate(inputs.uncalibrated(), chosen.strategy, **{name: value})
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

    workload = inputs.workload
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
    pin_memory says; 0 without NVMe offload. Of host_buffers.py's optimizer swap term (buffer_count + 1 sub-group
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
        if k not in ("process baseline", "device memory (CPU accelerator)")
    )
    return per_node // ranks
