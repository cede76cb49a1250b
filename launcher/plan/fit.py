"""Whether a plan fits, said in one line: the one-line summary, the candidate that misses by least, the exit-3 error."""

from __future__ import annotations

from launcher.errors import DoesNotFit
from launcher.plan import capacity
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes


def closest_shortfall(plan: Plan) -> str:
    """The candidate that misses by the least (largest need / capacity over its tiers), with its numbers."""

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
