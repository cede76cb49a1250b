"""Render a Plan for people: text tables (the `--json` object is Plan.to_json, documented in docs/json.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from launcher.plan import capacity
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes, fmt_count

if TYPE_CHECKING:  # rich is imported where it is used: plan_text does not need it
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text


def _cell(n: int) -> str:
    return fmt_bytes(n) if n else "-"


def header_lines(plan: Plan) -> list[str]:
    """Model, host and workload: what the plan was made for."""
    m, h, w = plan.model, plan.host, plan.workload
    lines = []
    lines.append(f"Model     {m.name}  [{m.architecture}, {m.kind}, {m.source} config]")
    layers = f"{m.num_layers} layers"
    if m.cross_attention_layers:  # an encoder-decoder: both stacks (memory.py [enc-dec])
        layers += f" ({m.encoder_layers} encoder + {m.cross_attention_layers} decoder)"
    lines.append(
        f"          {fmt_count(m.params)} params; largest tensor {m.largest_param_name} = "
        f"{m.largest_param_numel:,}; {layers}, hidden {m.hidden_size}, vocab {m.vocab_size}"
    )
    if plan.lora:
        lora = plan.lora
        share = m.trainable_params / m.params
        lines.append(
            f"          LoRA r={lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g} on "
            f"{', '.join(lora.targets)}: {m.trainable_params:,} trainable params ({share:.2%}); the base is frozen "
            "in 16-bit"
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
    return lines


def plan_text(plan: Plan, ds_config: dict | None, *, show_config: bool = True) -> str:
    h = plan.host
    lines = header_lines(plan)
    lines.append("")
    usable_gpu = capacity.usable_gpu_bytes(h) if h.has_gpu else None
    usable_nvme = capacity.usable_nvme_bytes(h) if h.nvme else None
    gpu_head = "GPU/device" if h.has_gpu else "per rank*"
    width = max([34] + [len(c.strategy.label) + 1 for c in plan.candidates])
    header = (
        f"  {'strategy':<{width}}{gpu_head:>13}{'CPU/node':>13}{'NVMe/node':>13}  fits"
        f"{'s/step':>10}{'tokens/s':>11}{'offload':>9}"
    )
    lines.append(
        "Candidates (bytes needed; usable: "
        f"GPU {fmt_bytes(usable_gpu) if usable_gpu else '-'}, "
        f"CPU {fmt_bytes(capacity.usable_cpu_bytes(h))}, "
        f"NVMe {fmt_bytes(usable_nvme) if usable_nvme is not None else '-'})"
    )
    lines.append(header)
    for c in plan.candidates:
        mark = ">" if c is plan.chosen else " "
        fits = "yes" if c.fits else "no"
        t = c.timing
        lines.append(
            f"{mark} {c.strategy.label:<{width}}{_cell(c.memory.gpu_bytes_per_device):>13}"
            f"{_cell(c.memory.cpu_bytes):>13}{_cell(c.memory.nvme_bytes):>13}  {fits:<4}"
            f"{seconds_cell(t):>10}{t.tokens_per_s:>11,.0f}{t.offload_overhead_fraction:>9.0%}"
        )
    if not h.has_gpu:
        lines.append("  * CPU accelerator: the per-rank device memory is CPU RAM and is included in CPU/node")
    if any(c.timing.calibration for c in plan.candidates):
        lines.append("  c: calibrated by finished runs of that strategy on this host (see Choice)")
    lines.append("")
    if plan.chosen:
        lines.append(f"Choice    {plan.chosen.strategy.label}")
        lines.extend(memory_lines(plan))
        lines.extend(time_lines(plan))
    else:
        lines.append("Choice    nothing fits this host")
    lines.append("Why")
    lines.extend(f"  - {r}" for r in plan.reasons)
    lines.extend(advice_lines(plan))
    lines.extend(method_lines(plan))
    if plan.warnings:
        lines.append("Warnings")
        lines.extend(f"  ! {warning}" for warning in plan.warnings)
    if ds_config is not None and show_config:
        lines.append("")
        lines.append("ds_config")
        lines.append(json.dumps(ds_config, indent=2))
    return "\n".join(lines)


def memory_lines(plan: Plan) -> list[str]:
    """The chosen strategy's bytes, term by term, per tier."""
    lines = ["  where the memory goes (per GPU / CPU node / NVMe node):"]
    for tier, terms in (
        ("GPU", plan.chosen.memory.gpu_terms),
        ("CPU", plan.chosen.memory.cpu_terms),
        ("NVMe", plan.chosen.memory.nvme_terms),
    ):
        if terms:
            parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in terms.items() if v)
            lines.append(f"    {tier:<5}{parts}")
    lines.append("  " + peak_line(plan.chosen.memory, plan.host.has_gpu))
    return lines


