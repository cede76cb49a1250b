"""`offload-launch probe`: measure the rates the step-time model needs, cache them, and resolve the rates a
plan uses (measured > described > nominal, and the plan says which).

Measured here: CPU memory bandwidth (numpy copy), bf16 matmul FLOP/s on the CPU (the CPU accelerator's
compute), DeepSpeedCPUAdam throughput, host<->device copies pinned and pageable per direction (with a GPU),
and NVMe sequential read/write through DeepSpeed's own async_io handle with a short sweep of aio settings
(in the spirit of DeepSpeed's ds_nvme_tune, written with the current key names).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.files import write_json_atomic
from launcher.inspection.gpu_specs import gpu_datasheet, gpu_memory_bytes_per_s
from launcher.inspection.hostprofile import HostProfile
from launcher.plan.timing import ADAM_BYTES_PER_PARAM, MFU, ZERO_TENSOR_SECONDS, Rates
from launcher.units import GB

# Nominal figures, used when neither a measurement nor the host description gives one.
NOMINAL_CPU_MEMORY_BANDWIDTH = 80 * GB  # B/s; the seeds' CPU-Adam example ("80 GB/s DRAM bandwidth")
NOMINAL_NVME_READ = 7 * GB  # B/s; the seeds' tier table: PCIe 4.0 x4 NVMe ~7 GB/s
NOMINAL_NVME_WRITE = 5 * GB  # B/s; PCIe 4.0 x4 drives' sequential-write datasheets (~5 GB/s)
NOMINAL_CPU_FLOPS_PER_CORE = 25e9  # useful bf16 FLOP/s per core for the CPU accelerator (AVX-512 class)
NOMINAL_GPU_TFLOPS = 100.0  # peak dense bf16/fp16 TFLOP/s of an unknown GPU
CPU_ADAM_BYTES_PER_PARAM = ADAM_BYTES_PER_PARAM  # timing [seeds-A]: params/s = bandwidth / 28 when not measured
# A training step's useful FLOP/s as a share of the bf16 matmul rate the probe measures at the model's shapes:
# steps reach MFU (0.5) of the datasheet peak, while large bf16 matmuls reach ~0.8 of it (an H200 here:
# 769-798 of 989 TFLOP/s on 8192^3), so a step runs at about MFU / 0.8 of its measured matmul rate.
STEP_SHARE_OF_MATMUL = MFU / 0.8
GPU_MATMUL_TOKENS = 4096  # rows of the probed products when the probe is not told the workload (tokens/micro-batch)
# When the probe does not know the model: (hidden, intermediate) pairs of common Llama shapes (7B, 13B, 70B)
# and a small one; each is timed as tokens x hidden @ hidden x hidden and tokens x hidden @ hidden x intermediate.
GPU_MATMUL_DEFAULT_SHAPES = ((1024, 2816), (4096, 11008), (5120, 13824), (8192, 28672))
CPU_MATMUL_WIDTHS = (64, 128, 256, 512, 1024)  # hidden sizes the CPU accelerator's rate is probed at
AIO_SWEEP = (  # (block_size, queue_depth, intra_op_parallelism)
    (1 << 20, 8, 1),
    (1 << 20, 32, 1),
    (1 << 18, 32, 1),
    (1 << 20, 32, 2),
    (1 << 20, 64, 4),
)


@dataclass(frozen=True)
class ProbeResult:
    host_id: str
    date: str  # ISO 8601, UTC
    figures: dict  # name -> value (bytes/s, params/s, FLOP/s)
    aio: dict = field(default_factory=dict)  # the best aio section found, DeepSpeed's key names
    details: dict = field(default_factory=dict)  # threads, sizes, every sweep point

    def to_json(self) -> dict:
        return asdict(self)


def host_id() -> str:
    """Hostname, CPU model, core count, RAM and GPU names: a new machine (or a changed one) re-probes."""
    import psutil

    gpus = ""
    with contextlib.suppress(Exception):  # no NVIDIA driver: no GPUs in the identity
        import pynvml

        pynvml.nvmlInit()
        gpus = ",".join(
            str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        )
        pynvml.nvmlShutdown()
    identity = "|".join(
        [platform.node(), platform.processor(), str(os.cpu_count()), str(psutil.virtual_memory().total), gpus]
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def cache_path(tool_cache_dir: Path) -> Path:
    return tool_cache_dir / "probe.json"


def load_cached(path: Path, current_host_id: str) -> ProbeResult | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("host_id") != current_host_id:
        return None
    return ProbeResult(**data)


def save(result: ProbeResult, path: Path) -> None:
    write_json_atomic(path, result.to_json())


# ------------------------------------------------------------------------------------------ measuring


def _best_seconds(action: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cpu_memory_bandwidth(size_bytes: int, repeats: int = 5) -> float:
    """B/s of a large fp32 tensor copy with all of torch's threads, as DeepSpeed's host copies run (reads and
    writes both counted, as CPU-Adam's streaming does). A single-threaded copy (numpy's) reaches less: 19.4 GB/s
    against 25.3 GB/s on the 2-core host of docs/planning.md."""
    import torch

    src = torch.ones(size_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * size_bytes / _best_seconds(lambda: dst.copy_(src), repeats)


def measure_cpu_flops(width: int, tokens: int = 1024, repeats: int = 3) -> float:
    """Useful bf16 FLOP/s of a (tokens x width) @ (width x width) product on the CPU (2·m·k·n FLOPs): the
    shape of a small model's linear layers, which is what the CPU accelerator spends a step on. (On CPUs
    without native bf16 the rate depends strongly on the shape; square 1024 products run 3x slower here.)"""
    import torch

    a = torch.randn(tokens, width, dtype=torch.bfloat16)
    b = torch.randn(width, width, dtype=torch.bfloat16)
    torch.matmul(a, b)  # warm-up
    return 2 * tokens * width * width / _best_seconds(lambda: torch.matmul(a, b), repeats)


def measure_matmul(rows: int, inner: int, cols: int, device: str = "cuda", repeats: int = 10) -> float:
    """Useful bf16 FLOP/s (2·rows·inner·cols per product) of a (rows x inner) @ (inner x cols) product on
    `device` ("cuda", "cuda:1", "cpu"): the best of `repeats` timed products after a warm-up, the device
    synchronised around each (CUDA launches are asynchronous)."""
    import torch

    dev = torch.device(device)
    a = torch.randn(rows, inner, dtype=torch.bfloat16, device=dev)
    b = torch.randn(inner, cols, dtype=torch.bfloat16, device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def product() -> None:
        torch.matmul(a, b)
        sync()

    for _ in range(3 if dev.type == "cuda" else 1):  # warm-up: cuBLAS handle, heuristics, clocks
        product()
    return 2 * rows * inner * cols / _best_seconds(product, repeats)


def matmul_shapes(hidden: int, intermediate: int, tokens: int) -> list[tuple[int, int, int]]:
    """The products of one Llama-style layer at `tokens` rows: the attention projections (hidden x hidden)
    and the MLP's up/gate projection (hidden x intermediate)."""
    return [(tokens, hidden, hidden), (tokens, hidden, intermediate)]


