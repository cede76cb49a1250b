"""Live host inspection: probe this machine (GPUs through cuda_devices.py, RAM and cores within this process's
limits through limits.py, memlock, /dev/shm, the NVMe folder, DeepSpeed's ops) into a HostProfile (hostprofile.py),
and check the folder swap files will go to before a run.

A described host (`--host-spec`) gives the same HostProfile without touching this machine: hostspec.py.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserInputError
from launcher.files import tool_cache_dir, write_json_atomic
from launcher.inspection import limits
from launcher.inspection.cuda_devices import inspect_visible_gpus
from launcher.inspection.hostprofile import HostProfile, NvmeSpec
from launcher.units import fmt_bytes

__all__ = [
    "aio_usable",
    "available_memory_bytes",
    "can_lock_unlimited",
    "check_nvme_folder",
    "disk_free_bytes",
    "host_id",
    "torch_cuda_build",
    "usable_cores",
    "op_usable",
    "inspect_host",
    "inspect_nvme",
    "memlock_bytes",
    "memory_backed_mount",
    "mount_of",
    "parse_mountinfo",
]

MOUNTINFO = "/proc/self/mountinfo"
# File systems whose files live in RAM (or swap): "NVMe" there is the memory the plan already counts as CPU RAM.
MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "rootfs"})


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


def memlock_bytes() -> int | None:
    """RLIMIT_MEMLOCK's soft limit in bytes: what this process may mlock() (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


CAP_IPC_LOCK = 14  # linux/capability.h: mlock past RLIMIT_MEMLOCK (mm/mlock.c can_do_mlock)


def can_lock_unlimited() -> bool:
    """A process with CAP_IPC_LOCK in its effective set (root outside a container) is not bound by the limit;
    the ranks and the probe inherit this process's capabilities."""
    with contextlib.suppress(OSError, ValueError, IndexError):  # unreadable: assume the limit binds
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    return False


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


OPS_CACHE_FILE = "usable_ops.json"


@functools.cache
def op_usable(builder: str) -> bool:
    """Whether DeepSpeed's op `builder` (AsyncIOBuilder, CPUAdamBuilder, ...) reports itself compatible with
    this machine. Asked in a child process: DeepSpeed's check redirects the stderr file descriptor and prints
    to stdout. A yes is remembered for this environment (sys.prefix), DeepSpeed release and host (the child
    imports DeepSpeed and torch: 3-5 s of every command that checks an op); a no is asked again, so that
    installing libaio or a compiler is seen at once."""
    key = _ops_key()
    cached = _read_ops_cache()
    if cached.get(key, {}).get(builder):
        return True
    code = f"from deepspeed.ops.op_builder import {builder} as B; import sys; sys.exit(not B().is_compatible())"
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if result.returncode != 0:
        return False
    cached.setdefault(key, {})[builder] = True
    with contextlib.suppress(OSError):
        write_json_atomic(tool_cache_dir() / OPS_CACHE_FILE, cached)
    return True


def _ops_key() -> str:
    import importlib.metadata

    try:
        release = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        release = "none"
    return f"{sys.prefix}|deepspeed {release}|{host_id()}"  # the environment (a venv), its DeepSpeed, the machine


