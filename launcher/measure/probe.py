"""Measure this host's rates (memory, CPU/GPU matmuls, CPU-Adam, PCIe, NVMe and an aio sweep) into a ProbeResult.

`offload-launch probe` runs it (job/measuring.py caches the result, measure/cache.py), and so does a real run that
finds a figure it needs not measured yet. Measured here: CPU memory bandwidth (a torch copy), bf16 matmul FLOP/s on
the CPU (the CPU accelerator's compute), DeepSpeedCPUAdam throughput, host<->device copies pinned and pageable per
direction (with a GPU), and NVMe sequential read/write through DeepSpeed's own async_io handle with a short sweep of
aio settings (in the spirit of DeepSpeed's ds_nvme_tune, written with the current key names). What the step-time
model makes of the figures is the plan's (plan/rates.py resolve_rates).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.inspection.host import host_id, usable_cores
from launcher.measure.contention import contended, gauged
from launcher.measure.contention import note as contention_note

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


def best_seconds(action: Callable[[], None], repeats: int) -> float:
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
    return 2 * size_bytes / best_seconds(lambda: dst.copy_(src), repeats)


def measure_cpu_flops(width: int, tokens: int = 1024, repeats: int = 3) -> float:
    """Useful bf16 FLOP/s of a (tokens x width) @ (width x width) product on the CPU (2·m·k·n FLOPs): the
    shape of a small model's linear layers, which is what the CPU accelerator spends a step on. (On CPUs
    without native bf16 the rate depends strongly on the shape; square 1024 products run 3x slower here.)"""
    import torch

    a = torch.randn(tokens, width, dtype=torch.bfloat16)
    b = torch.randn(width, width, dtype=torch.bfloat16)
    torch.matmul(a, b)  # warm-up
    return 2 * tokens * width * width / best_seconds(lambda: torch.matmul(a, b), repeats)


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
    return 2 * rows * inner * cols / best_seconds(product, repeats)


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
    rate = numel / best_seconds(optimizer.step, repeats)
    by_threads = {everything: rate}
    try:
        for count in sorted(set(threads) - {everything}):
            torch.set_num_threads(count)
            by_threads[count] = numel / best_seconds(optimizer.step, repeats)
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
            by_threads[count] = numel / best_seconds(optimizer.step, repeats)
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
            out[f"pcie_{kind}_{direction}_bytes_per_s"] = size_bytes / best_seconds(copy, repeats)
    return out


def measure_nvme(path: str, size_bytes: int, sweep=AIO_SWEEP) -> tuple[dict, dict, list]:
    """Sequential read/write B/s through DeepSpeed's async_io handle, best over `sweep`."""
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load(verbose=False)
    folder = Path(path) / f"offload-launch-probe-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    target = str(folder / "probe.bin")
    # The buffer a run's swapper uses (runtime/swap_tensor/utils.py: new_cpu_locked_tensor, page-aligned and
    # mlocked): a pageable one makes async_io mlock a bounce buffer of its size per call, which under a small
    # memlock limit aborts the process (deepspeed_pin_tensor.cpp) before any message (locked_buffer_shortfall).
    owner = aio.aio_handle(*sweep[0][:2], False, True, sweep[0][2])
    buffer = owner.new_cpu_locked_tensor(size_bytes, torch.empty(0, dtype=torch.uint8)).fill_(1)
    points = []
    try:
        for block_size, queue_depth, threads in sweep:
            handle = aio.aio_handle(block_size, queue_depth, False, True, threads)
            write = size_bytes / best_seconds(lambda h=handle: h.sync_pwrite(buffer, target), 2)
            read = size_bytes / best_seconds(lambda h=handle: h.sync_pread(buffer, target), 2)
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
        owner.free_cpu_locked_tensor(buffer)
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


