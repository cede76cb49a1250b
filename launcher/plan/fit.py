"""Whether a plan fits, said in one line: the one-line summary, the candidate that misses by least, the exit-3 error."""

from __future__ import annotations

from launcher.errors import DoesNotFit
from launcher.plan import capacity
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes


def _tiers(candidate, host) -> list[tuple[str, int, int]]:
    """(tier, bytes needed, bytes usable) for each tier `candidate` uses on `host`."""
    m = candidate.memory
    tiers = [("CPU RAM", m.cpu_bytes, capacity.usable_cpu_bytes(host))]
    if host.has_gpu:
        tiers.append(("GPU", m.gpu_bytes_per_device, capacity.usable_gpu_bytes(host)))
    if m.nvme_bytes:
        tiers.append(("NVMe", m.nvme_bytes, capacity.usable_nvme_bytes(host) if host.nvme else 0))
    return tiers


def closest_shortfall(plan: Plan) -> str:
    """The candidate that misses by the least (its largest need / capacity over its tiers), with its problems and
    by how much its tightest tier is short."""

    def overshoot(candidate) -> float:
        return max(
            need / max(1, usable) if usable else float("inf") for _, need, usable in _tiers(candidate, plan.host)
        )

    if not plan.candidates:
        return "no strategy matches the pinned --zero-stage/--offload-* combination"
    best = min(plan.candidates, key=overshoot)
    tier, need, usable = max(_tiers(best, plan.host), key=lambda t: t[1] / max(1, t[2]) if t[2] else float("inf"))
    short = f"; {fmt_bytes(need - usable)} short of {tier}" if need > usable and usable else ""
    return f"{best.strategy.label} ({'; '.join(best.problems)}{short})"


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
