"""The plan for people: the rich terminal view (bars per tier, the chosen row, the step split) and the
plain text and JSON it must leave as they are."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from launcher.config import dsconfig
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import capacity
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from launcher.units import GiB, fmt_bytes
from launcher.views import plan_view as report
from tests.helpers import host_path

# The --json contract (docs/json.md): top-level keys in this order.
PLAN_JSON_KEYS = [
    "version",
    "fits",
    "model",
    "host",
    "workload",
    "strategy",
    "memory",
    "capacity",
    "estimates",
    "rates",
    "advice",
    "method_advice",
    "candidates",
    "reasons",
    "warnings",
    "ds_config",
]


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


@pytest.fixture(scope="module")
def offload_plan(llama7b):
    """One RTX 4090 with 192 GB RAM: ZeRO-1/2/3 do not fit the GPU, ZeRO-2 + CPU offload is chosen, NVMe is
    described. (With 128 GB RAM, 108.8 GiB usable, ZeRO-2 + opt->cpu needs 132.5 GiB and the optimizer goes to
    NVMe.)"""
    return make_plan(llama7b, (h := load_host_spec(host_path("1x-rtx4090-24g-192g"))), Workload(), resolve_rates(h))


def render(plan, ds_config=None, *, width: int = 120, show_config: bool = False) -> tuple[str, str]:
    """(plain text, text with ANSI styles) of print_plan on a recorded terminal console."""
    console = Console(record=True, width=width, force_terminal=True, color_system="standard")
    report.print_plan(plan, ds_config, show_config=show_config, console=console)
    return console.export_text(clear=False), console.export_text(styles=True)


def row(text: str, label: str) -> str:
    """The candidates-table line of the strategy `label` (its mark, then the label, then a gap)."""
    return next(line for line in text.splitlines() if line[2:].startswith(label + "  "))


def test_the_chosen_row_is_marked_and_the_others_say_whether_they_fit(offload_plan):
    text, _ = render(offload_plan)
    assert offload_plan.chosen.strategy.label == "ZeRO-2 + opt->cpu"
    assert row(text, "ZeRO-2 + opt->cpu").startswith(report.CHOSEN_MARK)
    assert text.count(report.CHOSEN_MARK) == 2  # the row and the legend
    for candidate in offload_plan.candidates:
        if candidate is not offload_plan.chosen:
            mark = report.FITS_MARK if candidate.fits else report.NO_FIT_MARK
            assert row(text, candidate.strategy.label).startswith(mark), candidate.strategy.label
    assert "Choice    ZeRO-2 + opt->cpu" in text


def test_each_tier_has_a_bar_against_its_usable_capacity(offload_plan):
    text, _ = render(offload_plan)
    host = offload_plan.host
    for header in ("GPU/device", "CPU/node", "NVMe/node"):
        assert header in text
    for usable in (capacity.usable_gpu_bytes(host), capacity.usable_cpu_bytes(host), capacity.usable_nvme_bytes(host)):
        assert f"of {fmt_bytes(usable)}" in text
    zero1 = row(text, "ZeRO-1")  # 128 GiB on a 21.6 GiB GPU: a full bar, then the bytes
    need = offload_plan.candidates[0].memory.gpu_bytes_per_device
    assert "█" * report.BAR_CELLS + f" {fmt_bytes(need):>9}" in zero1
    chosen = offload_plan.chosen.memory
    share = round(chosen.gpu_bytes_per_device / capacity.usable_gpu_bytes(host) * report.BAR_CELLS)
    bar = "█" * share + "░" * (report.BAR_CELLS - share)
    assert f"{bar} {fmt_bytes(chosen.gpu_bytes_per_device):>9}" in row(text, "ZeRO-2 + opt->cpu")


def test_a_tier_over_capacity_is_red(offload_plan):
    _, styled = render(offload_plan)
    over = next(line for line in styled.splitlines() if "ZeRO-1" in line)
    fits = next(line for line in styled.splitlines() if "ZeRO-2 + opt->cpu" in line and "█" in line)
    red = "\x1b[31m"
    assert red in over.split("ZeRO-1", 1)[1]  # the GPU bar
    assert red not in fits


def test_tier_bar():
    def plain(need, usable, cells=10):
        return report.tier_bar(need, usable, cells).plain

    assert plain(GiB, 2 * GiB) == "█████░░░░░   1.0 GiB"
    assert plain(3 * GiB, 2 * GiB) == "██████████   3.0 GiB"
    assert plain(1, 2 * GiB) == "█░░░░░░░░░       1 B"  # a need is never drawn as nothing
    assert plain(0, 2 * GiB).strip() == "-"
    assert plain(GiB, None).strip() == "1.0 GiB"  # no capacity to compare with (CPU accelerator)
    assert plain(GiB, 0).startswith("none")  # a tier the host lacks
    assert plain(GiB, 2 * GiB, cells=0) == " 1.0 GiB".rjust(10)
    styles = {str(span.style) for span in report.tier_bar(3 * GiB, 2 * GiB).spans}
    assert "red" in styles and "bold red" in styles
    assert "yellow" in {str(s.style) for s in report.tier_bar(19 * GiB, 20 * GiB).spans}
    assert "green" in {str(s.style) for s in report.tier_bar(GiB, 20 * GiB).spans}


def test_the_predicted_step_is_split_into_its_parts(offload_plan):
    text, _ = render(offload_plan)
    t = offload_plan.chosen.timing
    lines = text.splitlines()
    for name, seconds in (
        ("compute", t.compute_seconds_per_step),
        ("PCIe", t.pcie_seconds_per_step),
        ("CPU-Adam", t.cpu_adam_seconds_per_step),
        ("NVMe", t.nvme_seconds_per_step),
    ):
        line = next(line for line in lines if line.strip().startswith(name + " "))
        filled = round(seconds / t.step_seconds * report.STEP_BAR_CELLS)
        assert f"{seconds:.3g}" in line and "█" * filled + "░" * (report.STEP_BAR_CELLS - filled) in line, name
    assert (
        next(line for line in lines if line.strip().startswith("PCIe "))
        .rstrip()
        .endswith(fmt_bytes(t.pcie_bytes_per_step))
    )
    total = next(line for line in lines if line.strip().startswith("step "))
    assert f"{t.step_seconds:.3g}" in total and f"{t.tokens_per_s:,.0f} tokens/s" in total


def test_reasons_keep_their_brackets(offload_plan):
    text, _ = render(offload_plan)  # "[seeds]" must not be taken for rich markup
    assert "[seeds]" in text and "Why" in text and "Advice" in text


def test_the_config_is_shown_only_when_asked(offload_plan):
    ds_config = dsconfig.render(offload_plan)
    shown, _ = render(offload_plan, ds_config, show_config=True)
    hidden, _ = render(offload_plan, ds_config, show_config=False)
    assert '"zero_optimization"' in shown and '"zero_optimization"' not in hidden


def test_a_narrow_terminal_drops_the_bars_not_the_numbers(offload_plan):
    text, _ = render(offload_plan, width=80)
    table = text.split("Candidates", 1)[1].split("Choice", 1)[0]
    assert "█" not in table and all(len(line) <= 80 for line in text.splitlines())
    assert fmt_bytes(offload_plan.chosen.memory.cpu_bytes) in row(table, "ZeRO-2 + opt->cpu")
    wide, _ = render(offload_plan, width=160)
    assert "█" * report.BAR_CELLS in wide.split("Choice", 1)[0]


def test_nothing_fits(write_host):
    host = load_host_spec(write_host("gpus: {count: 1, memory: 8GiB}\ncpu_memory: 16GiB\n"))
    plan = make_plan(inspect_model("meta-llama/Llama-2-70b-hf"), host, Workload(), resolve_rates(host))
    text, _ = render(plan)
    assert "nothing fits this host" in text and text.count(report.CHOSEN_MARK) == 1  # in the legend only
    assert all(row(text, c.strategy.label).startswith(report.NO_FIT_MARK) for c in plan.candidates)
    assert "none" in row(text, "ZeRO-3 + opt->nvme")  # the host has no NVMe: the need is shown against none


def test_cpu_accelerator_host(tiny_llama_dir):
    plan = make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := load_host_spec(host_path("cpu-only"))),
        Workload(),
        resolve_rates(h),
    )
    text, _ = render(plan)
    assert "per rank*" in text and "included in CPU/node" in text
    assert row(text, plan.chosen.strategy.label).startswith(report.CHOSEN_MARK)


def test_plan_json_and_plan_text_are_unchanged(offload_plan):
    ds_config = dsconfig.render(offload_plan)
    before = json.dumps(offload_plan.to_json(ds_config), sort_keys=True)
    render(offload_plan, ds_config, show_config=True)
    data = offload_plan.to_json(ds_config)
    assert list(data) == PLAN_JSON_KEYS and json.dumps(data, sort_keys=True) == before
    assert set(data["workload"]) == {
        "seq_len",
        "micro_batch",
        "grad_accum",
        "world_size",
        "ranks_per_node",
        "nodes",
        "train_batch_size",
        "tokens_per_step",
        "precision",
        "activation_checkpointing",
        "lora",
    }
    assert set(data["capacity"]) == {"gpu_bytes_per_device", "cpu_bytes", "nvme_bytes"}
    text = report.plan_text(offload_plan, ds_config)
    assert "> ZeRO-2 + opt->cpu" in text and "█" not in text and "\x1b[" not in text  # plain for pipes
    assert text.splitlines()[0] == report.header_lines(offload_plan)[0]
