"""Host inspection: probe this machine live, or read a described host (`--host-spec`), into one HostProfile.

The planner never knows which of the two it got. Described hosts touch nothing on the local machine.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from launcher import textfiles
from launcher.errors import UserInputError, unknown_key_message
from launcher.units import GB, parse_size

# Nominal PCIe bandwidth per direction for an x16 link, from the seeds ("CPU Offload Math":
# PCIe 3.0 x16 ~16 GB/s, 4.0 ~32 GB/s, 5.0 ~64 GB/s); per lane it is x16 / 16.
PCIE_X16_BYTES_PER_S = {3: 16 * GB, 4: 32 * GB, 5: 64 * GB, 6: 128 * GB}
DEFAULT_PCIE_GENERATION = 4
DEFAULT_CPU_CORES = 16


@dataclass(frozen=True)
class GpuSpec:
    """One node's GPUs (identical, as DeepSpeed's launcher assumes)."""

    count: int
    memory_bytes: int  # per GPU
    name: str = "unknown GPU"
    tflops: float | None = None  # dense bf16/fp16 TFLOP/s per GPU, when known
    compute_capability: tuple[int, int] = (8, 0)

    @property
    def bf16(self) -> bool:
        # bf16 tensor cores arrived with Ampere (compute capability 8.0).
        return self.compute_capability >= (8, 0)


@dataclass(frozen=True)
class NvmeSpec:
    path: str
    free_bytes: int
    is_nvme: bool | None = None  # None when unknown (described hosts)
    aio_usable: bool | None = None  # DeepSpeed's async_io op can be built (libaio present)
    read_bytes_per_s: int | None = None  # sequential, when described
    write_bytes_per_s: int | None = None


@dataclass(frozen=True)
class HostProfile:
    source: str  # "live" or the described host's file
    gpus: GpuSpec
    cpu_memory_bytes: int  # per node
    cpu_memory_available_bytes: int  # per node, now (described hosts: = total)
    cpu_cores: int  # per node
    nodes: int = 1
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_bandwidth_bytes_per_s: int | None = None  # explicit figure wins over generation x width
    memlock_bytes: int | None = None  # None = unlimited
    shm_bytes: int | None = None
    nvme: NvmeSpec | None = None
    cpu_flags: tuple[str, ...] = ()
    cpu_memory_bandwidth_bytes_per_s: int | None = None  # when described (a probe measures it)
    cpu_adam_params_per_s: float | None = None  # DeepSpeedCPUAdam throughput per node, when described
    notes: tuple[str, ...] = field(default=())

    @property
    def has_gpu(self) -> bool:
        return self.gpus.count > 0

    @property
    def accelerator(self) -> str:
        return "cuda" if self.has_gpu else "cpu"

    @property
    def ranks_per_node(self) -> int:
        """Processes DeepSpeed starts per node: one per GPU, or one on the CPU accelerator."""
        return max(self.gpus.count, 1)

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.nodes

    @property
    def pcie_bytes_per_s(self) -> int:
        """Host<->device bandwidth per direction: explicit figure, else nominal for generation and width."""
        if self.pcie_bandwidth_bytes_per_s:
            return self.pcie_bandwidth_bytes_per_s
        generation = self.pcie_generation or DEFAULT_PCIE_GENERATION
        x16 = PCIE_X16_BYTES_PER_S.get(generation, PCIE_X16_BYTES_PER_S[DEFAULT_PCIE_GENERATION])
        return x16 * (self.pcie_width or 16) // 16

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "accelerator": self.accelerator,
            "nodes": self.nodes,
            "gpus": {
                "count": self.gpus.count,
                "memory_bytes": self.gpus.memory_bytes,
                "name": self.gpus.name,
                "tflops": self.gpus.tflops,
                "compute_capability": ".".join(map(str, self.gpus.compute_capability)),
                "bf16": self.gpus.bf16,
            },
            "cpu_memory_bytes": self.cpu_memory_bytes,
            "cpu_memory_available_bytes": self.cpu_memory_available_bytes,
            "cpu_cores": self.cpu_cores,
            "cpu_simd": [f for f in ("avx512f", "avx2") if f in self.cpu_flags],
            "pcie": {
                "generation": self.pcie_generation,
                "width": self.pcie_width,
                "bandwidth_bytes_per_s": self.pcie_bytes_per_s,
            },
            "memlock_bytes": self.memlock_bytes,
            "shm_bytes": self.shm_bytes,
            "nvme": None
            if self.nvme is None
            else {
                "path": self.nvme.path,
                "free_bytes": self.nvme.free_bytes,
                "is_nvme": self.nvme.is_nvme,
                "aio_usable": self.nvme.aio_usable,
                "read_bytes_per_s": self.nvme.read_bytes_per_s,
                "write_bytes_per_s": self.nvme.write_bytes_per_s,
            },
            "cpu_memory_bandwidth_bytes_per_s": self.cpu_memory_bandwidth_bytes_per_s,
            "cpu_adam_params_per_s": self.cpu_adam_params_per_s,
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------- live


def _probe_gpus() -> tuple[GpuSpec, int | None, int | None, list[str]]:
    """GPUs through NVML. No driver / no GPU is a valid answer: count 0."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVIDIA driver: plan for DeepSpeed's CPU accelerator
        return GpuSpec(count=0, memory_bytes=0, name="none"), None, None, []
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return GpuSpec(count=0, memory_bytes=0, name="none"), None, None, []
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        names = {pynvml.nvmlDeviceGetName(h) for h in handles}
        memory = min(pynvml.nvmlDeviceGetMemoryInfo(h).total for h in handles)
        capability = min(pynvml.nvmlDeviceGetCudaComputeCapability(h) for h in handles)
        notes = [f"GPUs differ ({', '.join(map(str, names))}); planning for the smallest"] if len(names) > 1 else []
        try:
            generation = min(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) for h in handles)
            width = min(pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) for h in handles)
        except pynvml.NVMLError:
            generation = width = None
        name = next(iter(names))
        name = name.decode() if isinstance(name, bytes) else str(name)
        return GpuSpec(count, int(memory), name, None, tuple(capability)), generation, width, notes
    finally:
        pynvml.nvmlShutdown()