def measure_gpu_matmuls(
    shapes: list[tuple[int, int]], tokens: int, device: str = "cuda", repeats: int = 10
) -> tuple[float, dict]:
    """(rate, by_width): per (hidden, intermediate) pair the FLOP-weighted bf16 rate of its products
    (total FLOPs / total seconds), keyed by hidden size; `rate` is the one for the first pair."""
    by_width: dict[str, float] = {}
    for hidden, intermediate in shapes:
        flops = seconds = 0.0
        for m, k, n in matmul_shapes(hidden, intermediate, tokens):
            work = 2 * m * k * n
            flops += work
            seconds += work / measure_matmul(m, k, n, device, repeats)
        by_width[str(hidden)] = flops / seconds
    return by_width[str(shapes[0][0])], by_width


def measure_cpu_adam(numel: int, repeats: int = 3, threads: tuple[int, ...] = ()) -> tuple[float, int, dict]:
    """(params/s, threads, {thread count: params/s}) of DeepSpeedCPUAdam stepping one fp32 tensor of `numel`
    elements: with all of torch's threads, and at each count in `threads` (its OpenMP loop follows
    torch.set_num_threads, as a rank's follows the OMP_NUM_THREADS the launcher gives it)."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    param = torch.nn.Parameter(torch.zeros(numel, dtype=torch.float32))
    param.grad = torch.randn(numel, dtype=torch.float32) * 1e-3
    optimizer = DeepSpeedCPUAdam([param], lr=1e-4, adamw_mode=True)
    optimizer.step()  # warm-up: allocates the state
    everything = torch.get_num_threads()
    rate = numel / _best_seconds(optimizer.step, repeats)
    by_threads = {everything: rate}
    try:
        for count in sorted(set(threads) - {everything}):
            torch.set_num_threads(count)
            by_threads[count] = numel / _best_seconds(optimizer.step, repeats)
    finally:
        torch.set_num_threads(everything)
    return rate, everything, by_threads


def measure_torch_adam(numel: int, threads: tuple[int, ...], repeats: int = 3) -> dict:
    """{thread count: params/s} of torch.optim.AdamW(fused=True) stepping one fp32 tensor of `numel` elements: the
    optimizer the ds_config asks for when nothing is offloaded (dsconfig.uses_torch_adam), on the CPU accelerator
    the CPU runs it."""
    import torch

    param = torch.nn.Parameter(torch.zeros(numel, dtype=torch.float32))
    param.grad = torch.randn(numel, dtype=torch.float32) * 1e-3
    optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True)
    optimizer.step()  # warm-up: allocates the state
    everything = torch.get_num_threads()
    by_threads = {}
    try:
        for count in sorted(set(threads) | {everything}):
            torch.set_num_threads(count)
            by_threads[count] = numel / _best_seconds(optimizer.step, repeats)
    finally:
        torch.set_num_threads(everything)
    return by_threads


def rank_thread_counts(cores: int, max_ranks: int = 8) -> tuple[int, ...]:
    """The OMP_NUM_THREADS a rank gets with 1..max_ranks ranks on a node of `cores` cores (cores // ranks, at
    least 1: launch.LaunchSpec.threads_per_rank)."""
    return tuple(sorted({max(1, cores // ranks) for ranks in range(1, max_ranks + 1)}))


def measure_pcie(size_bytes: int, repeats: int = 5) -> dict:
    """B/s host->device and device->host, pinned and pageable (needs a CUDA GPU)."""
    import torch

    device = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    out = {}
    for kind, host in (
        ("pinned", torch.empty(size_bytes, dtype=torch.uint8).pin_memory()),
        ("pageable", torch.empty(size_bytes, dtype=torch.uint8)),
    ):
        for direction, (dst, src) in (("h2d", (device, host)), ("d2h", (host, device))):

            def copy(dst=dst, src=src):
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()

            copy()
            out[f"pcie_{kind}_{direction}_bytes_per_s"] = size_bytes / _best_seconds(copy, repeats)
    return out


def measure_nvme(path: str, size_bytes: int, sweep=AIO_SWEEP) -> tuple[dict, dict, list]:
    """Sequential read/write B/s through DeepSpeed's async_io handle, best over `sweep`."""
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load(verbose=False)
    folder = Path(path) / f"offload-launch-probe-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    target = str(folder / "probe.bin")
    buffer = torch.ones(size_bytes, dtype=torch.uint8)
    points = []
    try:
        for block_size, queue_depth, threads in sweep:
            handle = aio.aio_handle(block_size, queue_depth, False, True, threads)
            write = size_bytes / _best_seconds(lambda h=handle: h.sync_pwrite(buffer, target), 2)
            read = size_bytes / _best_seconds(lambda h=handle: h.sync_pread(buffer, target), 2)
            points.append(
                {
                    "block_size": block_size,
                    "queue_depth": queue_depth,
                    "intra_op_parallelism": threads,
                    "read_bytes_per_s": read,
                    "write_bytes_per_s": write,
                }
            )
    finally:
        for leftover in folder.glob("*"):
            leftover.unlink()
        folder.rmdir()
    best = max(points, key=lambda p: p["read_bytes_per_s"] + p["write_bytes_per_s"])
    aio_section = {
        "block_size": best["block_size"],
        "queue_depth": best["queue_depth"],
        "intra_op_parallelism": best["intra_op_parallelism"],
        "single_submit": False,
        "overlap_events": True,
        "use_gds": False,
    }
    figures = {"nvme_read_bytes_per_s": best["read_bytes_per_s"], "nvme_write_bytes_per_s": best["write_bytes_per_s"]}
    return figures, aio_section, points


