"""Measure once what plans on this host still lack (the probe, ZeRO's per-tensor cost, the passes) and cache it.

The one place that needs both sides of the measuring stage, as DeepSpeed's autotuner hands its scheduler configs it
built elsewhere (autotuning/scheduler.py): it builds the ds_configs a measurement runs (the planner and the config
writer), picks the rendezvous port, decides the passes' time budget from their FLOPs, turns the raw timings into the
figures the plan reads, and caches them (measure/cache.py). The plan only ever reads that cache
(job/planning.py)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from launcher.errors import OffloadLaunchError, UserInputError
from launcher.files import tool_cache_dir
from launcher.inspection.host import host_id, inspect_host
from launcher.inspection.model import inspect_model
from launcher.job import build_locks
from launcher.measure import cache, contention, zero_costs
from launcher.measure import passes as cuts
from launcher.measure.probe import AIO_SWEEP, GPU_MATMUL_TOKENS, ProbeResult, measure_nvme_into, nvme_mount, run_probe
from launcher.plan.compute import flops_per_token
from launcher.plan.framework import zero_param_seconds
from launcher.plan.rates import NOMINAL_CPU_MEMORY_BANDWIDTH, resolve_rates
from launcher.plan.workload import Workload

Log = Callable[[str], None]
PASSES_BUDGET_SECONDS = 15.0  # the passes' whole measurement: a warm-up and measure/passes.REPEATS rounds of each cut


def fill_cache(
    host, model, workload: Workload, *, ranks: int, nvme_path: str | None, trust_remote_code: bool, log: Log
) -> None:
    """Before a real run on this host: measure what a plan of `model` at the (resolved) `workload` with `ranks`
    ranks per node read from the cache without finding it (the probe, or its NVMe folder; ZeRO's per-tensor cost;
    the passes at the model's shapes and the workload's tokens), and cache it, so that planning again reads every
    figure measured. In the process job/measuring_process.py starts."""
    build_locks.clear_stale_locks(os.environ, remove=True, warn=log)  # the probe builds cpu_adam and async_io
    identity = host_id()
    path = cache.probe_path(tool_cache_dir())
    probe = cache.load_probe(path, identity)
    if probe is None or probe["details"].get("contended"):  # measure/contention.py: measured under load
        log(
            "this host's rates were measured under load: measuring them again (offload-launch probe; cached) ..."
            if probe is not None
            else "no measured rates for this host yet: measuring them once (offload-launch probe; cached) ..."
        )
        probe = probe_and_cache(nvme_path, quick=False, log=log, for_run=True)[0].to_json()
    elif nvme_path and not drive_probed(probe, nvme_path):
        log(f"no measured rates for the drive of {nvme_path} yet: measuring it once (cached) ...")
        probe = with_nvme(probe, path, nvme_path, log)
    if "zero_tensor_seconds" not in probe["details"]:
        log("no measured ZeRO per-tensor cost for this host yet: measuring it once (cached) ...")
        probe = with_zero_costs(probe, path, log)
    first = resolve_rates(host, probe["figures"], probe["details"], model.hidden_size)
    measure_passes(
        model,
        workload,
        device=rank_device(host),
        threads=rank_threads(host, ranks),
        flops_per_s=first.compute_flops_per_s,
        host_id=identity,
        log=log,
        trust_remote_code=trust_remote_code,
    )


def probe_and_cache(
    nvme_path: str | None,
    *,
    quick: bool,
    log: Log,
    model: str | None = None,
    tokens: int = GPU_MATMUL_TOKENS,
    trust_remote_code: bool = False,
    for_run: bool = False,
) -> tuple[ProbeResult, Path]:
    """`offload-launch probe`: measure this host and cache the figures where later plans on it find them.
    `model` (a hub id or folder): the GPU matmuls are timed at its (hidden, intermediate) shapes, with `tokens` rows
    (micro-batch x sequence length); without it at the probe's default shapes. Not `quick`: ZeRO's per-tensor cost
    too (~15 s)."""
    build_locks.clear_stale_locks(os.environ, remove=True, warn=log)  # it builds cpu_adam and async_io
    host = inspect_host(nvme_path)
    if nvme_path:
        require_aio(host)
    shapes = None
    if model and host.has_gpu:
        profile = inspect_model(model, trust_remote_code=trust_remote_code, cache_dir=tool_cache_dir())
        shapes = [(profile.hidden_size, profile.intermediate_size)]
    # before a run (`for_run`: bounded to ~30 s) the NVMe sweep tries two aio settings, not all of AIO_SWEEP
    sweep = AIO_SWEEP[:2] if for_run else AIO_SWEEP
    result = run_probe(
        nvme_path,
        quick=quick,
        has_gpu=host.has_gpu,
        log=log,
        gpu_shapes=shapes,
        gpu_tokens=tokens,
        nvme_sweep=sweep,
        zero_costs=lambda bandwidth: measure_zero_costs(host, bandwidth, log),
    )
    path = cache.probe_path(tool_cache_dir())
    cache.save_probe(result.to_json(), path)
    return result, path


def require_aio(host) -> None:
    """NVMe is measured through DeepSpeed's async_io: one line where it cannot be built (`host`: with its folder)."""
    if not host.nvme.aio_usable:
        raise UserInputError(
            "DeepSpeed's async_io op is not usable here (libaio missing): install libaio-dev (Debian/Ubuntu) "
            "or libaio-devel (RHEL), then probe again"
        )


