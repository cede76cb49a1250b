"""Render a Plan for people (text tables) and for programs (the `--json` contract, documented in README)."""

from __future__ import annotations

import json

from launcher import plan as planning
from launcher.plan import Plan
from launcher.units import fmt_bytes, fmt_count

JSON_SCHEMA_VERSION = 1


def plan_json(plan: Plan, ds_config: dict | None) -> dict:
    """The stable `--json` object. Integers for bytes; strategy fields use DeepSpeed's vocabulary."""
    chosen = plan.chosen
    return {
        "version": JSON_SCHEMA_VERSION,
        "fits": chosen is not None,
        "model": plan.model.to_json(),
        "host": plan.host.to_json(),
        "workload": {
            "seq_len": plan.workload.seq_len,
            "micro_batch": plan.workload.micro_batch,
            "grad_accum": plan.workload.grad_accum,
            "world_size": plan.world_size,
            "ranks_per_node": plan.ranks_per_node,
            "nodes": plan.host.nodes,
            "train_batch_size": plan.train_batch_size,
            "tokens_per_step": plan.tokens_per_step,
            "precision": plan.precision,
            "activation_checkpointing": plan.workload.activation_checkpointing,
        },
        "strategy": chosen.strategy.to_json() | {"label": chosen.strategy.label} if chosen else None,
        "memory": chosen.memory.to_json() if chosen else None,
        "capacity": {
            "gpu_bytes_per_device": planning.usable_gpu_bytes(plan.host) if plan.host.has_gpu else None,
            "cpu_bytes": planning.usable_cpu_bytes(plan.host),
            "nvme_bytes": planning.usable_nvme_bytes(plan.host) if plan.host.nvme else None,
        },
        "estimates": chosen.timing.to_json() if chosen else None,
        "rates": {
            "compute_flops_per_s": plan.rates.compute_flops_per_s,
            "pcie_bytes_per_s": plan.rates.pcie_bytes_per_s,
            "cpu_adam_params_per_s": plan.rates.cpu_adam_params_per_s,
            "nvme_read_bytes_per_s": plan.rates.nvme_read_bytes_per_s,
            "nvme_write_bytes_per_s": plan.rates.nvme_write_bytes_per_s,
            "sources": dict(plan.rates.sources),
        },
        "advice": plan.advice,
        "candidates": [c.to_json() for c in plan.candidates],
        "reasons": list(plan.reasons),
        "warnings": list(plan.warnings),
        "ds_config": ds_config,
    }


def _cell(n: int) -> str:
    return fmt_bytes(n) if n else "-"