def run_probe(
    nvme_path: str | None,
    *,
    quick: bool,
    has_gpu: bool,
    log: Callable[[str], None],
    gpu_shapes: list[tuple[int, int]] | None = None,
    gpu_tokens: int = GPU_MATMUL_TOKENS,
    nvme_sweep: tuple = AIO_SWEEP,
) -> ProbeResult:
    """Measure everything this host has, in bounded time (quick: seconds, for tests). With a GPU the bf16
    matmul rate is timed at `gpu_shapes` ((hidden, intermediate) pairs: the model's, when the probe is told
    it) with `gpu_tokens` rows; without them at GPU_MATMUL_DEFAULT_SHAPES, and the details say so."""
    figures: dict = {}
    details: dict = {"quick": quick}
    log("CPU memory bandwidth ...")
    figures["cpu_memory_bandwidth_bytes_per_s"] = measure_cpu_memory_bandwidth(32 << 20 if quick else 512 << 20)
    log("CPU bf16 matmul ...")
    widths = CPU_MATMUL_WIDTHS[1:3] if quick else CPU_MATMUL_WIDTHS
    by_width = {str(width): measure_cpu_flops(width) for width in widths}
    figures["cpu_flops_per_s"] = max(by_width.values())
    details["cpu_flops_per_s_by_width"] = by_width
    log("DeepSpeedCPUAdam (JIT-compiles cpu_adam on first use) ...")
    import psutil

    counts = rank_thread_counts(psutil.cpu_count(logical=False) or os.cpu_count() or 1)  # as host.py counts cores
    params_per_s, threads, by_threads = measure_cpu_adam(1 << 20 if quick else 32 << 20, threads=counts)
    figures["cpu_adam_params_per_s"] = params_per_s
    details["cpu_adam_threads"] = threads
    details["cpu_adam_params_per_s_by_threads"] = {str(k): v for k, v in sorted(by_threads.items())}
    if not has_gpu:  # the CPU accelerator's optimizer when nothing is offloaded
        log("torch AdamW (fused) ...")
        torch_adam = measure_torch_adam(1 << 20 if quick else 32 << 20, counts)
        details["torch_adam_params_per_s_by_threads"] = {str(k): v for k, v in sorted(torch_adam.items())}
    if not quick:  # ~15 s: a small model trained under DeepSpeed once per ZeRO family
        details.update(measure_zero_costs(figures["cpu_memory_bandwidth_bytes_per_s"], log))
    aio_section: dict = {}
    if has_gpu:
        log("host<->device copies ...")
        figures.update(measure_pcie(64 << 20 if quick else 512 << 20))
        shapes = list(gpu_shapes) if gpu_shapes else list(GPU_MATMUL_DEFAULT_SHAPES)
        log(f"GPU bf16 matmuls at {tokens_label(gpu_tokens)} x (hidden, intermediate) {shapes} ...")
        rate, by_hidden = measure_gpu_matmuls(shapes, gpu_tokens, "cuda", repeats=3 if quick else 10)
        figures["gpu_matmul_flops_per_s"] = rate
        details["gpu_matmul_flops_per_s_by_width"] = by_hidden
        details["gpu_matmul"] = {
            "tokens": gpu_tokens,
            "shapes": [list(s) for s in shapes],
            "shapes_from": "model" if gpu_shapes else "default (the probe was not told the model)",
            "device_name": _cuda_name(),
        }
    if nvme_path:
        log(f"NVMe through async_io in {nvme_path} ...")
        sweep = nvme_sweep[:2] if quick else nvme_sweep
        nvme_figures, aio_section, points = measure_nvme(nvme_path, 16 << 20 if quick else 512 << 20, sweep)
        figures.update(nvme_figures)
        details["aio_sweep"] = points
        details["nvme_path"] = nvme_path
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return ProbeResult(host_id=host_id(), date=date, figures=figures, aio=aio_section, details=details)


