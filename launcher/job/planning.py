"""From settings to a Plan: inspect the model and the host the settings name, read what was measured on this host
(the cache job/measuring.py fills), resolve the rates, and call the (pure) planner. Nothing is measured here.

Heavy imports (transformers, psutil, NVML) stay inside the functions so `--help` stays instant.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from launcher.errors import UserInputError
from launcher.files import tool_cache_dir
from launcher.measure import cache
from launcher.plan import features
from launcher.plan.planner import Plan
from launcher.plan.rates import UNDER_LOAD, resolve_rates
from launcher.plan.reasons import nominal_note
from launcher.plan.workload import Resolved, Workload, resolve
from launcher.settings import DECLARATIONS, Settings


def hostfile_hosts(path: str) -> list[str]:
    """The hosts of a DeepSpeed hostfile ('hostname slots=N' per line, '#' comments), in order."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserInputError(
            f"--hostfile {path}: {exc.strerror}; pass a file with one 'hostname slots=N' per line"
        ) from None
    hosts = [line.split()[0] for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not hosts:
        raise UserInputError(f"--hostfile {path} lists no hosts; write one 'hostname slots=N' per line")
    return hosts


def workload(settings: Settings) -> Workload:
    """The planner's view of the settings: every Workload field that is a setting, by the same name."""
    return Workload(**{f.name: getattr(settings, f.name) for f in fields(Workload) if f.name in DECLARATIONS})


def build_plan(settings: Settings, *, after_measuring: bool = False) -> Plan:
    """Inspect the host (live, or the described one) and the model, then plan with the rates this host's cache
    holds (job/measuring.py fills it before a real run), else described or nominal ones. A plan of this host on
    nominal figures says so and how to measure them, unless it follows a measuring pass (`after_measuring`): what
    is still nominal then cannot be measured here."""
    from launcher.inspection.host import host_id
    from launcher.inspection.model import inspect_model
    from launcher.plan.planner import make_plan

    if settings.model is None:
        raise UserInputError("missing --model ID|DIR; pass one, or --recipe NAME (offload-launch recipes lists them)")
    host = planned_host(settings)
    model = inspect_model(settings.model, trust_remote_code=settings.trust_remote_code, cache_dir=tool_cache_dir())
    asked = workload(settings)
    resolved = resolve(asked, model, host)  # what the cached measurements are keyed by too: tokens, ranks per node
    identity = host_id() if host.source == "live" else None  # this machine: what it measured is keyed by it
    rates, aio = host_rates(host, identity, settings.nvme_path, model, resolved)
    calibration = host_calibration(identity, model.name, resolved)
    deepspeed = installed_deepspeed_version()
    if asked.offload_ratio is not None and asked.offload_ratio < 1:
        features.require("offload_ratio", deepspeed, "--offload-ratio")
    if asked.optimizer_states == "bf16":
        features.require("bf16_optimizer_states", deepspeed, "--optimizer-states bf16")
    if asked.zenflow:
        features.require("zenflow", deepspeed, "--zenflow")
    plan = make_plan(
        model,
        host,
        asked,
        rates,
        aio,
        alloc_conf(host, settings),
        calibration,
        deepspeed_version=deepspeed,
        buckets=user_buckets(settings),
    )
    if host.source == "live" and not after_measuring and (note := nominal_note(host, rates)):
        plan = replace(plan, warnings=(*plan.warnings, note))
    if under_load := [name for name, source in rates.sources.items() if source == UNDER_LOAD]:
        plan = replace(plan, warnings=(*plan.warnings, under_load_note(under_load)))
    return plan


def under_load_note(names: list[str]) -> str:
    """measure/contention.py: figures timed while other processes competed for the cores."""
    return (
        f"{', '.join(names)} measured while other processes competed for the cores: the predicted step is slower "
        "than this host on its own; a real run measures them again first"
    )


def user_buckets(settings: Settings) -> dict | None:
    """The buffer sizes the user's --ds-config sets (config/merge.bucket_pins), which DeepSpeed will run with."""
    if not settings.ds_config:
        return None
    from launcher.config.final import read_user_config
    from launcher.config.merge import bucket_pins

    return bucket_pins(read_user_config(settings.ds_config).config) or None


def planned_host(settings: Settings):
    """The host the settings plan for: the described one (--host-spec, with --nvme-path's folder), else this
    machine; with --hostfile, as many nodes as it lists."""
    from launcher.inspection.host import inspect_host
    from launcher.inspection.hostspec import load_host_spec, with_nvme_path

    if settings.host_spec:
        host = load_host_spec(settings.host_spec)
        if settings.nvme_path:
            host = with_nvme_path(host, settings.nvme_path)
    else:
        host = inspect_host(settings.nvme_path)
        check_torch_sees_the_gpus(host)
    if settings.hostfile:
        host = replace(host, nodes=len(hostfile_hosts(settings.hostfile)))
    return host


def check_torch_sees_the_gpus(host) -> None:
    """A live host whose GPUs NVML sees, and a CPU build of torch: the plan would be for the GPUs and the first run
    would die in its first CUDA call ("Torch not compiled with CUDA enabled"). One line with the fix instead."""
    from launcher.inspection.host import torch_cuda_build

    if host.has_gpu and torch_cuda_build() == "":
        raise UserInputError(
            f"this host has {host.gpus.count} NVIDIA GPU(s) ({host.gpus.name}), but the installed torch "
            f"{installed_torch_version()} is a CPU build: install a CUDA build (pip install --force-reinstall torch "
            "--index-url https://download.pytorch.org/whl/cu128, or the index for your driver from "
            "https://pytorch.org/get-started/locally/), or plan for DeepSpeed's CPU accelerator with "
            "CUDA_VISIBLE_DEVICES=''"
        )


def installed_torch_version() -> str | None:
    """The installed torch's version, from its metadata (torch itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def installed_deepspeed_version() -> tuple[int, int, int] | None:
    """The installed DeepSpeed's (major, minor, patch), from its metadata (deepspeed itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return features.parse_version(version("deepspeed"))
    except PackageNotFoundError:
        return None


def alloc_conf(host, settings: Settings) -> str | None:
    """The PYTORCH_ALLOC_CONF the ranks will get (host_buffers.pinned_alloc_conf): decided once, here, for the
    plan's estimates and the launch command alike. The ranks run this machine's torch and environment, also when
    the plan is for a described host (--dry-run of it here); with a hostfile they run on other machines."""
    import os

    from launcher.plan import host_buffers

    return host_buffers.pinned_alloc_conf(
        host.accelerator, os.environ, installed_torch_version(), local_ranks=settings.hostfile is None
    )


def host_rates(host, identity: str | None, nvme_path: str | None, model, resolved: Resolved):
    """Rates for the step-time model: this host's cached probe and the cached passes at the model's shapes and the
    workload's tokens, else described/nominal figures; and the aio settings the probe found best for the drive of
    the NVMe folder (its figures count only for a folder on the drive it measured). A described host (`identity`
    None) reads nothing measured."""
    from launcher.job.measuring import drive_probed, passes_key, rank_device, rank_threads, without_nvme

    probe = cache.load_probe(cache.probe_path(tool_cache_dir()), identity) if identity is not None else None
    passes = None
    if probe is not None:
        key = passes_key(
            model,
            resolved.workload,
            device=rank_device(host),
            threads=rank_threads(host, resolved.ranks_per_node),
            host_id=identity,
        )
        passes = cache.load_passes(tool_cache_dir(), key)
    figures, details, aio = (probe["figures"], probe["details"], probe["aio"] or None) if probe else (None, None, None)
    if probe and nvme_path and not drive_probed(probe, nvme_path):  # another drive's figures say nothing of this one
        figures, aio = without_nvme(figures), None
    elif not nvme_path:
        aio = None
    return resolve_rates(host, figures, details, model.hidden_size, passes), aio


def host_calibration(identity: str | None, model: str, resolved: Resolved) -> dict | None:
    """What finished runs of this model with as many ranks on this very host measured against their predictions
    (plan/calibration.py), by strategy; None for a described host (`identity` None)."""
    if identity is None:
        return None
    from launcher.plan import calibration

    return calibration.load(tool_cache_dir(), identity, model, resolved.world) or None
