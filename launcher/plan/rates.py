"""The rates a step estimate runs on: measured > described > nominal, each with its source.

A probe's figures and details (plain data: the measuring is measure/probe.py's, the plan only reads them) win, then
the host description, then the nominal figures below; the plan says which (Rates.sources).

Sources:
  [pageable]  A copy from pageable host memory cannot be DMAed directly: the CUDA driver stages it through a
              pinned bounce buffer, one extra CPU memcpy per chunk, and the copy is synchronous (CUDA C++
              Best Practices Guide, "Pinned Memory"; M. Harris, "How to Optimize Data Transfers in CUDA
              C/C++", NVIDIA blog 2012, bandwidthTest pinned vs pageable). `offload-launch probe` measures
              both (measure/probe.py `measure_pcie`); without a measured pageable figure the model assumes half the
              pinned rate (PAGEABLE_TO_PINNED), an assumption, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from launcher.inspection.gpu_specs import gpu_datasheet, gpu_memory_bytes_per_s
from launcher.inspection.hostprofile import HostProfile
from launcher.units import GB

# [pageable] pageable / pinned host<->device bandwidth when no pageable rate was measured (an assumption).
PAGEABLE_TO_PINNED = 0.5
MFU = 0.5  # achievable fraction of a GPU's peak dense TFLOP/s in training (PaLM reports 46 %, Chowdhery 2022)
# compute.py [seeds-A] DRAM bytes per parameter of one Adam step: reads master, gradient, m, v; writes master, m, v.
ADAM_BYTES_PER_PARAM = 16 + 12
# framework.py [DS-hooks] Measured on the CPU accelerator of docs/planning.md (2 cores) by two runs of `make bench`:
# each row's measured passes minus its passes measured without DeepSpeed (measure/passes.py) is split by least squares
# over the ~1 M-, ~20 M- and ~100 M-parameter rows (39, 57 and 129 tensors) into a per-tensor and a per-parameter
# part, per strategy family. One set of constants for every row and for the GPU runs of tests/plan/published_runs.yaml.
# Seconds per parameter tensor per micro-batch, by family: ZeRO-3's hooks (a fetch and a release each forward and
# backward; with activation checkpointing also the recomputed forward's hooks, whose fetch the backward then finds
# gathered), what offloading the parameters adds, ZeRO-1/2's gradient hook (with the optimizer offloaded also the
# copy of each gradient into the CPU partition). Nominal: a host the probe measured uses its own
# (measure/zero_costs.py, Rates.zero_tensor_seconds), since these are bound by one thread's speed. The nominal
# ZeRO-3 and offload figures are the least-squares fit above (0.8 ms per pass, 0.5 ms per fetch). ZeRO-1/2's hook
# without offload is not charged unmeasured: the probe finds 0.16-0.25 ms on the machine above, but that includes
# the gradient's copy into the contiguous buffer at this CPU's speed, which a GPU does as a device kernel, and
# charging it to the published A100 runs (tests/plan/published_runs.yaml) takes their ratios out of their band.
ZERO_TENSOR_SECONDS = {
    "zero3_hook": 2 * 0.8e-3,
    "zero3_hook_recompute": 3 * 0.8e-3,
    "zero3_fetch": 2 * 0.5e-3,
    "offload_hook": 0.66e-3,
    "zero12_hook": 0.0,
}

# Nominal figures, used when neither a measurement nor the host description gives one.
NOMINAL_CPU_MEMORY_BANDWIDTH = 80 * GB  # B/s; the seeds' CPU-Adam example ("80 GB/s DRAM bandwidth")
NOMINAL_NVME_READ = 7 * GB  # B/s; the seeds' tier table: PCIe 4.0 x4 NVMe ~7 GB/s
NOMINAL_NVME_WRITE = 5 * GB  # B/s; PCIe 4.0 x4 drives' sequential-write datasheets (~5 GB/s)
NOMINAL_CPU_FLOPS_PER_CORE = 25e9  # useful bf16 FLOP/s per core for the CPU accelerator (AVX-512 class)
NOMINAL_GPU_TFLOPS = 100.0  # peak dense bf16/fp16 TFLOP/s of an unknown GPU
CPU_ADAM_BYTES_PER_PARAM = ADAM_BYTES_PER_PARAM  # compute.py [seeds-A]: params/s = bandwidth / 28 when not measured
# A training step's useful FLOP/s as a share of the bf16 matmul rate the probe measures at the model's shapes:
# steps reach MFU (0.5) of the datasheet peak, while large bf16 matmuls reach ~0.8 of it (an H200 here:
# 769-798 of 989 TFLOP/s on 8192^3), so a step runs at about MFU / 0.8 of its measured matmul rate.
STEP_SHARE_OF_MATMUL = MFU / 0.8


@dataclass(frozen=True)
class Rates:
    """The figures the model runs on, each with where it came from ("measured", "described", "nominal")."""

    compute_flops_per_s: float  # useful FLOP/s per rank (peak x MFU on a GPU)
    pcie_bytes_per_s: float  # host<->device from pinned memory, per direction, per GPU
    cpu_adam_params_per_s: float  # per node, all cores
    nvme_read_bytes_per_s: float  # per node
    nvme_write_bytes_per_s: float
    sources: dict  # figure name -> "measured" | "described" | "nominal"
    pcie_pageable_bytes_per_s: float | None = None  # the same from pageable memory, when measured
    cpu_memory_bytes_per_s: float | None = None  # the node's DRAM bandwidth (host copies; the CPU device's memory)
    device_memory_bytes_per_s: float | None = None  # a GPU's memory bandwidth (the [roofline] floor); None: none
    # CPU-Adam params/s of one rank by its thread count, measured (a rank gets OMP_NUM_THREADS = cores // R,
    # launch.LaunchSpec.threads_per_rank); empty: cpu_adam_params_per_s shared out over the R ranks
    cpu_adam_params_per_s_by_threads: dict = field(default_factory=dict)
    # torch's fused AdamW the same way: the CPU accelerator's optimizer when nothing is offloaded
    torch_adam_params_per_s_by_threads: dict = field(default_factory=dict)
    cpu_cores: int = 0  # per node
    # The passes measured at the model's shapes on this device (measure/passes.py): seconds per micro-batch of
    # `passes_tokens` tokens for one more transformer block, and for the rest (embedding, head, loss, framework);
    # None: FLOPs at compute_flops_per_s
    passes_per_layer_seconds: float | None = None
    passes_fixed_seconds: float | None = None
    passes_tokens: int = 0
    # [network] the node's network to the other nodes and a GPU's link to the node's others, per direction (None: not
    # known; planner.make_plan fills them from the host, network.with_links)
    network_bytes_per_s: float | None = None
    interconnect_bytes_per_s: float | None = None
    # [DS-hooks] ZeRO's seconds per parameter tensor by family, measured on this host (measure/zero_costs.py);
    # a family not in it: ZERO_TENSOR_SECONDS
    zero_tensor_seconds: dict = field(default_factory=dict)
    # What a process holds on its GPU outside the caching allocator (measure/probe.py measure_cuda_context);
    # None: memory.CUDA_CONTEXT_BYTES, the nominal figure
    cuda_context_bytes: int | None = None

    def zero_seconds(self, family: str) -> float:
        """ZeRO's seconds per parameter tensor of `family` (ZERO_TENSOR_SECONDS' keys): measured, else nominal."""
        return self.zero_tensor_seconds.get(family, ZERO_TENSOR_SECONDS[family])

    def host_device_bytes_per_s(self, pinned: bool) -> float:
        """The host<->device rate DeepSpeed's offload copies get: pinned, or pageable when pin_memory is off
        (measured, else PAGEABLE_TO_PINNED x pinned [pageable])."""
        if pinned:
            return self.pcie_bytes_per_s
        return self.pcie_pageable_bytes_per_s or self.pcie_bytes_per_s * PAGEABLE_TO_PINNED

    def adam_params_per_s_per_rank(self, ranks_per_node: int, torch_adam: bool = False) -> float:
        """One rank's Adam rate on the CPU while all R step at once: DeepSpeedCPUAdam's (or `torch_adam`: torch's
        fused AdamW's, when measured) at the rank's thread count, else the node's CPU-Adam rate shared out."""
        threads = max(1, self.cpu_cores // ranks_per_node) if self.cpu_cores else 0
        table = self.torch_adam_params_per_s_by_threads if torch_adam else self.cpu_adam_params_per_s_by_threads
        measured = table.get(threads) or self.cpu_adam_params_per_s_by_threads.get(threads)
        return measured or self.cpu_adam_params_per_s / ranks_per_node


def gpu_flops_for_width(figures: Mapping, details: Mapping, width: int | None) -> float | None:
    """The probed GPU bf16 matmul rate at the probed hidden size nearest (in ratio) to `width`."""
    by_width = {int(k): v for k, v in details.get("gpu_matmul_flops_per_s_by_width", {}).items()}
    if not by_width:
        return figures.get("gpu_matmul_flops_per_s")
    if not width:
        return figures.get("gpu_matmul_flops_per_s", max(by_width.values()))
    return by_width[min(by_width, key=lambda w: abs(math.log(w / width)))]


def cpu_flops_for_width(details: Mapping, width: int) -> float | None:
    """The probed bf16 matmul rate at the probed width nearest (in ratio) to the model's hidden size:
    without native bf16 a CPU's rate swings several-fold with the shape."""
    by_width = {int(k): v for k, v in details.get("cpu_flops_per_s_by_width", {}).items()}
    if not by_width:
        return None
    nearest = min(by_width, key=lambda w: abs(math.log(w / width)))
    return by_width[nearest]


UNDER_LOAD = "measured under load"
# the probe's figures its CPU section times with every thread (measure/probe.py _measure_cpu)
CORE_FIGURES = ("cpu_flops_per_s", "cpu_memory_bandwidth_bytes_per_s")


def _mark_under_load(sources: dict, passes: Mapping | None, details: Mapping) -> None:
    """measure/contention.py: the figures timed while other processes competed for the cores are "measured under
    load" (a real run measures them again first)."""
    if passes and passes.get("contended"):
        sources["passes"] = UNDER_LOAD
    if details.get("contended"):
        for name in CORE_FIGURES:
            if sources.get(name) == "measured":
                sources[name] = UNDER_LOAD


def resolve_rates(
    host: HostProfile,
    figures: Mapping | None = None,
    details: Mapping | None = None,
    width: int | None = None,
    passes: Mapping | None = None,
) -> Rates:
    """Measured figures (a probe of this very host: its ProbeResult's `figures` and `details`) win, then the host
    description, then nominal ones. `width` (the model's hidden size) picks the CPU accelerator's matmul rate at the
    nearest probed shape; `passes` (measure/passes.py, measured at the model's shapes and the workload's tokens) the
    passes."""
    details = details or {}
    measured = dict(figures or {})
    if width and (rate := cpu_flops_for_width(details, width)):
        measured["cpu_flops_per_s"] = rate
    sources: dict = {}

    def pick(name: str, described: float | None, nominal: float) -> float:
        return _pick(host, measured, sources, name, described, nominal)

    compute = _compute_rate(host, measured, details, width, sources, pick)
    pcie = _pcie_rate(host, measured, sources)
    bandwidth = pick(
        "cpu_memory_bandwidth_bytes_per_s", host.cpu_memory_bandwidth_bytes_per_s, NOMINAL_CPU_MEMORY_BANDWIDTH
    )
    adam = pick("cpu_adam_params_per_s", host.cpu_adam_params_per_s, bandwidth / CPU_ADAM_BYTES_PER_PARAM)
    nvme = host.nvme
    read = pick("nvme_read_bytes_per_s", nvme.read_bytes_per_s if nvme else None, NOMINAL_NVME_READ)
    write = pick("nvme_write_bytes_per_s", nvme.write_bytes_per_s if nvme else None, NOMINAL_NVME_WRITE)
    if passes:
        sources["passes"] = "measured"
    _mark_under_load(sources, passes, details)
    zero_costs = _zero_costs(details, host)
    tried = "zero_tensor_seconds" in details
    sources["zero_tensor_seconds"] = (
        "measured" if zero_costs else "nominal (not measurable here)" if tried else "nominal"
    )
    return Rates(
        compute_flops_per_s=compute,
        pcie_bytes_per_s=pcie,
        cpu_adam_params_per_s=adam,
        nvme_read_bytes_per_s=read,
        nvme_write_bytes_per_s=write,
        sources=sources,
        pcie_pageable_bytes_per_s=_slower_direction(measured, "pageable"),
        cpu_memory_bytes_per_s=bandwidth,
        device_memory_bytes_per_s=gpu_memory_bytes_per_s(host.gpus.name) if host.has_gpu else None,
        cpu_adam_params_per_s_by_threads=_by_threads(details, "cpu_adam_params_per_s_by_threads"),
        torch_adam_params_per_s_by_threads=_by_threads(details, "torch_adam_params_per_s_by_threads"),
        cpu_cores=host.cpu_cores,
        passes_per_layer_seconds=passes["per_layer_seconds"] if passes else None,
        passes_fixed_seconds=passes["fixed_seconds"] if passes else None,
        passes_tokens=passes["tokens"] if passes else 0,
        zero_tensor_seconds=zero_costs,
        cuda_context_bytes=_cuda_context(host, measured, sources),
    )


def _cuda_context(host: HostProfile, measured: Mapping, sources: dict) -> int | None:
    """The probed CUDA context of this host's GPUs, its source noted; None without a GPU or a measurement."""
    if not host.has_gpu:
        return None
    if "cuda_context_bytes" in measured:
        sources["cuda_context_bytes"] = "measured"
        return int(measured["cuda_context_bytes"])
    sources["cuda_context_bytes"] = "nominal"
    return None


def _pick(
    host: HostProfile, measured: Mapping, sources: dict, name: str, described: float | None, nominal: float
) -> float:
    """The figure `name`: measured, else described (a live host's: detected), else nominal; its source noted."""
    if name in measured:
        sources[name] = "measured"
        return float(measured[name])
    if described:
        sources[name] = "described" if host.source != "live" else "detected"
        return float(described)
    sources[name] = "nominal"
    return float(nominal)


def _compute_rate(
    host: HostProfile,
    measured: Mapping,
    details: Mapping,
    width: int | None,
    sources: dict,
    pick: Callable[[str, float | None, float], float],
) -> float:
    """Useful FLOP/s per rank: a GPU's probed matmul rate x STEP_SHARE_OF_MATMUL, else its described, datasheet or
    nominal peak x MFU; the CPU accelerator's probed (or nominal per core) rate shared out over the ranks."""
    if not host.has_gpu:
        return pick("cpu_flops_per_s", None, NOMINAL_CPU_FLOPS_PER_CORE * host.cpu_cores / host.ranks_per_node)
    matmul = gpu_flops_for_width(measured, details, width)
    if matmul:
        sources["gpu_tflops"] = "measured"
        return matmul * STEP_SHARE_OF_MATMUL
    sheet = gpu_datasheet(host.gpus.name)
    peak = host.gpus.tflops or (sheet[0] if sheet else None)
    if host.gpus.tflops:
        sources["gpu_tflops"] = "described"
    elif sheet:
        sources["gpu_tflops"] = "datasheet"  # gpu_datasheet(name) names the sheet
    else:  # not guessed from a similar name: the nominal figure, and the source says why
        sources["gpu_tflops"] = f"nominal (unknown GPU {host.gpus.name!r})"
    return (peak or NOMINAL_GPU_TFLOPS) * 1e12 * MFU


def _pcie_rate(host: HostProfile, measured: Mapping, sources: dict) -> float:
    """Host<->device B/s from pinned memory: the slower measured direction, else the host's (described or nominal)."""
    pcie_measured = _slower_direction(measured, "pinned")
    if pcie_measured:
        sources["pcie_bytes_per_s"] = "measured"
        return pcie_measured
    sources["pcie_bytes_per_s"] = "described" if host.pcie_bandwidth_bytes_per_s else "nominal"
    return host.pcie_bytes_per_s


def _zero_costs(details: Mapping, host: HostProfile) -> dict:
    """ZeRO's measured seconds per parameter tensor by family, when the probe measured them on the device the
    ranks will use (measure/zero_costs.py); {} otherwise."""
    measured = details.get("zero_tensor_seconds")
    if not measured or measured.get("device") != ("cuda" if host.has_gpu else "cpu"):
        return {}
    return {family: float(measured[family]) for family in ZERO_TENSOR_SECONDS if family in measured}


def _by_threads(details: Mapping, name: str) -> dict[int, float]:
    """A per-thread-count figure of the probe's details, keyed by int (JSON keys are strings)."""
    return {int(k): float(v) for k, v in details.get(name, {}).items()}


def _slower_direction(figures: Mapping, kind: str) -> float | None:
    """The slower of the measured host->device and device->host rates of `kind` (pinned, pageable): an offloaded
    step copies both ways."""
    rates = [
        figures[f"pcie_{kind}_{d}_bytes_per_s"] for d in ("h2d", "d2h") if f"pcie_{kind}_{d}_bytes_per_s" in figures
    ]
    return min(rates) if rates else None