def tokens_label(tokens: int) -> str:
    return f"{tokens:,} rows"


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())


# ------------------------------------------------------------------------------------------ resolving


def gpu_flops_for_width(probe: ProbeResult, width: int | None) -> float | None:
    """The probed GPU bf16 matmul rate at the probed hidden size nearest (in ratio) to `width`."""
    by_width = {int(k): v for k, v in probe.details.get("gpu_matmul_flops_per_s_by_width", {}).items()}
    if not by_width:
        return probe.figures.get("gpu_matmul_flops_per_s")
    if not width:
        return probe.figures.get("gpu_matmul_flops_per_s", max(by_width.values()))
    return by_width[min(by_width, key=lambda w: abs(math.log(w / width)))]


def cpu_flops_for_width(probe: ProbeResult, width: int) -> float | None:
    """The probed bf16 matmul rate at the probed width nearest (in ratio) to the model's hidden size:
    without native bf16 a CPU's rate swings several-fold with the shape."""
    by_width = {int(k): v for k, v in probe.details.get("cpu_flops_per_s_by_width", {}).items()}
    if not by_width:
        return None
    nearest = min(by_width, key=lambda w: abs(math.log(w / width)))
    return by_width[nearest]


def measure_zero_costs(cpu_memory_bytes_per_s: float, log: Callable[[str], None]) -> dict:
    """{"zero_tensor_seconds": ...} for a probe's details (inspection/zero_costs.py); empty when it could not be
    measured (the plan then uses the nominal figures, and a later run does not try again)."""
    from launcher.inspection import zero_costs

    log("ZeRO's cost per parameter tensor (a small model under DeepSpeed, one rank per ZeRO family) ...")
    return {"zero_tensor_seconds": zero_costs.measure(cpu_memory_bytes_per_s, log) or {}}