def locked_buffer_shortfall(size_bytes: int) -> str | None:
    """Why the NVMe probe cannot lock its `size_bytes` buffer here (RLIMIT_MEMLOCK below it, no CAP_IPC_LOCK),
    with the fix; None when it can. A run's NVMe swap buffers need the same (job/preflight.py's memlock check)."""
    from launcher.inspection.host import can_lock_unlimited, memlock_bytes
    from launcher.units import fmt_bytes

    limit = memlock_bytes()
    if limit is None or limit >= size_bytes or can_lock_unlimited():
        return None
    return (
        f"memlock limit {fmt_bytes(limit)} < the {fmt_bytes(size_bytes)} buffer the NVMe probe locks, as a run's "
        "swap buffers are locked: raise it with `ulimit -l unlimited` (docker: --ulimit memlock=-1; Slurm/systemd: "
        "LimitMEMLOCK=infinity)"
    )


def run_probe(
    nvme_path: str | None,
    *,
    quick: bool,
    has_gpu: bool,
    log: Callable[[str], None],
    gpu_shapes: list[tuple[int, int]] | None = None,
    gpu_tokens: int = GPU_MATMUL_TOKENS,
    nvme_sweep: tuple = AIO_SWEEP,
    zero_costs: Callable[[float], dict] | None = None,
) -> ProbeResult:
    """Measure everything this host has, in bounded time (quick: seconds, for tests). With a GPU the bf16
    matmul rate is timed at `gpu_shapes` ((hidden, intermediate) pairs: the model's, when the probe is told
    it) with `gpu_tokens` rows; without them at GPU_MATMUL_DEFAULT_SHAPES, and the details say so.
    `zero_costs` (not `quick`): measures ZeRO's per-tensor cost at the measured CPU memory bandwidth, into the
    details (job/measuring.py builds it: the engines it times run configs the planner writes)."""
    figures: dict = {}
    details: dict = {"quick": quick}
    _measure_cpu(figures, details, quick=quick, has_gpu=has_gpu, log=log)
    if zero_costs is not None and not quick:  # ~15 s: a small model trained under DeepSpeed once per ZeRO family
        details.update(zero_costs(figures["cpu_memory_bandwidth_bytes_per_s"]))
    aio_section: dict = {}
    if has_gpu:
        _measure_gpu(figures, details, quick=quick, shapes=gpu_shapes, tokens=gpu_tokens, log=log)
    if nvme_path:
        aio_section = measure_nvme_into(figures, details, nvme_path, quick=quick, sweep=nvme_sweep, log=log)
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return ProbeResult(host_id=host_id(), date=date, figures=figures, aio=aio_section, details=details)


def measure_nvme_into(
    figures: dict, details: dict, nvme_path: str, *, quick: bool, sweep: tuple, log: Callable[[str], None]
) -> dict:
    """The drive under `nvme_path` through async_io into `figures` and `details` (which also record the folder and
    its mount: another folder on the same drive is not measured again); the aio section that did best."""
    nvme_bytes = 16 << 20 if quick else 512 << 20
    details["nvme_path"] = nvme_path  # tried: a run does not probe it again (its memlock check says the same)
    details["nvme_mount"] = nvme_mount(nvme_path)
    if shortfall := locked_buffer_shortfall(nvme_bytes):
        log(f"NVMe not measured: {shortfall}; plans use nominal NVMe figures")
        details["nvme_not_measured"] = shortfall
        return {}
    log(f"NVMe through async_io in {nvme_path} ...")
    nvme_figures, aio_section, points = measure_nvme(nvme_path, nvme_bytes, sweep[:2] if quick else sweep)
    figures.update(nvme_figures)
    details.pop("nvme_not_measured", None)
    details["aio_sweep"] = points
    return aio_section


def nvme_mount(path: str) -> str | None:
    """The mount (its point and source device) `path` is on: what NVMe figures belong to."""
    from launcher.inspection.host import mount_of

    mount = mount_of(path)
    return None if mount is None else f"{mount.mount_point} ({mount.source})"