def without_nvme(figures: dict) -> dict:
    """A probe's figures less the NVMe drive's (they belong to the drive measured, not to another)."""
    return {name: value for name, value in figures.items() if not name.startswith("nvme_")}


def drive_probed(probe: dict, nvme_path: str) -> bool:
    """Whether `probe` measured the drive `nvme_path` is on (the folder itself, or another on the same mount)."""
    details = probe["details"]
    if details.get("nvme_path") == nvme_path:
        return True
    return details.get("nvme_mount") is not None and details["nvme_mount"] == nvme_mount(nvme_path)


def with_nvme(probe: dict, path: Path, nvme_path: str, log: Log) -> dict:
    """A cached probe with the drive under `nvme_path` measured now (and cached): the host's other figures are
    the machine's, not the folder's, and stay."""
    build_locks.clear_stale_locks(os.environ, remove=True, warn=log)  # it builds async_io
    require_aio(inspect_host(nvme_path))
    figures, details = without_nvme(probe["figures"]), dict(probe["details"])  # the other drive's go
    aio = measure_nvme_into(figures, details, nvme_path, quick=False, sweep=AIO_SWEEP[:2], log=log)
    probe = {**probe, "figures": figures, "details": details, "aio": aio}
    cache.save_probe(probe, path)
    return probe


def with_zero_costs(probe: dict, path: Path, log: Log) -> dict:
    """A cached probe (its JSON) from before ZeRO's per-tensor cost was measured, with it measured now (and
    cached)."""
    bandwidth = probe["figures"].get("cpu_memory_bandwidth_bytes_per_s", NOMINAL_CPU_MEMORY_BANDWIDTH)
    probe = {**probe, "details": {**probe["details"], **measure_zero_costs(inspect_host(None), bandwidth, log)}}
    cache.save_probe(probe, path)
    return probe


def measure_zero_costs(host, cpu_memory_bytes_per_s: float, log: Log) -> dict:
    """{"zero_tensor_seconds": {family: seconds per tensor per micro-batch, "device", "tensors",
    "baseline_seconds"}} for a probe's details; {"zero_tensor_seconds": {}} when it could not be measured (the
    plan then uses the nominal figures, and a later run does not try again). `cpu_memory_bytes_per_s`: the host's
    measured bandwidth, at which the per-parameter part the step-time model charges anyway is taken off."""
    from launcher.job.launch import free_port

    log("ZeRO's cost per parameter tensor (a small model under DeepSpeed, one rank per ZeRO family) ...")
    device = rank_device(host)
    with tempfile.TemporaryDirectory(prefix="offload-launch-zero-costs-") as folder:
        try:
            profile, configs = zero_cost_configs(Path(folder), host)
        except (ValueError, OffloadLaunchError) as exc:  # a family that does not fit here (a GPU another job fills)
            log(f"ZeRO's per-tensor cost: not measured ({exc}); the plan uses nominal figures")
            return {"zero_tensor_seconds": {}}
        zero_costs.write_configs(Path(folder), configs)
        raw = zero_costs.measure(Path(folder), device, free_port(), log)
    if raw is None:
        return {"zero_tensor_seconds": {}}
    param_seconds = {
        family: zero_param_seconds(
            profile.params, int(stage) >= 3, optimizer, param, cpu_memory_bytes_per_s, host.has_gpu
        )
        for family, (stage, optimizer, param, _) in zero_costs.FAMILIES.items()
    }
    tensors = len(profile.param_numels)
    costs = zero_costs.per_tensor_costs(zero_costs.excess_seconds(raw["medians"]), tensors, param_seconds)
    baseline = raw["medians"][zero_costs.BARE[False]]
    return {"zero_tensor_seconds": costs | {"device": raw["device"], "tensors": tensors, "baseline_seconds": baseline}}