def _cpu_flags() -> tuple[str, ...]:
    """The SIMD flags CPU-Adam's speed depends on (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return tuple(sorted(set(line.split(":", 1)[1].split()) & {"avx512f", "avx2", "avx", "fma"}))
    return ()


def _memlock_bytes() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _is_nvme_backed(path: Path) -> bool | None:
    """Follow the path's block device through /sys to see whether an NVMe controller backs it."""
    try:
        dev = os.stat(path).st_dev
        sys_path = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    except OSError:
        return None
    if not sys_path.exists():
        return None  # overlay, tmpfs, network file systems: no single block device
    return "nvme" in str(sys_path)


@functools.cache
def op_usable(builder: str) -> bool:
    """Whether DeepSpeed's op `builder` (AsyncIOBuilder, CPUAdamBuilder, ...) reports itself compatible with
    this machine. Asked in a child process: DeepSpeed's check redirects the stderr file descriptor and prints
    to stdout."""
    code = f"from deepspeed.ops.op_builder import {builder} as B; import sys; sys.exit(not B().is_compatible())"
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def aio_usable() -> bool:
    """Whether DeepSpeed's async_io op (libaio) can be built here: what NVMe offload needs."""
    return op_usable("AsyncIOBuilder")


def check_nvme_folder(path: str, what: str = "--nvme-path") -> Path:
    """The folder swap files will go to: it must exist, be a directory, and be writable by this user."""
    target = Path(path).expanduser()
    if not target.exists():
        raise UserInputError(f"{what} {path} does not exist; create it (mkdir -p {path}) or pass another folder")
    if not target.is_dir():
        raise UserInputError(f"{what} {path} is not a directory; pass a folder on a fast local disk")
    if not os.access(target, os.W_OK):
        raise UserInputError(f"{what} {path} is not writable by this user; pick a folder you can write to")
    return target


def disk_free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def check_nvme_room(
    path: str, needed_bytes: int, strategy: str, what: str = "--nvme-path", reusable_bytes: int = 0
) -> None:
    """Before launch: the real folder behind a plan made for a described host must hold the plan's swap
    files (the plan only saw the description's `nvme.free`). Same headroom as the planner's.
    `reusable_bytes`: the run's own swap files a killed run left, which its resume overwrites."""
    from launcher.plan.memory import NVME_USABLE_FRACTION
    from launcher.units import fmt_bytes

    free = disk_free_bytes(check_nvme_folder(path, what)) + reusable_bytes
    if needed_bytes > free * NVME_USABLE_FRACTION:
        raise UserInputError(
            f"{what} {path} has {fmt_bytes(free)} free, but {strategy} needs {fmt_bytes(needed_bytes)} of swap "
            f"files there; free space on that drive, or pass a folder with at least "
            f"{fmt_bytes(needed_bytes / NVME_USABLE_FRACTION)} free"
        )


def probe_nvme(path: str) -> NvmeSpec:
    target = check_nvme_folder(path)
    return NvmeSpec(
        path=str(target),
        free_bytes=disk_free_bytes(target),
        is_nvme=_is_nvme_backed(target),
        aio_usable=aio_usable(),
    )