def _measure_cpu(figures: dict, details: dict, *, quick: bool, has_gpu: bool, log: Callable[[str], None]) -> None:
    """The CPU's figures into `figures` and `details`: memory bandwidth, bf16 matmuls by width, DeepSpeedCPUAdam
    (and, without a GPU, torch's fused AdamW) at every thread count a rank may get."""
    import torch

    threads = torch.get_num_threads()
    log("CPU memory bandwidth ...")
    bandwidth, before = gauged(lambda: measure_cpu_memory_bandwidth(32 << 20 if quick else 512 << 20), threads)
    figures["cpu_memory_bandwidth_bytes_per_s"] = bandwidth
    log("CPU bf16 matmul ...")
    widths = CPU_MATMUL_WIDTHS[1:3] if quick else CPU_MATMUL_WIDTHS
    by_width, after = gauged(lambda: {str(width): measure_cpu_flops(width) for width in widths}, threads)
    share = details["core_share"] = min(before, after)  # contention.py: the figures timed with every thread
    details["contended"] = contended(share)
    if details["contended"]:
        log(contention_note("the CPU's bandwidth and matmuls were", share, threads))
    figures["cpu_flops_per_s"] = max(by_width.values())
    details["cpu_flops_per_s_by_width"] = by_width
    log("DeepSpeedCPUAdam (JIT-compiles cpu_adam on first use) ...")
    counts = rank_thread_counts(len(usable_cores()))  # as host.py counts cores
    params_per_s, threads, by_threads = measure_cpu_adam(1 << 20 if quick else 32 << 20, threads=counts)
    figures["cpu_adam_params_per_s"] = params_per_s
    details["cpu_adam_threads"] = threads
    details["cpu_adam_params_per_s_by_threads"] = {str(k): v for k, v in sorted(by_threads.items())}
    if not has_gpu:  # the CPU accelerator's optimizer when nothing is offloaded
        log("torch AdamW (fused) ...")
        torch_adam = measure_torch_adam(1 << 20 if quick else 32 << 20, counts)
        details["torch_adam_params_per_s_by_threads"] = {str(k): v for k, v in sorted(torch_adam.items())}


def _measure_gpu(figures: dict, details: dict, *, quick: bool, shapes, tokens: int, log: Callable[[str], None]) -> None:
    """The GPU's figures into `figures` and `details`: host<->device copies, and bf16 matmuls at `shapes` (the
    model's (hidden, intermediate), else GPU_MATMUL_DEFAULT_SHAPES) with `tokens` rows."""
    log("host<->device copies ...")
    figures.update(measure_pcie(64 << 20 if quick else 512 << 20))
    timed = list(shapes) if shapes else list(GPU_MATMUL_DEFAULT_SHAPES)
    log(f"GPU bf16 matmuls at {tokens_label(tokens)} x (hidden, intermediate) {timed} ...")
    rate, by_hidden = measure_gpu_matmuls(timed, tokens, "cuda", repeats=3 if quick else 10)
    figures["gpu_matmul_flops_per_s"] = rate
    details["gpu_matmul_flops_per_s_by_width"] = by_hidden
    details["gpu_matmul"] = {
        "tokens": tokens,
        "shapes": [list(s) for s in timed],
        "shapes_from": "model" if shapes else "default (the probe was not told the model)",
        "device_name": _cuda_name(),
    }
    if (context := measure_cuda_context()) is not None:
        figures["cuda_context_bytes"] = context


def measure_cuda_context() -> int | None:
    """Bytes this process holds on its GPU outside torch's caching allocator once CUDA, cuBLAS and the matmuls ran
    (the CUDA context, the kernels' modules, the library handles): NVML's figure for this process less
    torch.cuda.memory_reserved(). What plan/memory.py counts as the "CUDA context" per device (CUDA_CONTEXT_BYTES,
    1 GiB, where nothing was measured). None where NVML cannot tell this process apart (a pid namespace with other
    processes on the GPU)."""
    import torch

    from launcher.inspection.cuda_devices import nvml_handle, nvml_process_bytes

    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(device)
    nvml, handle = nvml_handle(torch, device)
    used = nvml_process_bytes(nvml, handle, os.getpid())
    if used is None:
        return None
    return max(0, used - torch.cuda.memory_reserved(device))


def tokens_label(tokens: int) -> str:
    return f"{tokens:,} rows"


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())