def peak_line(memory, has_gpu: bool) -> str:
    """The tiers' peaks and their moments (plan/peaks.py), and the host RAM at each moment: the terms above are
    the steady state, from the first optimizer step on."""
    parts = [f"CPU {fmt_bytes(memory.cpu_bytes)} at the {memory.cpu_peak_moment}"]
    if has_gpu:
        parts.insert(0, f"GPU {fmt_bytes(memory.gpu_bytes_per_device)} at the {memory.gpu_peak_moment}")
    moments = ", ".join(f"{moment} {fmt_bytes(value)}" for moment, value in memory.cpu_moments.items())
    return f"peak: {'; '.join(parts)} (CPU by moment: {moments})"


def step_parts(plan: Plan) -> tuple[tuple[str, float, int | None, str], ...]:
    """The chosen step's parts: (name, seconds, bytes moved or None, colour), as both views show them."""
    t = plan.chosen.timing
    on_gpu = plan.host.has_gpu and plan.chosen.strategy.offload_optimizer == "none"
    parts = (
        ("compute", t.compute_seconds_per_step, None, "green"),
        ("PCIe", t.pcie_seconds_per_step, t.pcie_bytes_per_step, "cyan"),
        ("GPU Adam" if on_gpu else "CPU-Adam", t.cpu_adam_seconds_per_step, None, "yellow"),
        ("host copies", t.host_copy_seconds_per_step, None, "blue"),
        ("ZeRO/engine", t.framework_seconds_per_step, None, "white"),
        ("NVMe", t.nvme_seconds_per_step, t.nvme_bytes_per_step, "magenta"),
    )
    if not t.collective_seconds_per_step:  # one rank per node, or nothing to send (plan/network.py)
        return parts
    # what each GPU sends around the ring per step, and with several nodes each node across the network
    name = "network" if plan.host.nodes > 1 else "GPU links"
    return (*parts, (name, t.collective_seconds_per_step, t.collective_bytes_per_step, "red"))


def seconds_cell(t) -> str:
    """A candidate's s/step as the plan ranks it: calibrated ones marked c (plan/calibration.py)."""
    return f"{t.calibrated_step_seconds:.3g}c" if t.calibrated_step_seconds else f"{t.step_seconds:.3g}"


def calibration_line(t) -> list[str]:
    if not t.calibration:
        return []
    c = t.calibration
    return [
        f"    calibrated by {c['runs']} finished run{'s' if c['runs'] != 1 else ''} of this strategy on this host "
        f"(measured / predicted: passes x{c['passes']:.2f}, update x{c['update']:.2f}): "
        f"{t.calibrated_step_seconds:.3g} s/step; first principles {t.step_seconds:.3g} s/step"
    ]