def zero_cost_configs(folder: Path, host) -> tuple:
    """(the probe model's profile, {family: the ds_config offload-launch writes for that family's strategy on
    `host`}): each pinned, so that it is the one chosen."""
    from launcher.config.dsconfig import render
    from launcher.plan.planner import make_plan

    zero_costs.write_model(folder)
    profile = inspect_model(str(folder))
    configs = {}
    for family, (stage, optimizer, param, _) in zero_costs.FAMILIES.items():
        workload = Workload(
            seq_len=zero_costs.SEQ_LEN,
            micro_batch=zero_costs.MICRO_BATCH,
            activation_checkpointing=False,  # the model is checkpointed or not; the config says nothing of it
            zero_stage=stage,
            offload_optimizer=optimizer,
            offload_param=param,
            steps=zero_costs.WARMUP + zero_costs.REPEATS,
        )
        configs[family] = render(make_plan(profile, host, workload, resolve_rates(host)))
    return profile, configs


def measure_passes(
    profile,
    workload: Workload,
    *,
    device: str,
    threads: int,
    flops_per_s: float,
    host_id: str,
    log: Log,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
) -> dict | None:
    """The passes at `profile`'s shapes and the (resolved) workload's tokens, on the device and threads a rank gets,
    from the cache (`cache_dir`, default the tool's) or measured now and cached; None when the cuts would take over
    PASSES_BUDGET_SECONDS by FLOPs at `flops_per_s`, cannot be built, or the model is not trained here
    (measure/passes.cut_layers)."""
    cache_dir = cache_dir or tool_cache_dir()
    key = passes_key(profile, workload, device=device, threads=threads, host_id=host_id)
    if (cached := cache.load_passes(cache_dir, key)) is not None and not cached.get("contended"):
        return cached  # one measured under load is measured again (measure/contention.py)
    layers = cuts.cut_layers(profile)
    if layers is None or _cuts_seconds(profile, layers, workload, flops_per_s) > PASSES_BUDGET_SECONDS:
        return None
    result = cuts.time_passes(
        profile,
        layers,
        micro_batch=workload.micro_batch,
        seq_len=workload.seq_len,
        recompute=workload.activation_checkpointing,
        device=device,
        threads=threads,
        log=log,
        trust_remote_code=trust_remote_code,
    )
    if result is not None:
        if result["contended"]:
            log(contention.note("the passes were", result["core_share"], threads))
        cache.save_passes(cache_dir, key, result)
    return result


def passes_key(profile, workload: Workload, *, device: str, threads: int, host_id: str) -> str:
    """The passes' cache key for `profile` at the (resolved) workload, on `device` with `threads` threads."""
    location = Path(profile.config_dir)
    config_json = json.loads((location if location.is_file() else location / "config.json").read_text())
    return cache.passes_key(
        config_json,
        host_id=host_id,
        device=device,
        threads=threads,
        tokens=(workload.micro_batch, workload.seq_len),
        recompute=workload.activation_checkpointing,
    )


def _cuts_seconds(profile, layers: tuple[int, int], workload: Workload, flops_per_s: float) -> float:
    """Seconds the cuts' timing takes by FLOPs: a warm-up and REPEATS rounds of both, the deeper cut's FLOPs each."""
    blocks = [cuts.cut_blocks(profile, n) for n in layers]
    embeddings = max(0, profile.params - profile.num_layers * profile.layer_params)
    cut_params = embeddings + blocks[1] * profile.layer_params
    cross = min(layers[1], profile.cross_attention_layers)
    recompute, seq_len = workload.activation_checkpointing, workload.seq_len
    flops = flops_per_token(cut_params, recompute, blocks[1], profile.attention_dim, seq_len, cross)
    return flops * workload.micro_batch * seq_len / flops_per_s * (1 + cuts.REPEATS) * 2


def rank_device(host) -> str:
    """The device a rank trains on: its GPU, or the CPU accelerator."""
    return "cuda" if host.has_gpu else "cpu"


def rank_threads(host, ranks: int) -> int:
    """The threads a rank gets with `ranks` ranks per node (launch.LaunchSpec.threads_per_rank)."""
    return max(1, host.cpu_cores // ranks)