def _read_ops_cache() -> dict:
    import json

    try:
        data = json.loads((tool_cache_dir() / OPS_CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


def _unescape(field: bytes) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 for a space)."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field))


def parse_mountinfo(data: bytes) -> list[Mount]:
    """The mounts in /proc/<pid>/mountinfo order (proc(5)): `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS
    [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`. Lines that do not parse are skipped."""
    mounts = []
    for line in data.splitlines():
        fields = line.split(b" ")
        try:
            separator = fields.index(b"-", 6)
            fstype, source = fields[separator + 1], fields[separator + 2]
        except (ValueError, IndexError):
            continue
        mounts.append(Mount(_unescape(fields[4]), _unescape(fstype), _unescape(source)))
    return mounts


def mount_of(path: str | Path, mountinfo: str = MOUNTINFO) -> Mount | None:
    """The mount that holds `path` (resolved): the one whose mount point is its longest prefix; of mounts
    stacked on the same point, the last one (the one on top). None where mountinfo cannot be read."""
    try:
        mounts = parse_mountinfo(Path(mountinfo).read_bytes())
    except OSError:
        return None
    resolved = os.path.realpath(path)
    best = None
    for mount in mounts:
        point = mount.mount_point
        inside = point == "/" or resolved == point or resolved.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best


def memory_backed_mount(path: str | Path, mountinfo: str = MOUNTINFO) -> Mount | None:
    """The mount under `path` when its files live in memory (tmpfs, ramfs, devtmpfs, ..., or a zram drive)."""
    mount = mount_of(path, mountinfo)
    if mount is None:
        return None
    if mount.fstype in MEMORY_FILE_SYSTEMS or mount.source.startswith("/dev/zram"):
        return mount
    return None


def _refuse_memory_backed(path: str, target: Path, what: str) -> None:
    mount = memory_backed_mount(target)
    if mount is None:
        return
    where = f"{mount.fstype} mounted at {mount.mount_point}"
    raise UserInputError(
        f"{what} {path} is on {where}, which lives in RAM: NVMe swap files there take the same memory the plan "
        f"already counts as CPU RAM; pass a folder on a real drive, or offload to CPU instead "
        f"(--offload-optimizer cpu / --offload-param cpu, without {what})"
    )


def inspect_nvme(path: str) -> NvmeSpec:
    """This machine's NVMe folder: it must be a writable folder, and not on a file system in memory."""
    target = check_nvme_folder(path)
    _refuse_memory_backed(path, target, "--nvme-path")
    return NvmeSpec(
        path=str(target),
        free_bytes=disk_free_bytes(target),
        is_nvme=_is_nvme_backed(target),
        aio_usable=aio_usable(),
    )


def inspect_host(nvme_path: str | None = None) -> HostProfile:
    """Read this machine: NVML, psutil, /proc, rlimits, /dev/shm, and the NVMe folder when given."""
    import psutil

    found = inspect_visible_gpus()
    gpus, notes = found.gpus, list(found.notes)
    memory = psutil.virtual_memory()
    total, available, limit = int(memory.total), int(memory.available), limits.memory_limit()
    if limit is not None and limit.limit_bytes < total:
        total, available = limit.limit_bytes, min(available, limit.available_bytes)
        notes.append(
            f"RAM: this process's cgroup allows {fmt_bytes(total)} of the node's {fmt_bytes(memory.total)} "
            f"({limit.file}); the plan counts the limit"
        )
    cores, node_cores = usable_cores(), psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if len(cores) < node_cores:
        notes.append(
            f"CPU: {len(cores)} of the node's {node_cores} cores usable here (affinity mask or CPU quota: "
            f"{limits.core_list(cores)}); the ranks' threads and core binding keep to them"
        )
    try:
        shm = shutil.disk_usage("/dev/shm").total
    except OSError:
        shm = None
    if not gpus.count:
        notes.append("no NVIDIA GPU found: planning for DeepSpeed's CPU accelerator (device memory is CPU RAM)")
    return HostProfile(
        source="live",
        gpus=gpus,
        cpu_memory_bytes=total,
        cpu_memory_available_bytes=available,
        cpu_cores=len(cores),
        pcie_generation=found.pcie_generation,
        pcie_width=found.pcie_width,
        memlock_bytes=memlock_bytes(),
        shm_bytes=shm,
        nvme=inspect_nvme(nvme_path) if nvme_path else None,
        cpu_flags=_cpu_flags(),
        notes=tuple(notes),
        warnings=found.warnings,
    )


def usable_cores() -> list[int]:
    """The physical cores this process may use (limits.usable_cores), at least one."""
    return limits.usable_cores() or [0]


def available_memory_bytes() -> int:
    """RAM available to this process now: the node's, or its cgroup's limit less its working set if lower."""
    import psutil

    available, limit = int(psutil.virtual_memory().available), limits.memory_limit()
    return available if limit is None else min(available, limit.available_bytes)


def host_id() -> str:
    """Hostname, CPU model, core count, RAM and GPU names: a new machine (or a changed one) measures again, and
    finished runs calibrate only plans of the machine they ran on."""
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
    # RAM in whole GiB: a VM's reported total drifts by a few MiB between boots (balloon drivers, firmware
    # reservations), which is no new machine
    memory_gib = round(psutil.virtual_memory().total / 2**30)
    identity = "|".join([platform.node(), platform.processor(), str(os.cpu_count()), f"{memory_gib}GiB", gpus])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def torch_cuda_build() -> str | None:
    """The CUDA release the installed torch was built for ("12.8"), read from torch/version.py without importing
    torch (a dry run stays light); "" for a CPU build (or a ROCm one), None when torch is not installed or the file
    does not say."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    return cuda_release(text)


def cuda_release(version_py: str) -> str | None:
    """torch/version.py's `cuda` ("12.8"; "" for None: a CPU or ROCm build); None when the text has none."""
    found = re.search(r"^cuda\b[^=]*=\s*(None|'([^']*)'|\"([^\"]*)\")", version_py, re.MULTILINE)
    if found is None:
        return None
    return found[2] or found[3] or ""
