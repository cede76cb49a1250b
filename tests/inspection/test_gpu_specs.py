"""The GPU datasheet table (launcher/inspection/gpu_specs.py): exact SKUs only, each with its source."""

from __future__ import annotations

import pytest

from launcher.inspection import gpu_specs


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A100 80GB PCIe", 312),
        ("NVIDIA H100 80GB HBM3", 989),  # SXM5
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA A10", 125),
        ("NVIDIA A10G", None),  # AWS's part: no NVIDIA datasheet, and not the A10
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA L4", 121),
        ("NVIDIA GeForce RTX 4090", 165),
        ("NVIDIA GeForce RTX 4090 D", None),  # a different SKU, not a 4090
        ("Tesla V100-SXM2-32GB", 125),
        ("Tesla V100-PCIE-16GB", 112),
        ("Tesla T4", 65),
        ("nvidia  h100  pcie", 756),  # case and runs of spaces do not matter
        ("NVIDIA H100", None),  # which of three H100s? not guessed
        ("NVIDIA H800 PCIe", None),
        ("Mystery GPU", None),
    ],
)
def test_datasheet_tflops_match_exact_skus_only(name, tflops):
    assert gpu_specs.gpu_peak_tflops(name) == tflops
    if tflops is not None:
        assert "datasheet" in gpu_specs.gpu_datasheet(name)[1] or "whitepaper" in gpu_specs.gpu_datasheet(name)[1]


def test_every_table_entry_has_a_source_and_no_entry_matches_another_sku():
    for key, (tflops, source) in gpu_specs.GPU_PEAK_TFLOPS.items():
        assert tflops > 0 and source
        assert gpu_specs.gpu_peak_tflops("NVIDIA " + key) == tflops
        for other in gpu_specs.GPU_PEAK_TFLOPS:  # a name that merely contains another SKU's name is not that SKU
            if other != key and other in key:
                assert gpu_specs.gpu_peak_tflops("NVIDIA " + key) == gpu_specs.GPU_PEAK_TFLOPS[key][0]
