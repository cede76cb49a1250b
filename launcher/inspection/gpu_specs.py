"""GPU datasheets: peak dense bf16 TFLOP/s and device memory bandwidth per exact SKU, as NVML names it. The
step-time model falls back to them when no probe measured the GPU (plan/rates.py resolve_rates)."""

from __future__ import annotations

from launcher.units import GB

# Peak dense (no sparsity) bf16 TFLOP/s (fp16 for pre-Ampere parts, which have no bf16) per exact SKU, keyed
# by the name NVML reports without its "NVIDIA " prefix, compared case-insensitively with runs of spaces
# collapsed; nothing else: an "H100" in a name says nothing about which of three H100s it is (SXM 989, PCIe
# 756, NVL 835), nor "A10" about an A10G. The datasheets give dense figures or twice them "with sparsity";
# the sparse ones are halved here. Each entry: (TFLOP/s, source).
_H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet (BF16 Tensor Core, sparse figure halved)"
_H200_SHEET = "NVIDIA H200 Tensor Core GPU datasheet (BF16 Tensor Core, sparse figure halved)"
_A100_SHEET = "NVIDIA A100 Tensor Core GPU datasheet (BF16 Tensor Core 312 dense)"
GPU_PEAK_TFLOPS: dict[str, tuple[float, str]] = {
    "H100 80GB HBM3": (989, _H100_SHEET + ", H100 SXM"),
    "H100 PCIe": (756, _H100_SHEET + ", H100 PCIe"),
    "H100 NVL": (835, _H100_SHEET + ", H100 NVL"),
    "H200": (989, _H200_SHEET + ", H200 SXM"),
    "H200 NVL": (835, _H200_SHEET + ", H200 NVL"),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the H100-class GPU, BF16 1,979 with sparsity (989 dense),
    # 96 GB HBM3 at 4 TB/s (GH200 480GB, as NVML names it)
    "GH200 480GB": (989, "NVIDIA GH200 Grace Hopper Superchip datasheet (BF16, sparse figure halved)"),
    "A100-SXM4-40GB": (312, _A100_SHEET + ", SXM"),
    "A100-SXM4-80GB": (312, _A100_SHEET + ", SXM"),
    "A100-PCIE-40GB": (312, _A100_SHEET + ", PCIe"),
    "A100 80GB PCIe": (312, _A100_SHEET + ", PCIe"),
    "A10": (125, "NVIDIA A10 Tensor Core GPU datasheet (BF16 Tensor Core 125 dense / 250 sparse)"),
    "L40S": (362, "NVIDIA L40S datasheet (BF16 Tensor Core 362.05 dense / 733 sparse)"),
    "L40": (181, "NVIDIA L40 datasheet (BF16 Tensor Core 181 dense / 362 sparse)"),
    "L4": (121, "NVIDIA L4 datasheet (BF16 Tensor Core 242 sparse, halved)"),
    "RTX A6000": (155, "NVIDIA RTX A6000 datasheet (Tensor 309.7 TFLOPS sparse, halved)"),
    "GeForce RTX 4090": (
        165,
        "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090: FP16/BF16 Tensor, FP32 accumulate)",
    ),
    "GeForce RTX 3090": (71, "NVIDIA Ampere GA102 whitepaper (RTX 3090: FP16/BF16 Tensor, FP32 accumulate)"),
    "Tesla V100-SXM2-16GB": (125, "NVIDIA V100 datasheet (SXM2: Tensor 125, fp16; no bf16)"),
    "Tesla V100-SXM3-32GB": (125, "NVIDIA DGX-2 datasheet (16 x V100-SXM3: 2 PFLOPS tensor, fp16; no bf16)"),
    "Tesla V100-SXM2-32GB": (125, "NVIDIA V100 datasheet (SXM2: Tensor 125, fp16; no bf16)"),
    "Tesla V100-PCIE-16GB": (112, "NVIDIA V100 datasheet (PCIe: Tensor 112, fp16; no bf16)"),
    "Tesla V100-PCIE-32GB": (112, "NVIDIA V100 datasheet (PCIe: Tensor 112, fp16; no bf16)"),
    "Tesla T4": (65, "NVIDIA T4 datasheet (mixed-precision FP16/FP32 65; no bf16)"),
}
# Device memory bandwidth (GB/s) per exact SKU, from the same datasheets: the [roofline] floor of the passes
# (timing.compute_seconds) when a micro-batch has too few tokens to be compute-bound.
GPU_MEMORY_GBPS: dict[str, float] = {
    "H100 80GB HBM3": 3350,
    "H100 PCIe": 2000,
    "H100 NVL": 3900,
    "H200": 4800,
    "H200 NVL": 4800,
    "GH200 480GB": 4000,
    "A100-SXM4-40GB": 1555,
    "A100-SXM4-80GB": 2039,
    "A100-PCIE-40GB": 1555,
    "A100 80GB PCIe": 1935,
    "A10": 600,
    "L40S": 864,
    "L40": 864,
    "L4": 300,
    "RTX A6000": 768,
    "GeForce RTX 4090": 1008,
    "GeForce RTX 3090": 936,
    "Tesla V100-SXM2-16GB": 900,
    "Tesla V100-SXM3-32GB": 900,
    "Tesla V100-SXM2-32GB": 900,
    "Tesla V100-PCIE-16GB": 900,
    "Tesla V100-PCIE-32GB": 900,
    "Tesla T4": 320,
}
# Deliberately absent: the A10G (AWS's part; NVIDIA publishes no datasheet for it, and its tensor rate is
# below the A10's) and every other name. Those get NOMINAL_GPU_TFLOPS and the plan says "nominal": run
# `offload-launch probe` on the GPU to measure them instead.


def _sku_key(name: str) -> str:
    name = " ".join(name.split()).lower()
    return name.removeprefix("nvidia ")


_SKU_INDEX = {_sku_key(key): value for key, value in GPU_PEAK_TFLOPS.items()}
_MEMORY_INDEX = {_sku_key(key): value for key, value in GPU_MEMORY_GBPS.items()}


def gpu_memory_bytes_per_s(name: str) -> float | None:
    """The datasheet's device memory bandwidth of exactly this SKU (B/s), or None (unknown)."""
    gbps = _MEMORY_INDEX.get(_sku_key(name))
    return gbps * GB if gbps else None


def gpu_datasheet(name: str) -> tuple[float, str] | None:
    """(peak dense bf16 TFLOP/s, datasheet) for exactly this SKU as NVML names it, or None (unknown)."""
    entry = _SKU_INDEX.get(_sku_key(name))
    return (float(entry[0]), entry[1]) if entry else None


def gpu_peak_tflops(name: str) -> float | None:
    entry = gpu_datasheet(name)
    return entry[0] if entry else None