def plan_text(plan: Plan, ds_config: dict | None, *, show_config: bool = True) -> str:
    m, h, w = plan.model, plan.host, plan.workload
    lines = []
    lines.append(f"Model     {m.name}  [{m.architecture}, {m.source} config]")
    lines.append(
        f"          {fmt_count(m.params)} params; largest tensor {m.largest_param_name} = "
        f"{m.largest_param_numel:,}; {m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size}"
    )
    if h.has_gpu:
        gpus = f"{h.gpus.count} x {h.gpus.name} ({fmt_bytes(h.gpus.memory_bytes)})"
        link = f"PCIe {h.pcie_generation or '?'} x{h.pcie_width or '?'} ~{h.pcie_bytes_per_s / 1e9:.0f} GB/s"
    else:
        gpus, link = "no GPU -> DeepSpeed CPU accelerator", "no PCIe transfers"
    memlock = "unlimited" if h.memlock_bytes is None else fmt_bytes(h.memlock_bytes)
    nodes = f"{h.nodes} nodes x " if h.nodes > 1 else ""
    lines.append(f"Host      {nodes}{gpus}; {link}  [{h.source}]")
    lines.append(
        f"          RAM {fmt_bytes(h.cpu_memory_bytes)} ({fmt_bytes(h.cpu_memory_available_bytes)} available), "
        f"{h.cpu_cores} cores, memlock {memlock}"
        + (f", NVMe {h.nvme.path} {fmt_bytes(h.nvme.free_bytes)} free" if h.nvme else "")
    )
    lines.append(
        f"Workload  seq {w.seq_len} x micro-batch {w.micro_batch} x accumulation {w.grad_accum} x world "
        f"{plan.world_size} = {plan.tokens_per_step:,} tokens/step; {plan.precision}; activation "
        f"checkpointing {'on' if w.activation_checkpointing else 'off'}"
    )
    lines.append("")
    usable_gpu = planning.usable_gpu_bytes(h) if h.has_gpu else None
    usable_nvme = planning.usable_nvme_bytes(h) if h.nvme else None
    gpu_head = "GPU/device" if h.has_gpu else "per rank*"
    header = (
        f"  {'strategy':<34}{gpu_head:>13}{'CPU/node':>13}{'NVMe/node':>13}  fits"
        f"{'s/step':>10}{'tokens/s':>11}{'offload':>9}"
    )
    lines.append(
        "Candidates (bytes needed; usable: "
        f"GPU {fmt_bytes(usable_gpu) if usable_gpu else '-'}, "
        f"CPU {fmt_bytes(planning.usable_cpu_bytes(h))}, "
        f"NVMe {fmt_bytes(usable_nvme) if usable_nvme is not None else '-'})"
    )
    lines.append(header)
    for c in plan.candidates:
        mark = ">" if c is plan.chosen else " "
        fits = "yes" if c.fits else "no"
        t = c.timing
        lines.append(
            f"{mark} {c.strategy.label:<34}{_cell(c.memory.gpu_bytes_per_device):>13}"
            f"{_cell(c.memory.cpu_bytes):>13}{_cell(c.memory.nvme_bytes):>13}  {fits:<4}"
            f"{t.step_seconds:>10.3g}{t.tokens_per_s:>11,.0f}{t.offload_overhead_fraction:>9.0%}"
        )
    if not h.has_gpu:
        lines.append("  * CPU accelerator: the per-rank device memory is CPU RAM and is included in CPU/node")
    lines.append("")
    if plan.chosen:
        lines.append(f"Choice    {plan.chosen.strategy.label}")
        lines.append("  where the memory goes (per GPU / CPU node / NVMe node):")
        for tier, terms in (
            ("GPU", plan.chosen.memory.gpu_terms),
            ("CPU", plan.chosen.memory.cpu_terms),
            ("NVMe", plan.chosen.memory.nvme_terms),
        ):
            if terms:
                parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in terms.items() if v)
                lines.append(f"    {tier:<5}{parts}")
        lines.extend(time_lines(plan))
    else:
        lines.append("Choice    nothing fits this host")
    lines.append("Why")
    lines.extend(f"  - {r}" for r in plan.reasons)
    lines.extend(advice_lines(plan))
    if plan.warnings:
        lines.append("Warnings")
        lines.extend(f"  ! {warning}" for warning in plan.warnings)
    if ds_config is not None and show_config:
        lines.append("")
        lines.append("ds_config")
        lines.append(json.dumps(ds_config, indent=2))
    return "\n".join(lines)


def time_lines(plan: Plan) -> list[str]:
    """The predicted step split into compute, PCIe, CPU-Adam and NVMe, and where each rate came from."""
    t, r = plan.chosen.timing, plan.rates
    sources = ", ".join(f"{k} {v}" for k, v in sorted(r.sources.items()))
    return [
        "  predicted step (overlapped copies cost max(compute, copy), the rest adds):",
        f"    compute {t.compute_seconds_per_step:.3g} s | PCIe {fmt_bytes(t.pcie_bytes_per_step)} in "
        f"{t.pcie_seconds_per_step:.3g} s | CPU-Adam {t.cpu_adam_seconds_per_step:.3g} s | NVMe "
        f"{fmt_bytes(t.nvme_bytes_per_step)} in {t.nvme_seconds_per_step:.3g} s",
        f"    = {t.step_seconds:.3g} s/step, {t.tokens_per_s:,.0f} tokens/s, "
        f"{t.offload_overhead_fraction:.0%} of the step lost to offload",
        f"  rates: compute {r.compute_flops_per_s / 1e12:.3g} TFLOP/s, PCIe {r.pcie_bytes_per_s / 1e9:.3g} GB/s, "
        f"CPU-Adam {r.cpu_adam_params_per_s / 1e9:.3g} G params/s, NVMe {r.nvme_read_bytes_per_s / 1e9:.3g}/"
        f"{r.nvme_write_bytes_per_s / 1e9:.3g} GB/s read/write ({sources})",
    ]


def advice_lines(plan: Plan) -> list[str]:
    advice = plan.advice
    if not advice:
        return []
    lines = [
        "Advice",
        f"  offload takes {advice['offload_overhead_fraction']:.0%} of each step "
        f"({advice['tokens_per_s']:,.0f} tokens/s): the batch is too small to hide it",
    ]
    for knob, flag in (("grad_accum", "--grad-accum"), ("micro_batch", "--micro-batch")):
        option = advice[knob]
        if option:
            lines.append(
                f"  {flag} {option['value']}: {option['offload_overhead_fraction']:.0%} overhead, "
                f"{option['tokens_per_s']:,.0f} tokens/s"
            )
    if not advice["micro_batch"]:
        lines.append("  (no larger micro-batch reaches the target within this host's memory)")
    return lines
