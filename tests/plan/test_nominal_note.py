"""A dry run says, in one line, which figures its step times rest on without a measurement, and how to measure
them; figures no plan of the host uses (NVMe without a folder, PCIe without a GPU) are not named."""

from __future__ import annotations

from dataclasses import replace

from launcher.inspection.hostspec import load_host_spec
from launcher.plan.rates import resolve_rates
from launcher.plan.reasons import nominal_note
from tests.helpers import host_path


def test_the_nominal_figures_a_plan_uses_are_named_once():
    host = replace(load_host_spec(host_path("cpu-only")), nvme=None)
    note = nominal_note(host, resolve_rates(host))
    assert note.startswith("step times use nominal rates for cpu_adam_params_per_s, cpu_flops_per_s")
    assert "`offload-launch probe` measures this host once" in note and "\n" not in note
    assert "nvme" not in note and "pcie" not in note


def test_a_measured_host_has_nothing_to_say():
    host = replace(load_host_spec(host_path("cpu-only")), nvme=None)
    figures = {"cpu_memory_bandwidth_bytes_per_s": 3e10, "cpu_flops_per_s": 4e11, "cpu_adam_params_per_s": 1.5e9}
    zero = {"zero_tensor_seconds": {"zero3_hook": 2e-3, "device": "cpu"}}
    assert nominal_note(host, resolve_rates(host, figures, zero)) is None
    unmeasurable = {"zero_tensor_seconds": {}}  # tried, could not run: nothing to advise
    assert nominal_note(host, resolve_rates(host, figures, unmeasurable)) is None
    quick: dict = {}  # `probe --quick` leaves it out: a full probe measures it
    assert "zero_tensor_seconds" in nominal_note(host, resolve_rates(host, figures, quick))