def time_lines(plan: Plan) -> list[str]:
    """The predicted step split into its parts and phases, and where each rate came from."""
    t, r = plan.chosen.timing, plan.rates
    sources = ", ".join(f"{k} {v}" for k, v in sorted(r.sources.items()))
    links = ""
    if plan.host.nodes > 1 and r.network_bytes_per_s:
        links += f", network {r.network_bytes_per_s / 1e9:.3g} GB/s per node"
    if plan.ranks_per_node > 1 and r.interconnect_bytes_per_s:
        links += f", GPU links {r.interconnect_bytes_per_s / 1e9:.3g} GB/s per GPU"
    parts = " | ".join(
        f"{name} {fmt_bytes(moved)} in {seconds:.3g} s" if moved is not None else f"{name} {seconds:.3g} s"
        for name, seconds, moved, _colour in step_parts(plan)
    )
    return [
        "  predicted step (overlapped copies cost max(compute, copy), the rest adds):",
        f"    {parts}",
        f"    = passes {t.passes_seconds:.3g} s + update {t.update_seconds:.3g} s = {t.step_seconds:.3g} s/step, "
        f"{t.tokens_per_s:,.0f} tokens/s, {t.offload_overhead_fraction:.0%} of the step lost to offload",
        *calibration_line(t),
        f"  rates: compute {r.compute_flops_per_s / 1e12:.3g} TFLOP/s, PCIe {r.pcie_bytes_per_s / 1e9:.3g} GB/s, "
        f"CPU-Adam {r.cpu_adam_params_per_s / 1e9:.3g} G params/s, NVMe {r.nvme_read_bytes_per_s / 1e9:.3g}/"
        f"{r.nvme_write_bytes_per_s / 1e9:.3g} GB/s read/write{links} ({sources})",
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


def method_lines(plan: Plan) -> list[str]:
    """What the other training method would cost on this host (plan/methods.py): never a switch."""
    other = plan.method_advice
    if not other:
        return []
    if other["method"] == "lora":
        lora = other["lora"]
        targets = ", ".join(lora["targets"])
        what = f"a LoRA (--lora: r={lora['rank']} on {targets}, {other['trainable_params']:,} trainable)"
    else:
        what = "full fine-tuning (without --lora: every weight trains)"
    if not other["fits"]:
        figures = f"does not fit this host ({other['problem']})"
    else:
        nvme = f", NVMe {fmt_bytes(other['nvme_bytes'])}" if other["nvme_bytes"] else ""
        figures = (
            f"{other['strategy']}: GPU {fmt_bytes(other['gpu_bytes_per_device'])}, CPU "
            f"{fmt_bytes(other['cpu_bytes'])}{nvme}, {other['step_seconds']:.3g} s/step "
            f"({other['tokens_per_s']:,.0f} tokens/s)"
        )
    return [
        "Method",
        f"  {what}: {figures}",
        "  (it learns differently - a rank-r update of chosen layers, or every weight: the choice is yours)",
    ]


# ------------------------------------------------------------------------------------------- terminal view

BAR_CELLS = 10  # one cell = a tenth of the usable capacity
STEP_BAR_CELLS = 30
CHOSEN_MARK, FITS_MARK, NO_FIT_MARK = "▶", "✓", "✗"
NEAR_CAPACITY_FRACTION = 0.9  # bars turn yellow above this share of what is usable
TIER_NAMES = ("GPU", "CPU", "NVMe")


def capacities(plan: Plan) -> dict[str, int | None]:
    """Usable bytes per tier (None: the host has no such tier); the bars are drawn against these."""
    h = plan.host
    return {
        "GPU": capacity.usable_gpu_bytes(h) if h.has_gpu else None,
        "CPU": capacity.usable_cpu_bytes(h),
        "NVMe": capacity.usable_nvme_bytes(h) if h.nvme else None,
    }


def tier_bar(need_bytes: int, usable_bytes: int | None, cells: int = BAR_CELLS) -> Text:
    """`█████░░░░░ 36.0 GiB`: the need as a share of the usable capacity, red when over it. Without a
    capacity (the CPU accelerator's per-rank device memory) only the bytes; a need for a missing tier is red."""
    from rich.text import Text

    size = f"{fmt_bytes(need_bytes):>9}"
    if not need_bytes:
        return Text(" " * (cells + 1) + f"{'-':>9}", style="dim")
    if usable_bytes is None:
        return Text(" " * (cells + 1) + size)
    if usable_bytes == 0:  # a tier the host does not have
        return Text((f"{'none':<{cells}} " if cells >= 4 else "") + size, style="bold red")
    share = need_bytes / usable_bytes
    filled = min(cells, max(1, round(share * cells)))  # a tiny need still shows one cell
    style = "red" if share > 1 else "yellow" if share > NEAR_CAPACITY_FRACTION else "green"
    bar = Text()
    bar.append("█" * filled, style=style)
    bar.append("░" * (cells - filled), style="dim")
    bar.append(" " + size, style="bold red" if share > 1 else style if not cells else "")
    return bar


def candidates_table(plan: Plan, bar_cells: int = BAR_CELLS) -> Table:
    """Every candidate with a bar per memory tier against its usable capacity; the chosen row marked.
    tokens/s is left out (it is tokens per step / s/step, the same ranking) to keep the bars wide."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    usable = capacities(plan)
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    table.add_column("  strategy", min_width=12)  # the one column that wraps on a narrow terminal
    for tier, per in zip(TIER_NAMES, ("/device", "/node", "/node"), strict=True):
        name = "per rank*" if tier == "GPU" and not plan.host.has_gpu else tier + per
        of = f"of {fmt_bytes(usable[tier])}" if usable[tier] else "none" if tier == "NVMe" else ""
        table.add_column(f"{name}\n{of}", justify="right", no_wrap=True)
    table.add_column("s/step", justify="right", no_wrap=True)
    table.add_column("offload", justify="right", no_wrap=True)
    for c in plan.candidates:
        chosen = c is plan.chosen
        if chosen:
            strategy = Text(f"{CHOSEN_MARK} {c.strategy.label}", style="bold green")
        else:
            strategy = Text(FITS_MARK if c.fits else NO_FIT_MARK, style="green" if c.fits else "red")
            strategy.append(f" {c.strategy.label}", style="" if c.fits else "dim")
        t = c.timing
        table.add_row(
            strategy,
            tier_bar(c.memory.gpu_bytes_per_device, usable["GPU"], bar_cells),
            tier_bar(c.memory.cpu_bytes, usable["CPU"], bar_cells),
            tier_bar(c.memory.nvme_bytes, usable["NVMe"] or 0, bar_cells),  # 0: no NVMe, any need is red
            Text(seconds_cell(t)),
            Text(f"{t.offload_overhead_fraction:.0%}"),
        )
    return table


def step_table(plan: Plan, cells: int = STEP_BAR_CELLS) -> Table:
    """The chosen strategy's predicted step, part by part, each bar a share of the whole step."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = plan.chosen.timing
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    table.add_column("part", no_wrap=True)
    table.add_column("seconds", justify="right", no_wrap=True)
    table.add_column("share of the step", no_wrap=True)
    table.add_column("moves", justify="right", no_wrap=True)
    for name, seconds, moved, color in step_parts(plan):
        filled = min(cells, round(seconds / t.step_seconds * cells)) if t.step_seconds else 0
        bar = Text("█" * filled, style=color)
        bar.append("░" * (cells - filled), style="dim")
        table.add_row(name, f"{seconds:.3g}", bar, fmt_bytes(moved) if moved is not None else "")
    table.add_row(
        Text("step", style="bold"),
        Text(f"{t.step_seconds:.3g}", style="bold"),
        Text(f"{t.tokens_per_s:,.0f} tokens/s, {t.offload_overhead_fraction:.0%} lost to offload"),
        "",
        end_section=True,
    )
    return table


def plan_rich(plan: Plan, ds_config: dict | None, *, show_config: bool = True, bar_cells: int = BAR_CELLS) -> Group:
    """The plan for a terminal: plan_text's content with bars and colour. A rich renderable (a Group)."""
    from rich.console import Group
    from rich.json import JSON
    from rich.padding import Padding
    from rich.text import Text

    def section(title: str, style: str = "bold") -> Text:
        return Text(title, style=style)

    parts: list = [Text("\n".join(header_lines(plan))), Text("")]
    parts.append(section("Candidates (bytes needed against what is usable)"))
    parts.append(candidates_table(plan, bar_cells))
    legend = f"{CHOSEN_MARK} chosen   {FITS_MARK} fits   {NO_FIT_MARK} does not fit"
    if not plan.host.has_gpu:
        legend += "\n* CPU accelerator: the per-rank device memory is CPU RAM and is included in CPU/node"
    parts.append(Text(legend, style="dim"))
    parts.append(Text(""))
    if plan.chosen:
        choice = section("Choice    ")
        choice.append(plan.chosen.strategy.label, style="bold green")
        parts.append(choice)
        parts.append(Text("\n".join(memory_lines(plan))))
        parts.append(Text("  predicted step (overlapped copies cost max(compute, copy), the rest adds):"))
        parts.append(Padding(step_table(plan), (0, 0, 0, 4), expand=False))
        if plan.chosen.timing.calibration:
            parts.append(Text("\n".join(calibration_line(plan.chosen.timing)), style="yellow"))
        parts.append(Text("\n".join(time_lines(plan)[-1:]), style="dim"))  # the rates and their sources
    else:
        parts.append(section("Choice    nothing fits this host", "bold red"))
    parts.append(section("Why"))
    parts.append(Text("\n".join(f"  - {r}" for r in plan.reasons)))
    for advice in (advice_lines(plan), method_lines(plan)):
        if advice:
            parts.append(section(advice[0]))
            parts.append(Text("\n".join(advice[1:]), style="cyan"))
    if plan.warnings:
        parts.append(section("Warnings", "bold yellow"))
        parts.append(Text("\n".join(f"  ! {w}" for w in plan.warnings), style="yellow"))
    if ds_config is not None and show_config:
        parts.append(Text(""))
        parts.append(section("ds_config"))
        parts.append(JSON(json.dumps(ds_config), indent=2))
    return Group(*parts)


def print_plan(plan: Plan, ds_config: dict | None, *, show_config: bool = True, console: Console | None = None) -> None:
    """Print plan_rich on `console` (default: stdout), the bars as wide as the console leaves room for."""
    from rich.console import Console
    from rich.measure import Measurement

    console = console or Console()
    unbounded = console.options.update(max_width=10 * console.width)  # the table's natural width

    def natural_width(cells: int) -> int:
        return Measurement.get(console, unbounded, candidates_table(plan, cells)).maximum

    bar_cells = BAR_CELLS
    while bar_cells > 0 and natural_width(bar_cells) > console.width:
        bar_cells -= 1
    console.print(plan_rich(plan, ds_config, show_config=show_config, bar_cells=bar_cells))
