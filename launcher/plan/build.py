"""From settings to a Plan: inspect the model and the host the settings name, look up the measured rates,
and call the (pure) planner. Also the words for a plan that does not fit.

Heavy imports (transformers, psutil, NVML) stay inside the functions so `--help` stays instant.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from launcher.errors import DoesNotFit, UserInputError
from launcher.files import tool_cache_dir
from launcher.plan.planner import Plan
from launcher.plan.workload import Workload
from launcher.settings import DECLARATIONS, Settings
from launcher.units import fmt_bytes


def hostfile_nodes(path: str) -> int:
    """Machines listed in a DeepSpeed hostfile ('hostname slots=N', '#' comments)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserInputError(
            f"--hostfile {path}: {exc.strerror}; pass a file with one 'hostname slots=N' per line"
        ) from None
    hosts = [line.split()[0] for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not hosts:
        raise UserInputError(f"--hostfile {path} lists no hosts; write one 'hostname slots=N' per line")
    return len(hosts)


def workload(settings: Settings) -> Workload:
    """The planner's view of the settings: every Workload field that is a setting, by the same name."""
    return Workload(**{f.name: getattr(settings, f.name) for f in fields(Workload) if f.name in DECLARATIONS})


def build_plan(settings: Settings) -> Plan:
    """Inspect the host (live, or the described one) and the model, then plan."""
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
        host = replace(host, nodes=hostfile_nodes(settings.hostfile))
    model = inspect_model(settings.model, trust_remote_code=settings.trust_remote_code, cache_dir=tool_cache_dir())
    rates, aio = host_rates(host, settings.nvme_path, model.hidden_size)
    return make_plan(model, host, workload(settings), rates, aio, alloc_conf(host, settings))


def installed_torch_version() -> str | None:
    """The installed torch's version, from its metadata (torch itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
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


def host_rates(host, nvme_path: str | None, width: int):
    """Rates for the step-time model: this host's cached probe (if it is this host), else described/nominal;
    and the aio settings the probe found best for the NVMe folder it measured."""
    from launcher.inspection import rates

    cached = None
    if host.source == "live":
        cached = rates.load_cached(rates.cache_path(tool_cache_dir()), rates.host_id())
    aio = None
    if cached and cached.aio and nvme_path and cached.details.get("nvme_path") == nvme_path:
        aio = cached.aio
    return rates.resolve_rates(host, cached, width), aio


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
        "see the candidates table",
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