def probe_host(nvme_path: str | None = None) -> HostProfile:
    """Read this machine: NVML, psutil, /proc, rlimits, /dev/shm, and the NVMe folder when given."""
    import psutil

    gpus, generation, width, notes = _probe_gpus()
    memory = psutil.virtual_memory()
    try:
        shm = shutil.disk_usage("/dev/shm").total
    except OSError:
        shm = None
    if not gpus.count:
        notes.append("no NVIDIA GPU found: planning for DeepSpeed's CPU accelerator (device memory is CPU RAM)")
    return HostProfile(
        source="live",
        gpus=gpus,
        cpu_memory_bytes=int(memory.total),
        cpu_memory_available_bytes=int(memory.available),
        cpu_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        pcie_generation=generation,
        pcie_width=width,
        memlock_bytes=_memlock_bytes(),
        shm_bytes=shm,
        nvme=probe_nvme(nvme_path) if nvme_path else None,
        cpu_flags=_cpu_flags(),
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------------- described

_TOP_KEYS = {
    "name",
    "gpus",
    "nodes",
    "cpu_memory",
    "cpu_cores",
    "pcie",
    "nvme",
    "memlock",
    "shm",
    "cpu_memory_bandwidth",
    "cpu_adam_params_per_s",
}
_GPU_KEYS = {"count", "memory", "name", "tflops", "compute_capability"}
_PCIE_KEYS = {"generation", "width", "bandwidth"}
_NVME_KEYS = {"path", "free", "is_nvme", "read", "write"}


def _check_keys(section: dict, allowed: set[str], where: str, path: str, lines: dict[str, int], prefix: str) -> None:
    for key in section:
        if key not in allowed:
            line = lines.get(prefix + str(key))
            at = f"{path}:{line}" if line else path
            raise UserInputError(unknown_key_message(str(key), allowed, f"{where} ({at})"))


def _number(value: object, what: str, *, integer: bool = True, minimum: float = 0) -> int | float:
    if isinstance(value, str) and not integer:
        with contextlib.suppress(ValueError):  # YAML 1.1 reads 2e9 as a string
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise UserInputError(f"{what}: expected {kind}, got {value!r}")
    if not math.isfinite(value):
        raise UserInputError(f"{what}: must be a finite number, got {value}")
    if value < minimum:
        raise UserInputError(f"{what}: must be at least {minimum}, got {value}")
    return value


def _mapping(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise UserInputError(f"{what}: expected a mapping of keys, got {value!r}")
    return value


_BARE_SIZE_MINIMUM = 2**20  # a unit-less size under 1 MiB ("memory: 24") is a forgotten unit, not bytes
_BARE_NUMBER_RE = re.compile(r"^\s*[0-9]+\s*(/\s*s)?\s*$", re.IGNORECASE)


def _size(value: object, what: str, *, per_second: bool = False) -> int:
    """parse_size, refusing small unit-less numbers: `memory: 24` would plan for 24 bytes of GPU memory."""
    size = parse_size(value, what, per_second=per_second)
    bare = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, str) and _BARE_NUMBER_RE.match(value)
    )
    if bare and 0 < size < _BARE_SIZE_MINIMUM:
        unit = "GB/s" if per_second else "GiB"
        raise UserInputError(
            f"{what}: {value!r} has no unit, so it reads as {size} bytes{'/s' if per_second else ''}; "
            f"write it with a unit, e.g. '{size}{unit}'"
        )
    return size