def with_zero_costs(result: ProbeResult, path: Path, log: Callable[[str], None]) -> ProbeResult:
    """A cached probe from before ZeRO's per-tensor cost was measured, with it measured now (and cached)."""
    bandwidth = result.figures.get("cpu_memory_bandwidth_bytes_per_s", NOMINAL_CPU_MEMORY_BANDWIDTH)
    measured = measure_zero_costs(bandwidth, log)
    result = ProbeResult(**{**result.to_json(), "details": {**result.details, **measured}})
    save(result, path)
    return result


def resolve_rates(
    host: HostProfile, probe: ProbeResult | None, width: int | None = None, passes: dict | None = None
) -> Rates:
    """Measured figures (a probe of this very host) win, then the host description, then nominal ones.
    `width` (the model's hidden size) picks the CPU accelerator's matmul rate at the nearest probed shape;
    `passes` (inspection/passes.py, measured at the model's shapes and the workload's tokens) the passes."""
    measured = dict(probe.figures) if probe else {}
    if probe and width and (rate := cpu_flops_for_width(probe, width)):
        measured["cpu_flops_per_s"] = rate
    sources: dict = {}

    def pick(name: str, described: float | None, nominal: float) -> float:
        if name in measured:
            sources[name] = "measured"
            return float(measured[name])
        if described:
            sources[name] = "described" if host.source != "live" else "detected"
            return float(described)
        sources[name] = "nominal"
        return float(nominal)

    if host.has_gpu:
        matmul = gpu_flops_for_width(probe, width) if probe else None
        if matmul:
            sources["gpu_tflops"] = "measured"
            compute = matmul * STEP_SHARE_OF_MATMUL
        else:
            sheet = gpu_datasheet(host.gpus.name)
            peak = host.gpus.tflops or (sheet[0] if sheet else None)
            if host.gpus.tflops:
                sources["gpu_tflops"] = "described"
            elif sheet:
                sources["gpu_tflops"] = "datasheet"  # gpu_datasheet(name) names the sheet
            else:  # not guessed from a similar name: the nominal figure, and the source says why
                sources["gpu_tflops"] = f"nominal (unknown GPU {host.gpus.name!r})"
            compute = (peak or NOMINAL_GPU_TFLOPS) * 1e12 * MFU
    else:
        compute = pick("cpu_flops_per_s", None, NOMINAL_CPU_FLOPS_PER_CORE * host.cpu_cores / host.ranks_per_node)
    pcie_measured = _slower_direction(measured, "pinned")
    if pcie_measured:
        pcie = pcie_measured
        sources["pcie_bytes_per_s"] = "measured"
    else:
        pcie = host.pcie_bytes_per_s
        sources["pcie_bytes_per_s"] = "described" if host.pcie_bandwidth_bytes_per_s else "nominal"
    bandwidth = pick(
        "cpu_memory_bandwidth_bytes_per_s", host.cpu_memory_bandwidth_bytes_per_s, NOMINAL_CPU_MEMORY_BANDWIDTH
    )
    adam = pick("cpu_adam_params_per_s", host.cpu_adam_params_per_s, bandwidth / CPU_ADAM_BYTES_PER_PARAM)
    nvme = host.nvme
    read = pick("nvme_read_bytes_per_s", nvme.read_bytes_per_s if nvme else None, NOMINAL_NVME_READ)
    write = pick("nvme_write_bytes_per_s", nvme.write_bytes_per_s if nvme else None, NOMINAL_NVME_WRITE)
    by_threads = _by_threads(probe, "cpu_adam_params_per_s_by_threads")
    torch_adam = _by_threads(probe, "torch_adam_params_per_s_by_threads")
    device_memory = gpu_memory_bytes_per_s(host.gpus.name) if host.has_gpu else None
    if passes:
        sources["passes"] = "measured"
    zero_costs = _zero_costs(probe, host)
    tried = probe is not None and "zero_tensor_seconds" in probe.details
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
        device_memory_bytes_per_s=device_memory,
        cpu_adam_params_per_s_by_threads=by_threads,
        torch_adam_params_per_s_by_threads=torch_adam,
        cpu_cores=host.cpu_cores,
        passes_per_layer_seconds=passes["per_layer_seconds"] if passes else None,
        passes_fixed_seconds=passes["fixed_seconds"] if passes else None,
        passes_tokens=passes["tokens"] if passes else 0,
        zero_tensor_seconds=zero_costs,
    )


