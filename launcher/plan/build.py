"""From settings to a Plan: inspect the model and the host the settings name, look up the measured rates,
and call the (pure) planner. Also the words for a plan that does not fit.

Heavy imports (transformers, psutil, NVML) stay inside the functions so `--help` stays instant.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from launcher.errors import DoesNotFit, UserInputError
from launcher.files import tool_cache_dir
from launcher.plan import features
from launcher.plan.planner import Plan
from launcher.plan.timing import Rates
from launcher.plan.workload import Workload
from launcher.settings import DECLARATIONS, Settings
from launcher.units import fmt_bytes


def hostfile_hosts(path: str) -> list[str]:
    """The hosts of a DeepSpeed hostfile ('hostname slots=N' per line, '#' comments), in order."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserInputError(
            f"--hostfile {path}: {exc.strerror}; pass a file with one 'hostname slots=N' per line"
        ) from None
    hosts = [line.split()[0] for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not hosts:
        raise UserInputError(f"--hostfile {path} lists no hosts; write one 'hostname slots=N' per line")
    return hosts


def workload(settings: Settings) -> Workload:
    """The planner's view of the settings: every Workload field that is a setting, by the same name."""
    return Workload(**{f.name: getattr(settings, f.name) for f in fields(Workload) if f.name in DECLARATIONS})


def build_plan(settings: Settings, *, measure: bool = False, log=None) -> Plan:
    """Inspect the host (live, or the described one) and the model, then plan. `measure` (a real run on this
    host): rates the cache lacks are measured first (`host_rates`), with progress lines to `log`."""
    from launcher.inspection.host import inspect_host
    from launcher.inspection.hostspec import load_host_spec, with_nvme_path
    from launcher.inspection.model import inspect_model
    from launcher.plan.planner import make_plan

    if settings.model is None:
        raise UserInputError("missing --model ID|DIR; pass one, or --recipe NAME (offload-launch recipes lists them)")
    if settings.host_spec:
        host = load_host_spec(settings.host_spec)
        if settings.nvme_path:
            host = with_nvme_path(host, settings.nvme_path)
    else:
        host = inspect_host(settings.nvme_path)
    if settings.hostfile:
        host = replace(host, nodes=len(hostfile_hosts(settings.hostfile)))
    model = inspect_model(settings.model, trust_remote_code=settings.trust_remote_code, cache_dir=tool_cache_dir())
    asked = workload(settings)
    identity = None
    if host.source == "live":  # this machine: its probe, passes and finished runs are keyed by its identity
        from launcher.inspection.rates import host_id

        identity = host_id()
    rates, aio = host_rates(
        host,
        identity,
        settings.nvme_path,
        model,
        asked,
        measure=measure,
        log=log or (lambda _line: None),
        trust_remote_code=settings.trust_remote_code,
    )
    calibration = host_calibration(host, identity, model.name, asked)
    deepspeed = installed_deepspeed_version()
    if asked.offload_ratio is not None and asked.offload_ratio < 1:
        features.require("offload_ratio", deepspeed, "--offload-ratio")
    if asked.optimizer_states == "bf16":
        features.require("bf16_optimizer_states", deepspeed, "--optimizer-states bf16")
    if asked.zenflow:
        features.require("zenflow", deepspeed, "--zenflow")
    plan = make_plan(
        model, host, asked, rates, aio, alloc_conf(host, settings), calibration, deepspeed_version=deepspeed
    )
    if host.source == "live" and not measure and (note := nominal_note(host, rates)):
        plan = replace(plan, warnings=(*plan.warnings, note))
    return plan


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


def installed_torch_version() -> str | None:
    """The installed torch's version, from its metadata (torch itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def installed_deepspeed_version() -> tuple[int, int, int] | None:
    """The installed DeepSpeed's (major, minor, patch), from its metadata (deepspeed itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return features.parse_version(version("deepspeed"))
    except PackageNotFoundError:
        return None


def alloc_conf(host, settings: Settings) -> str | None:
    """The PYTORCH_ALLOC_CONF the ranks will get (memory.pinned_alloc_conf): decided once, here, for the plan's
    estimates and the launch command alike. The ranks run this machine's torch and environment, also when the
    plan is for a described host (--dry-run of it here); with a hostfile they run on other machines."""
    import os

    from launcher.plan import memory

    return memory.pinned_alloc_conf(
        host.accelerator, os.environ, installed_torch_version(), local_ranks=settings.hostfile is None
    )


def host_rates(
    host,
    identity: str | None,
    nvme_path: str | None,
    model,
    asked: Workload,
    *,
    measure: bool,
    log,
    trust_remote_code=False,
):
    """Rates for the step-time model: this host's probe (cached; measured first when `measure` and there is
    none) and the passes at the model's shapes (likewise), else described/nominal figures; and the aio
    settings the probe found best for the NVMe folder it measured. A described host (`identity` None) is never
    measured."""
    from launcher.inspection import rates

    cached = passes = None
    if identity is not None:
        cached = rates.load_cached(rates.cache_path(tool_cache_dir()), identity)
        unprobed_nvme = bool(nvme_path) and (cached is None or cached.details.get("nvme_path") != nvme_path)
        if measure and (cached is None or unprobed_nvme):
            what = "this host" if cached is None else f"the NVMe folder {nvme_path}"
            log(f"no measured rates for {what} yet: measuring them once (offload-launch probe; cached) ...")
            cached = rates.measure_and_cache(nvme_path, quick=False, log=log, for_run=True)[0]
        if measure and cached is not None and "zero_tensor_seconds" not in cached.details:
            log("no measured ZeRO per-tensor cost for this host yet: measuring it once (cached) ...")
            cached = rates.with_zero_costs(cached, rates.cache_path(tool_cache_dir()), log)
        if cached is not None:
            first = rates.resolve_rates(host, cached, model.hidden_size)
            passes = measured_passes(host, model, asked, first, identity, measure, log, trust_remote_code)
    aio = None
    if cached and cached.aio and nvme_path and cached.details.get("nvme_path") == nvme_path:
        aio = cached.aio
    return rates.resolve_rates(host, cached, model.hidden_size, passes), aio


def host_calibration(host, identity: str | None, model: str, asked: Workload) -> dict | None:
    """What finished runs of this model with as many ranks on this very host measured against their predictions
    (plan/calibration.py), by strategy; None for a described host (`identity` None)."""
    if identity is None:
        return None
    from launcher.plan import calibration
    from launcher.plan.planner import resolve_ranks

    world = resolve_ranks(asked, host) * host.nodes
    return calibration.load(tool_cache_dir(), identity, model, world) or None


def measured_passes(
    host, model, asked: Workload, first: Rates, identity: str, measure: bool, log, trust_remote_code: bool
) -> dict | None:
    """The passes at the model's shapes and the workload's tokens, on the device and threads a rank gets."""
    from launcher.inspection.passes import measure_passes
    from launcher.plan.planner import resolve_ranks, resolve_seq_len

    ranks = resolve_ranks(asked, host)
    return measure_passes(
        model,
        micro_batch=asked.micro_batch,
        seq_len=resolve_seq_len(asked, model),
        recompute=asked.activation_checkpointing,
        device="cuda" if host.has_gpu else "cpu",
        threads=max(1, host.cpu_cores // ranks),
        flops_per_s=first.compute_flops_per_s,
        host_id=identity,
        cache_dir=tool_cache_dir(),
        log=log,
        measure=measure,
        trust_remote_code=trust_remote_code,
    )


def closest_shortfall(plan: Plan) -> str:
    """The candidate that misses by the least (largest need / capacity over its tiers), with its numbers."""
    from launcher.plan import capacity

    def overshoot(candidate) -> float:
        m, host = candidate.memory, plan.host
        ratios = [m.cpu_bytes / max(1, capacity.usable_cpu_bytes(host))]
        if host.has_gpu:
            ratios.append(m.gpu_bytes_per_device / max(1, capacity.usable_gpu_bytes(host)))
        if m.nvme_bytes:
            ratios.append(m.nvme_bytes / max(1, capacity.usable_nvme_bytes(host)) if host.nvme else float("inf"))
        return max(ratios)

    if not plan.candidates:
        return "no strategy matches the pinned --zero-stage/--offload-* combination"
    best = min(plan.candidates, key=overshoot)
    return f"{best.strategy.label} ({'; '.join(best.problems)})"


def does_not_fit(plan: Plan) -> DoesNotFit:
    """The exit-3 error for a plan with no fitting candidate."""
    return DoesNotFit(
        f"{plan.model.name} does not fit this host with any allowed strategy; closest: {closest_shortfall(plan)}; "
        + (f"{plan.states_hint}; " if plan.states_hint else "")
        + "see the candidates table",
        plan,
    )


def fit_summary(plan: Plan) -> str:
    """One line: the chosen strategy and what it needs per tier (or that nothing fits)."""
    if plan.chosen is None:
        return "does not fit with any strategy (offload-launch --dry-run shows why)"
    m = plan.chosen.memory
    parts = [
        f"GPU {fmt_bytes(m.gpu_bytes_per_device)} per device" if plan.host.has_gpu else None,
        f"CPU {fmt_bytes(m.cpu_bytes)} per node",
        f"NVMe {fmt_bytes(m.nvme_bytes)}" if m.nvme_bytes else None,
    ]
    return f"{plan.chosen.strategy.label}: " + ", ".join(p for p in parts if p)