def load_host_spec(path: str) -> HostProfile:
    """A described host from YAML or JSON. Nothing on this machine is read or checked. Every error names
    the file, the key and (YAML) its line: `host.yaml:3: gpus.memory: ...`."""

    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"--host-spec {path} does not exist; pass a YAML or JSON host description")
    text = textfiles.read_text(file)
    data = textfiles.parse(text, path, as_json=file.suffix == ".json")
    spec = _mapping(data, f"{path}")
    lines = textfiles.key_lines(text) if file.suffix != ".json" else {}

    def at(key: str) -> str:
        line = lines.get(key)
        return f"{path}:{line}: {key}" if line else f"{path}: {key}"

    def rate(section: dict, key: str, dotted: str) -> int | None:
        return _size(section[key], at(dotted), per_second=True) if key in section else None

    _check_keys(spec, _TOP_KEYS, "host description", path, lines, "")
    for required, example in (("gpus", "gpus: {count: 1, memory: 80GiB}"), ("cpu_memory", "cpu_memory: 512GiB")):
        if required not in spec:
            raise UserInputError(
                f"{path}: missing required key '{required}'; add it, e.g. '{example}' (see README, 'Described hosts')"
            )

    gpus_raw = _mapping(spec["gpus"], at("gpus"))
    _check_keys(gpus_raw, _GPU_KEYS, "gpus", path, lines, "gpus.")
    count = int(_number(gpus_raw.get("count", 0), at("gpus.count")))
    if count and "memory" not in gpus_raw:
        raise UserInputError(
            f"{at('gpus')}: missing required key 'gpus.memory'; add the memory per GPU, e.g. 'memory: 80GiB'"
        )
    capability = str(gpus_raw.get("compute_capability", "8.0"))
    try:
        major, minor = (int(x) for x in capability.split("."))
    except ValueError:
        raise UserInputError(f"{at('gpus.compute_capability')}: must look like '8.0', got {capability!r}") from None
    tflops = gpus_raw.get("tflops")
    gpus = GpuSpec(
        count=count,
        memory_bytes=_size(gpus_raw.get("memory", 0), at("gpus.memory")) if count else 0,
        name=str(gpus_raw.get("name", "unknown GPU" if count else "none")),
        tflops=None if tflops is None else float(_number(tflops, at("gpus.tflops"), integer=False)),
        compute_capability=(major, minor),
    )

    pcie = _mapping(spec.get("pcie", {}), at("pcie"))
    _check_keys(pcie, _PCIE_KEYS, "pcie", path, lines, "pcie.")
    generation = pcie.get("generation")
    if generation is not None and (type(generation) is not int or generation not in PCIE_X16_BYTES_PER_S):
        raise UserInputError(f"{at('pcie.generation')}: must be one of 3, 4, 5, 6; got {generation!r}")
    width = pcie.get("width")
    if width is not None and (type(width) is not int or width not in (1, 2, 4, 8, 16)):
        raise UserInputError(f"{at('pcie.width')}: must be one of 1, 2, 4, 8, 16; got {width!r}")

    nvme = None
    if spec.get("nvme") is not None:
        nvme_raw = _mapping(spec["nvme"], at("nvme"))
        _check_keys(nvme_raw, _NVME_KEYS, "nvme", path, lines, "nvme.")
        for required, example in (("path", "path: /local_nvme"), ("free", "free: 2TB")):
            if required not in nvme_raw:
                raise UserInputError(f"{at('nvme')}: missing required key 'nvme.{required}'; add it, e.g. '{example}'")
        nvme = NvmeSpec(
            path=str(nvme_raw["path"]),
            free_bytes=_size(nvme_raw["free"], at("nvme.free")),
            is_nvme=bool(nvme_raw.get("is_nvme", True)),
            aio_usable=True,
            read_bytes_per_s=rate(nvme_raw, "read", "nvme.read"),
            write_bytes_per_s=rate(nvme_raw, "write", "nvme.write"),
        )

    cpu_memory = _size(spec["cpu_memory"], at("cpu_memory"))
    memlock = spec.get("memlock", "unlimited")
    return HostProfile(
        source=str(path),
        gpus=gpus,
        nodes=int(_number(spec.get("nodes", 1), at("nodes"), minimum=1)),
        cpu_memory_bytes=cpu_memory,
        cpu_memory_available_bytes=cpu_memory,
        cpu_cores=int(_number(spec.get("cpu_cores", DEFAULT_CPU_CORES), at("cpu_cores"), minimum=1)),
        pcie_generation=generation,
        pcie_width=width,
        pcie_bandwidth_bytes_per_s=rate(pcie, "bandwidth", "pcie.bandwidth"),
        # memlock stays parse_size: a bare 65536 bytes (64 KiB) is a real, common limit
        memlock_bytes=None if memlock == "unlimited" else parse_size(memlock, at("memlock")),
        shm_bytes=_size(spec["shm"], at("shm")) if "shm" in spec else cpu_memory // 2,
        nvme=nvme,
        cpu_flags=("avx2", "avx512f"),
        cpu_memory_bandwidth_bytes_per_s=rate(spec, "cpu_memory_bandwidth", "cpu_memory_bandwidth"),
        cpu_adam_params_per_s=(
            float(_number(spec["cpu_adam_params_per_s"], at("cpu_adam_params_per_s"), integer=False, minimum=1))
            if "cpu_adam_params_per_s" in spec
            else None
        ),
        notes=(f"described host {spec['name']}",) if "name" in spec else (),
    )


def with_nvme_path(host: HostProfile, nvme_path: str) -> HostProfile:
    """A described host given `--nvme-path`: keep its NVMe capacity, use the user's folder name."""
    from dataclasses import replace

    if host.nvme is None:
        raise UserInputError(
            f"--nvme-path {nvme_path} given, but the host description {host.source} has no 'nvme' section; "
            "add nvme: {path: ..., free: ...} to it"
        )
    return replace(host, nvme=replace(host.nvme, path=nvme_path))