def _zero_costs(probe: ProbeResult | None, host: HostProfile) -> dict:
    """ZeRO's measured seconds per parameter tensor by family, when the probe measured them on the device the
    ranks will use (inspection/zero_costs.py); {} otherwise."""
    measured = probe.details.get("zero_tensor_seconds") if probe else None
    if not measured or measured.get("device") != ("cuda" if host.has_gpu else "cpu"):
        return {}
    return {family: float(measured[family]) for family in ZERO_TENSOR_SECONDS if family in measured}


def _by_threads(probe: ProbeResult | None, name: str) -> dict[int, float]:
    """A per-thread-count figure of the probe's details, keyed by int (JSON keys are strings)."""
    return {int(k): float(v) for k, v in probe.details.get(name, {}).items()} if probe else {}


def _slower_direction(figures: dict, kind: str) -> float | None:
    """The slower of the measured host->device and device->host rates of `kind` (pinned, pageable): an offloaded
    step copies both ways."""
    rates = [
        figures[f"pcie_{kind}_{d}_bytes_per_s"] for d in ("h2d", "d2h") if f"pcie_{kind}_{d}_bytes_per_s" in figures
    ]
    return min(rates) if rates else None


def measure_and_cache(
    nvme_path: str | None,
    *,
    quick: bool,
    log: Callable[[str], None],
    model: str | None = None,
    tokens: int = GPU_MATMUL_TOKENS,
    trust_remote_code: bool = False,
    for_run: bool = False,
) -> tuple[ProbeResult, Path]:
    """`offload-launch probe`: measure this host and cache the figures where later plans on it find them.
    `model` (a hub id or folder): the GPU matmuls are timed at its (hidden, intermediate) shapes, with
    `tokens` rows (micro-batch x sequence length); without it at GPU_MATMUL_DEFAULT_SHAPES."""
    from launcher.errors import UserInputError
    from launcher.files import tool_cache_dir
    from launcher.inspection.host import inspect_host

    host = inspect_host(nvme_path)
    if nvme_path and not host.nvme.aio_usable:
        raise UserInputError(
            "DeepSpeed's async_io op is not usable here (libaio missing): install libaio-dev (Debian/Ubuntu) "
            "or libaio-devel (RHEL), then probe again"
        )
    shapes = None
    if model and host.has_gpu:
        from launcher.files import tool_cache_dir as cache_dir
        from launcher.inspection.model import inspect_model

        profile = inspect_model(model, trust_remote_code=trust_remote_code, cache_dir=cache_dir())
        shapes = [(profile.hidden_size, profile.intermediate_size)]
    # before a run (`for_run`: bounded to ~30 s) the NVMe sweep tries two aio settings, not all of AIO_SWEEP
    sweep = AIO_SWEEP[:2] if for_run else AIO_SWEEP
    result = run_probe(
        nvme_path, quick=quick, has_gpu=host.has_gpu, log=log, gpu_shapes=shapes, gpu_tokens=tokens, nvme_sweep=sweep
    )
    path = cache_path(tool_cache_dir())
    save(result, path)
    return result, path
